// The CUDA emulator's compiler: the CUDA kernel source, unchanged, built by the host compiler
// with the emulation header (templates/kernels/cuda_emu.h) into a shared object, wrapped in
// the image header the emulating driver (libfusedopt-cuda-emu.so) loads. Every memory access
// of the kernel is instrumented (-fsanitize=kernel-address: calls to the header's checks).
#include <fmt/format.h>
#include <sys/utsname.h>

#include <cctype>
#include <cstdint>
#include <cstring>
#include <set>
#include <string>
#include <vector>

#define FO_EMU_DRIVER 1
#include "compile/compiler.hpp"
#include "cuda_emu.h"
#include "embedded.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::jit {
namespace {

constexpr const char* kHeaderName = "fusedopt_cuda_emu.h";
constexpr const char* kGlobalMark = "fo_emu_global_mark_";

bool identifier_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

/// The __global__ functions of a preprocessed translation unit in which __global__ became
/// kGlobalMark: for each mark, the last identifier before the next '('.
std::vector<std::string> global_functions(const std::string& preprocessed) {
  std::vector<std::string> names;
  std::set<std::string> seen;
  const std::string mark = kGlobalMark;
  for (std::size_t at = preprocessed.find(mark); at != std::string::npos;
       at = preprocessed.find(mark, at + mark.size())) {
    const std::size_t paren = preprocessed.find('(', at + mark.size());
    if (paren == std::string::npos) break;
    std::size_t end = paren;
    while (end > at && std::isspace(static_cast<unsigned char>(preprocessed[end - 1]))) --end;
    std::size_t begin = end;
    while (begin > at && identifier_char(preprocessed[begin - 1])) --begin;
    std::string name = preprocessed.substr(begin, end - begin);
    if (!name.empty() && name != "void" && seen.insert(name).second) names.push_back(name);
  }
  return names;
}

class EmuCompiler final : public Compiler {
 public:
  std::string identity() const override {
    return host_compiler().identity() + fmt::format(" | cuda-emu abi {}", FO_EMU_ABI_VERSION);
  }
  std::string headers() const override { return std::string(embedded_file("kernels/cuda_emu.h")); }
  std::vector<std::string> options(const Target&) const override {
    // No -march=native: an image runs on any CPU of the architecture. -O1 keeps compiles
    // short (the emulator is for correctness, never speed). The kernel-address sanitizer
    // in its outline form calls __asan_{load,store}N_noabort before every access the
    // compiler cannot prove safe; cuda_emu.h defines them (no ASan runtime is involved).
    // g++ and clang++ spell its settings differently.
    std::vector<std::string> o = {"-std=c++17",
                                  "-O1",
                                  "-fno-math-errno",
                                  "-fPIC",
                                  "-shared",
                                  "-fvisibility=hidden",
                                  "-w",
                                  "-x",
                                  "c++",
                                  "-fsanitize=kernel-address"};
    const bool clang = host_compiler().identity().find("clang") != std::string::npos;
    for (const char* setting :
         {"asan-instrumentation-with-call-threshold=0", "asan-stack=0", "asan-globals=0"}) {
      o.push_back(clang ? "-mllvm" : "--param");
      o.push_back(clang ? std::string("-") + setting : std::string(setting));
    }
    o.push_back("-include");
    o.push_back(kHeaderName);
    return o;
  }
  std::string target_fingerprint(const Target&) const override {
    struct utsname u {};
    return ::uname(&u) == 0 ? std::string(u.machine) : std::string("unknown machine");
  }
  std::string extension(const Target&) const override { return "emu"; }

  std::string compile(const std::string& source, const std::string& file_name,
                      const Target& target) const override {
    const std::vector<std::pair<std::string, std::string>> files = {{kHeaderName, headers()}};
    // Pass 1: the kernels' names, from the preprocessed source.
    std::vector<std::string> scan = {
        "-std=c++17", "-E",       "-w",
        "-x",         "c++",      fmt::format("-DFO_EMU_GLOBAL_MARK={}", kGlobalMark),
        "-include",   kHeaderName};
    const std::vector<std::string> kernels =
        global_functions(run_host_compiler(source, file_name, scan, files));
    if (kernels.empty()) {
      throw CompileError(file_name + " has no __global__ function for the emulator to run", "",
                         scan, source);
    }
    // Pass 2: the source with an entry point per kernel.
    std::string text = source;
    text += "\n// fusedopt cuda emulator: the kernels' entry points\n";
    for (const std::string& k : kernels) text += "FO_EMU_KERNEL(" + k + ")\n";
    const std::string object = run_host_compiler(text, file_name, options(target), files);
    // The image: magic, ABI version, object size, then the shared object.
    std::string image(FO_EMU_IMAGE_MAGIC, 8);
    const std::uint32_t abi = FO_EMU_ABI_VERSION, reserved = 0;
    const std::uint64_t size = object.size();
    image.append(reinterpret_cast<const char*>(&abi), 4);
    image.append(reinterpret_cast<const char*>(&reserved), 4);
    image.append(reinterpret_cast<const char*>(&size), 8);
    image += object;
    return image;
  }
};

}  // namespace

const Compiler& emu_compiler() {
  static EmuCompiler emu;
  return emu;
}

}  // namespace fusedopt::jit
