// dlopen'ed shared libraries: NVRTC, the CUDA driver and NCCL (so fusedopt builds and runs
// on machines without them) and compiled host kernels. Stateless apart from the process-wide
// table of load_host_module(), so a copy linked into each of libfusedopt and
// libfusedopt_comm (hidden in both) behaves as one.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace fusedopt::support {

class DynLib {
 public:
  /// Opens `path` (RTLD_NOW | RTLD_LOCAL); nullptr if it does not load, with dlerror()'s
  /// message in `*error`.
  static std::unique_ptr<DynLib> open(const std::string& path, std::string* error);
  /// Opens the first of `candidates` that loads; nullptr if none does, with the dlerror()
  /// messages joined into `*error`.
  static std::unique_ptr<DynLib> open_first(const std::vector<std::string>& candidates,
                                            std::string* error);
  /// Loads a shared object from bytes (an in-memory file where the kernel allows it). It
  /// stays mapped for the life of the process (RTLD_NODELETE), so load each binary once:
  /// see load_host_module(). Throws fusedopt::Error on failure.
  static std::unique_ptr<DynLib> from_bytes(const std::string& bytes, const std::string& name);
  ~DynLib();
  DynLib(const DynLib&) = delete;
  DynLib& operator=(const DynLib&) = delete;

  /// The symbol's address, or nullptr.
  void* symbol(const char* name) const;
  const std::string& path() const { return path_; }

 private:
  DynLib(void* handle, std::string path) : handle_(handle), path_(std::move(path)) {}
  void* handle_;
  std::string path_;
};

/// The loaded module for a host kernel binary, shared by everyone who asks for the same
/// cache key: a binary is mapped once per process.
std::shared_ptr<const DynLib> load_host_module(const std::string& key, const std::string& bytes,
                                               const std::string& name);

}  // namespace fusedopt::support
