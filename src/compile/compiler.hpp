// Compilers turn a generated translation unit into a binary for one target: NVRTC -> CUBIN
// for an explicit sm_XX (no GPU needed), the host C++ compiler -> a shared object.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fusedopt/target.hpp"

namespace fusedopt::jit {

class Compiler {
 public:
  virtual ~Compiler() = default;
  /// Identifies the compiler build for the cache key (e.g. "nvrtc 13.0").
  virtual std::string identity() const = 0;
  /// The exact, normalised options used for `target` (part of the cache key).
  virtual std::vector<std::string> options(const Target& target) const = 0;
  /// Extra target facts that change the output (host: the CPU's model and features).
  virtual std::string target_fingerprint(const Target& target) const = 0;
  /// Headers the compile adds to the source (the emulator's cuda_emu.h), as one text for
  /// the cache key; "" when the source is the whole translation unit.
  virtual std::string headers() const { return ""; }
  /// File extension of the binary for `target`: "cubin", "ptx", "so" or "emu".
  virtual std::string extension(const Target& target) const = 0;
  /// Compiles `source` (named `file_name` in diagnostics). Throws CompileError with the log,
  /// the options and the source.
  virtual std::string compile(const std::string& source, const std::string& file_name,
                              const Target& target) const = 0;
};

/// The process-wide compiler for `target` (NVRTC for CUDA targets, the host compiler for
/// the host and, with the emulation header, for the CUDA emulator). Throws
/// fusedopt::Error when NVRTC cannot be loaded.
const Compiler& compiler_for(const Target& target);

/// NVRTC's version (major, minor) and the architectures it compiles for (75, 80, ...).
/// Throws fusedopt::Error when NVRTC cannot be loaded.
std::pair<int, int> nvrtc_version();
std::vector<int> nvrtc_supported_archs();

/// NVRTC's log of compiling `source` for CUDA `target` with `-Xptxas -v`: ptxas's
/// registers, stack, spill stores and spill loads of every entry point. Not cached.
std::string nvrtc_resource_log(const std::string& source, const std::string& file_name,
                               const Target& target);

/// The host compiler (what compiler_for gives for the host).
const Compiler& host_compiler();

/// Runs the host compiler with `options`, then `-o OUT FILE`, on `source` written as
/// `file_name` in a private temporary folder beside `files` (name, text); returns OUT's
/// bytes. Throws CompileError with the log, the options and the source.
std::string run_host_compiler(const std::string& source, const std::string& file_name,
                              const std::vector<std::string>& options,
                              const std::vector<std::pair<std::string, std::string>>& files = {});

/// The host compiler command: FUSEDOPT_HOST_CXX, else the compiler fusedopt was built with.
std::vector<std::string> host_compiler_command();

/// How long one host compile may run before it is stopped (a CompileError).
inline constexpr double kDefaultCompileTimeoutSeconds = 120;
/// FUSEDOPT_COMPILE_TIMEOUT in seconds (0: no limit), else kDefaultCompileTimeoutSeconds.
/// Throws UsageError for a value that is not a number of seconds.
double compile_timeout_seconds();

}  // namespace fusedopt::jit
