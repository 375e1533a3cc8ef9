// NVRTC, loaded with dlopen: compiles generated CUDA C++ to CUBIN for an explicit sm_XX.
// Needs no GPU and no toolkit headers (generated sources include none).
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "compile/compiler.hpp"
#include "fusedopt/error.hpp"
#include "support/check.hpp"
#include "support/dynlib.hpp"

#if FUSEDOPT_HAVE_CUDA
#include <nvrtc.h>
#endif

namespace fusedopt::jit {

#if FUSEDOPT_HAVE_CUDA
namespace {

struct NvrtcApi {
  std::unique_ptr<support::DynLib> lib;
  int major = 0;
  int minor = 0;
  decltype(&nvrtcVersion) version = nullptr;
  decltype(&nvrtcGetErrorString) error_string = nullptr;
  decltype(&nvrtcCreateProgram) create = nullptr;
  decltype(&nvrtcDestroyProgram) destroy = nullptr;
  decltype(&nvrtcCompileProgram) compile = nullptr;
  decltype(&nvrtcGetProgramLogSize) log_size = nullptr;
  decltype(&nvrtcGetProgramLog) log = nullptr;
  decltype(&nvrtcGetCUBINSize) cubin_size = nullptr;
  decltype(&nvrtcGetCUBIN) cubin = nullptr;
  decltype(&nvrtcGetPTXSize) ptx_size = nullptr;
  decltype(&nvrtcGetPTX) ptx = nullptr;
  decltype(&nvrtcGetNumSupportedArchs) num_archs = nullptr;
  decltype(&nvrtcGetSupportedArchs) archs = nullptr;
};

template <typename F>
void bind(const support::DynLib& lib, const char* name, F* out) {
  *out = reinterpret_cast<F>(lib.symbol(name));
  FUSEDOPT_CHECK_AVAILABLE(*out, "{} has no symbol {}: NVRTC too old", lib.path(), name);
}

const NvrtcApi& nvrtc() {
  static std::once_flag once;
  // Never destroyed: NVRTC stays loaded for the life of the process (unloading it at exit
  // races other static destructors, and hides its allocations from leak checkers).
  static NvrtcApi& api = *new NvrtcApi;
  static std::string failure;
  std::call_once(once, [] {
    std::vector<std::string> candidates;
    if (const char* env = std::getenv("FUSEDOPT_NVRTC_LIBRARY")) candidates.push_back(env);
    for (const char* c : {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so",
                          "/usr/local/cuda/lib64/libnvrtc.so", "/usr/local/cuda/lib/libnvrtc.so"}) {
      candidates.emplace_back(c);
    }
    std::string errors;
    api.lib = support::DynLib::open_first(candidates, &errors);
    if (!api.lib) {
      failure = "NVRTC could not be loaded (set FUSEDOPT_NVRTC_LIBRARY to libnvrtc.so):" + errors;
      return;
    }
    try {
      bind(*api.lib, "nvrtcVersion", &api.version);
      bind(*api.lib, "nvrtcGetErrorString", &api.error_string);
      bind(*api.lib, "nvrtcCreateProgram", &api.create);
      bind(*api.lib, "nvrtcDestroyProgram", &api.destroy);
      bind(*api.lib, "nvrtcCompileProgram", &api.compile);
      bind(*api.lib, "nvrtcGetProgramLogSize", &api.log_size);
      bind(*api.lib, "nvrtcGetProgramLog", &api.log);
      bind(*api.lib, "nvrtcGetCUBINSize", &api.cubin_size);
      bind(*api.lib, "nvrtcGetCUBIN", &api.cubin);
      bind(*api.lib, "nvrtcGetPTXSize", &api.ptx_size);
      bind(*api.lib, "nvrtcGetPTX", &api.ptx);
      bind(*api.lib, "nvrtcGetNumSupportedArchs", &api.num_archs);
      bind(*api.lib, "nvrtcGetSupportedArchs", &api.archs);
      api.version(&api.major, &api.minor);
    } catch (const Error& e) {
      failure = e.what();
      api.lib.reset();
    }
  });
  if (!api.lib) throw UnavailableError(failure);
  return api;
}

void check(const NvrtcApi& api, nvrtcResult r, const char* call) {
  if (r != NVRTC_SUCCESS) throw CudaError(call, static_cast<int>(r), api.error_string(r), "nvrtc");
}

class NvrtcCompiler final : public Compiler {
 public:
  std::string identity() const override {
    // The version alone would let two builds of one release share keys: add the library
    // actually loaded (its file and size) as a build fingerprint.
    const NvrtcApi& api = nvrtc();
    std::string file = "?";
    std::uintmax_t size = 0;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(api.version), &info) && info.dli_fname) {
      std::error_code ec;
      file = std::filesystem::canonical(info.dli_fname, ec).string();
      if (ec) file = info.dli_fname;
      size = std::filesystem::file_size(file, ec);
    }
    return fmt::format("nvrtc {}.{} ({}, {} bytes)", api.major, api.minor, file, size);
  }
  std::vector<std::string> options(const Target& target) const override {
    return {"--gpu-architecture=" + target.str(), "--std=c++17", "-lineinfo"};
  }
  std::string target_fingerprint(const Target& target) const override { return target.str(); }
  std::string extension(const Target& target) const override {
    return target.ptx ? "ptx" : "cubin";
  }

  std::string compile(const std::string& source, const std::string& file_name,
                      const Target& target) const override {
    return run(source, file_name, target, {}, nullptr);
  }

  /// Compiles with `extra` options after the usual ones; the log goes to `log_out`.
  std::string run(const std::string& source, const std::string& file_name, const Target& target,
                  const std::vector<std::string>& extra, std::string* log_out) const {
    const NvrtcApi& api = nvrtc();
    nvrtcProgram prog = nullptr;
    check(api, api.create(&prog, source.c_str(), file_name.c_str(), 0, nullptr, nullptr),
          "nvrtcCreateProgram");
    struct Guard {
      const NvrtcApi& api;
      nvrtcProgram* prog;
      ~Guard() { api.destroy(prog); }
    } guard{api, &prog};
    std::vector<std::string> opts = options(target);
    opts.insert(opts.end(), extra.begin(), extra.end());
    std::vector<const char*> argv;
    for (const std::string& o : opts) argv.push_back(o.c_str());
    nvrtcResult r = api.compile(prog, static_cast<int>(argv.size()), argv.data());
    std::size_t log_size = 0;
    std::string log;
    if (api.log_size(prog, &log_size) == NVRTC_SUCCESS && log_size > 1) {
      log.resize(log_size);
      api.log(prog, log.data());
      log.resize(log_size - 1);
    }
    if (r != NVRTC_SUCCESS) {
      throw CompileError(fmt::format("NVRTC failed to compile {} for {}: {}", file_name,
                                     target.str(), api.error_string(r)),
                         log, opts, source);
    }
    if (log_out != nullptr) *log_out = log;
    std::size_t size = 0;
    if (target.ptx) {  // PTX text for the driver to finish (its NUL included, as it loads)
      check(api, api.ptx_size(prog, &size), "nvrtcGetPTXSize");
      std::string ptx(size, '\0');
      check(api, api.ptx(prog, ptx.data()), "nvrtcGetPTX");
      return ptx;
    }
    check(api, api.cubin_size(prog, &size), "nvrtcGetCUBINSize");
    std::string cubin(size, '\0');
    check(api, api.cubin(prog, cubin.data()), "nvrtcGetCUBIN");
    return cubin;
  }
};

const NvrtcCompiler& the_nvrtc_compiler() {
  static NvrtcCompiler compiler;
  return compiler;
}

}  // namespace

const Compiler& nvrtc_compiler() { return the_nvrtc_compiler(); }

std::pair<int, int> nvrtc_version() {
  const NvrtcApi& api = nvrtc();
  return {api.major, api.minor};
}

std::vector<int> nvrtc_supported_archs() {
  const NvrtcApi& api = nvrtc();
  int n = 0;
  check(api, api.num_archs(&n), "nvrtcGetNumSupportedArchs");
  std::vector<int> out(static_cast<std::size_t>(std::max(n, 0)));
  if (n > 0) check(api, api.archs(out.data()), "nvrtcGetSupportedArchs");
  return out;
}

std::string nvrtc_resource_log(const std::string& source, const std::string& file_name,
                               const Target& target) {
  std::string log;
  the_nvrtc_compiler().run(source, file_name, target, {"--ptxas-options=-v"}, &log);
  return log;
}
#else
const Compiler& nvrtc_compiler() {
  throw UnavailableError("fusedopt was built without CUDA: cannot compile for CUDA targets");
}

std::string nvrtc_resource_log(const std::string&, const std::string&, const Target&) {
  throw UnavailableError("fusedopt was built without CUDA: cannot compile for CUDA targets");
}

std::pair<int, int> nvrtc_version() {
  throw UnavailableError("fusedopt was built without CUDA: no NVRTC");
}

std::vector<int> nvrtc_supported_archs() {
  throw UnavailableError("fusedopt was built without CUDA: no NVRTC");
}
#endif

}  // namespace fusedopt::jit
