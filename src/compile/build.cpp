// Key record, source dumps and the get-or-compile call for one translation unit.
#include "compile/build.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>

#include "cache/image_check.hpp"
#include "compile/compiler.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/version.hpp"
#include "support/atomic_write.hpp"

namespace fusedopt::jit {

namespace fs = std::filesystem;

const char* version() { return FUSEDOPT_VERSION_STRING; }

cache::KeyRecord kernel_record(const KernelSource& source, const Target& target) {
  const Compiler& compiler = compiler_for(target);
  std::string options;
  for (const std::string& o : compiler.options(target)) options += o + "\n";
  cache::KeyRecord r;
  r.add("format_version", std::to_string(cache::kFormatVersion))
      .add("fusedopt_version", version())
      .add("kind", source.kind)
      .add("name", source.name)
      .add("dtypes", source.dtypes)
      .add("target", target.str())
      .add("target_fingerprint", compiler.target_fingerprint(target))
      .add("compiler", compiler.identity())
      .add("options", options)
      // Generated sources include no headers: the prelude and skeletons are pasted into the
      // source itself, so hashing the source covers them; the emulator's compile adds one.
      .add("headers", compiler.headers())
      .add("source", source.text);
  return r;
}

namespace {

void dump_source(const std::string& dir, const std::string& name, const std::string& source) {
  std::error_code ec;
  fs::create_directories(dir, ec);  // a failure shows up as the write's error below
  const fs::path final_path = fs::path(dir) / name;
  // Atomic, so that a reader (or a second thread dumping the same kernel) never sees half a
  // file.
  support::AtomicWriteResult written = support::atomic_write(final_path, source);
  if (!written.ok()) throw IoError("FUSEDOPT_DUMP_SOURCE: " + written.message(final_path));
}

}  // namespace

BuiltKernel build(const KernelSource& source, const Target& target, cache::KernelCache& cache) {
  auto start = std::chrono::steady_clock::now();  // the whole lookup: key, fetch or compile
  BuiltKernel k;
  const Compiler& compiler = compiler_for(target);
  cache::KeyRecord record = kernel_record(source, target);
  k.key = record.key();
  k.ext = compiler.extension(target);
  const std::string& file = source.file_name;
  if (const char* dir = std::getenv("FUSEDOPT_DUMP_SOURCE"); dir && *dir) {
    const std::size_t dot = file.rfind('.');
    const std::string stem = file.substr(0, dot);
    const std::string ext = dot == std::string::npos ? std::string() : file.substr(dot);
    dump_source(dir, fmt::format("{}-{}-{}{}", stem, target.str(), k.key.hex().substr(0, 16), ext),
                source.text);
  }
  // A compiler that exits 0 must still have written a binary the device can load: what is
  // not one is an error here, and never reaches the cache (whose loads drop such entries
  // that an older fusedopt stored).
  auto compile = [&] {
    std::string binary = compiler.compile(source.text, file, target);
    if (std::string why = cache::image_problem(k.ext, binary); !why.empty()) {
      throw CompileError(fmt::format("the compiler ({}) reported success for {}, but its output "
                                     "is {}; nothing was cached",
                                     compiler.identity(), file, why),
                         "", compiler.options(target), source.text);
    }
    return binary;
  };
  cache::KernelCache::Result r = cache.get_or_compile(record, k.ext, compile, cache::image_problem);
  k.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  k.binary = r.payload;
  k.origin = r.origin;
  return k;
}

}  // namespace fusedopt::jit
