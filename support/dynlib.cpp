// dlopen wrappers. Host kernels load from a memfd, so no file is left behind.
#include "support/dynlib.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

#include "fusedopt/error.hpp"

namespace fusedopt::support {

std::unique_ptr<DynLib> DynLib::open(const std::string& path, std::string* error) {
  if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
    return std::unique_ptr<DynLib>(new DynLib(h, path));
  }
  const char* e = dlerror();
  if (error) *error = e ? e : "unknown error";
  return nullptr;
}

std::unique_ptr<DynLib> DynLib::open_first(const std::vector<std::string>& candidates,
                                           std::string* error) {
  std::string errors;
  for (const std::string& name : candidates) {
    if (name.empty()) continue;
    std::string e;
    if (std::unique_ptr<DynLib> lib = open(name, &e)) return lib;
    errors += "\n  " + name + ": " + e;
  }
  if (error) *error = errors;
  return nullptr;
}

std::unique_ptr<DynLib> DynLib::from_bytes(const std::string& bytes, const std::string& name) {
  int fd = memfd_create(name.c_str(), MFD_CLOEXEC);
  std::string path;
  char tmpl[] = "/tmp/fusedopt-kernel-XXXXXX.so";
  if (fd >= 0) {
    path = "/proc/self/fd/" + std::to_string(fd);
  } else {
    fd = mkstemps(tmpl, 3);
    if (fd < 0)
      throw IoError(std::string("cannot create a file to load a kernel: ") + std::strerror(errno));
    path = tmpl;
  }
  std::size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int e = errno;
      close(fd);
      if (path == tmpl) unlink(tmpl);
      throw IoError(std::string("cannot write a kernel to load it: ") + std::strerror(e));
    }
    done += static_cast<std::size_t>(n);
  }
  // RTLD_NODELETE: a host kernel pulls in libgomp, whose worker threads outlive any
  // dlclose; unloading the code under them crashes the process at exit.
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  const char* err = h ? nullptr : dlerror();
  std::string message = err ? err : "";
  // The descriptor stays open while the module is loaded (for good, as it is never
  // unloaded): dlopen finds loaded objects by path, so a reused "/proc/self/fd/N" would
  // hand back an earlier kernel instead of loading this one.
  if (!h) close(fd);
  if (path == tmpl) unlink(tmpl);
  if (!h) throw IoError("cannot load kernel '" + name + "': " + message);
  return std::unique_ptr<DynLib>(new DynLib(h, name));
}

DynLib::~DynLib() {
  if (handle_) dlclose(handle_);
}

void* DynLib::symbol(const char* name) const { return dlsym(handle_, name); }

std::shared_ptr<const DynLib> load_host_module(const std::string& key, const std::string& bytes,
                                               const std::string& name) {
  static std::mutex mutex;
  static std::map<std::string, std::shared_ptr<const DynLib>> loaded;
  std::lock_guard<std::mutex> lock(mutex);
  auto it = loaded.find(key);
  if (it != loaded.end()) return it->second;
  std::shared_ptr<const DynLib> lib = DynLib::from_bytes(bytes, name);
  loaded.emplace(key, lib);
  return lib;
}

}  // namespace fusedopt::support
