// The host C++ compiler -> a shared object. The generated source includes no headers, so
// a compile takes a fraction of a second.
#include <fmt/format.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>

#include "compile/compiler.hpp"
#include "compile/process.hpp"
#include "fusedopt/error.hpp"
#include "support/build_dirs.hpp"
#include "support/check.hpp"

#ifndef FUSEDOPT_DEFAULT_HOST_CXX
#define FUSEDOPT_DEFAULT_HOST_CXX "c++"
#endif

namespace fusedopt::jit {

const Compiler& nvrtc_compiler();
const Compiler& emu_compiler();

namespace fs = std::filesystem;

std::vector<std::string> host_compiler_command() {
  // Read once per process: the compiler identity in every cache key must name the
  // compiler that actually builds, even if the environment changes later.
  static const std::vector<std::string> cmd = [] {
    std::vector<std::string> words_out;
    const char* env = std::getenv("FUSEDOPT_HOST_CXX");
    std::istringstream words(env && *env ? env : FUSEDOPT_DEFAULT_HOST_CXX);
    for (std::string w; words >> w;) words_out.push_back(w);
    // Blank is not "unset": without this, the first compiler option would run as the
    // compiler. A throw leaves the static uninitialised, so every compile reports it.
    FUSEDOPT_CHECK_USAGE(!words_out.empty(),
                         "FUSEDOPT_HOST_CXX='{}' is blank: set it to a compiler command, or "
                         "unset it for the default ({})",
                         env ? env : "", FUSEDOPT_DEFAULT_HOST_CXX);
    return words_out;
  }();
  return cmd;
}

double compile_timeout_seconds() {
  const char* env = std::getenv("FUSEDOPT_COMPILE_TIMEOUT");
  if (!env || !*env) return kDefaultCompileTimeoutSeconds;
  // Digits, a point and an exponent only: strtod alone would take " 5", "0x10" and "inf".
  const bool plain = std::strspn(env, "0123456789.eE+-") == std::strlen(env) &&
                     (std::isdigit(static_cast<unsigned char>(env[0])) || env[0] == '.');
  char* end = nullptr;
  const double seconds = plain ? std::strtod(env, &end) : -1;
  FUSEDOPT_CHECK_USAGE(plain && *end == '\0' && seconds >= 0 && std::isfinite(seconds),
                       "FUSEDOPT_COMPILE_TIMEOUT={} is not a number of seconds (0: no limit)", env);
  return seconds;
}

namespace {

/// A private build folder (support/build_dirs.hpp), removed on destruction.
class TempDir {
 public:
  TempDir() : path_(support::make_build_dir().string()) {}
  ~TempDir() { support::remove_build_dir(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

/// The file `command` runs: found on PATH when it names no folder, then every symbolic
/// link resolved. `command` itself when there is no such file.
std::string resolve_executable(const std::string& command) {
  std::error_code ec;
  if (command.find('/') != std::string::npos) {
    const fs::path real = fs::canonical(command, ec);
    return ec ? command : real.string();
  }
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "");
  for (std::string dir; std::getline(dirs, dir, ':');) {
    const fs::path candidate = fs::path(dir.empty() ? "." : dir) / command;
    if (::access(candidate.c_str(), X_OK) == 0 && fs::is_regular_file(candidate, ec)) {
      const fs::path real = fs::canonical(candidate, ec);
      return ec ? candidate.string() : real.string();
    }
  }
  return command;
}

}  // namespace

std::string run_host_compiler(const std::string& source, const std::string& file_name,
                              const std::vector<std::string>& options,
                              const std::vector<std::pair<std::string, std::string>>& files) {
  TempDir tmp;
  const std::string src = tmp.path() + "/" + fs::path(file_name).filename().string();
  const std::string out = tmp.path() + "/kernel.out";
  for (const auto& [name, text] : files) {
    std::ofstream f(tmp.path() + "/" + name, std::ios::binary);
    f << text;
    if (!f) throw IoError("cannot write " + tmp.path() + "/" + name);
  }
  {
    std::ofstream f(src, std::ios::binary);
    f << source;
    if (!f) throw IoError("cannot write " + src);
  }
  std::vector<std::string> argv = host_compiler_command();
  argv.insert(argv.end(), options.begin(), options.end());
  argv.insert(argv.end(), {"-o", out, src});
  const double limit = compile_timeout_seconds();
  ProcessResult r = run_process(argv, tmp.path(), limit);
  if (r.timed_out) {
    throw CompileError(fmt::format("the host compiler did not finish {} within {} s "
                                   "(FUSEDOPT_COMPILE_TIMEOUT); it was stopped",
                                   file_name, limit),
                       r.output, options, source);
  }
  if (r.exit_code != 0) {
    throw CompileError(
        fmt::format("the host compiler failed to compile {} (exit {})", file_name, r.exit_code),
        r.output, options, source);
  }
  std::string binary = read_file(out);
  if (binary.empty())
    throw CompileError("the host compiler produced no output", r.output, options, source);
  return binary;
}

namespace {

class HostCompiler final : public Compiler {
 public:
  std::string identity() const override {
    std::call_once(identity_once_, [this] {
      std::vector<std::string> cmd = host_compiler_command();
      cmd.push_back("--version");
      // Under the compile's limit: every host cache key needs this line, so a wrapper that
      // stalls here (a licence server, a lock) would hang warmup and training forever. A
      // throw leaves the once_flag unset: the next kernel probes again.
      const double limit = compile_timeout_seconds();
      ProcessResult r;
      try {
        TempDir tmp;
        r = run_process(cmd, tmp.path(), limit);
      } catch (const std::exception& e) {
        r.output = e.what();
      }
      if (r.timed_out) {
        throw CompileError(fmt::format("the host compiler did not answer '{} --version' within {} "
                                       "s (FUSEDOPT_COMPILE_TIMEOUT); it was stopped",
                                       cmd.front(), limit),
                           r.output, cmd, "");
      }
      const std::string first = r.output.substr(0, r.output.find('\n'));
      identity_ = r.exit_code == 0 ? first : "unknown (" + first + ")";
      // The executable as a file, not as it was spelled: "c++" and
      // "/usr/bin/x86_64-linux-gnu-g++" (what a Python build's sysconfig picks) are one
      // compiler, and its version line starts with the spelled name, which is dropped.
      const std::vector<std::string>& words = host_compiler_command();
      if (!words.empty()) {
        const std::string spelled = fs::path(words.front()).filename().string();
        if (identity_.rfind(spelled + " ", 0) == 0) identity_.erase(0, spelled.size() + 1);
        identity_ += " | " + resolve_executable(words.front());
      }
      for (std::size_t w = 1; w < words.size(); ++w) identity_ += " | " + words[w];
    });
    return identity_;
  }
  std::vector<std::string> options(const Target&) const override {
    // -fno-math-errno lets sqrt compile to one instruction; -fno-trapping-math lets g++
    // evaluate both arms of a `where` (a division in one of them may not trap: nothing
    // unmasks FP exceptions), so element loops with selects vectorise. Neither changes a
    // result; no -ffast-math: results must follow IEEE rounding so tests can compare
    // against a reference. -ffp-contract=off: each operation of the rule is rounded as
    // written, a fused multiply-add only where the rule says fma() or lerp() (g++'s default
    // for C++ contracts a * b + c across statements, clang's within one: either would make
    // the result depend on the compiler, and the presets' option exact bit-identical to
    // torch 1.13 impossible).
    return {"-std=c++17",          "-O3",      "-march=native",
            "-ffp-contract=off",   "-fopenmp", "-fno-math-errno",
            "-fno-trapping-math",  "-fPIC",    "-shared",
            "-fvisibility=hidden", "-w"};
  }
  std::string target_fingerprint(const Target&) const override {
    // -march=native makes the binary depend on this CPU's model and features.
    std::call_once(cpu_once_, [this] {
      std::ifstream in("/proc/cpuinfo");
      std::string line, model, flags;
      while (std::getline(in, line)) {
        if (model.empty() && line.rfind("model name", 0) == 0) model = line;
        if (flags.empty() && (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0))
          flags = line;
        if (!model.empty() && !flags.empty()) break;
      }
      cpu_ = model + "\n" + flags;
    });
    return cpu_;
  }
  std::string extension(const Target&) const override { return "so"; }

  std::string compile(const std::string& source, const std::string& file_name,
                      const Target& target) const override {
    return run_host_compiler(source, file_name, options(target));
  }

 private:
  mutable std::once_flag identity_once_;
  mutable std::string identity_;
  mutable std::once_flag cpu_once_;
  mutable std::string cpu_;
};

}  // namespace

const Compiler& host_compiler() {
  static HostCompiler host;
  return host;
}

const Compiler& compiler_for(const Target& target) {
  if (target.kind == Target::Kind::Cuda) return nvrtc_compiler();
  if (target.kind == Target::Kind::Emu) return emu_compiler();
  return host_compiler();
}

}  // namespace fusedopt::jit
