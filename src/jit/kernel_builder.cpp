// Key record, source dumps and the get-or-compile call for one kernel.
#include "jit/kernel_builder.hpp"

#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <thread>

#include "fusedopt/error.hpp"
#include "fusedopt/version.hpp"
#include "jit/compiler.hpp"

namespace fusedopt::jit {

namespace fs = std::filesystem;

const char* version() { return FUSEDOPT_VERSION_STRING; }

cache::KeyRecord kernel_record(const codegen::KernelBody& body, const DTypeBinding& dtypes,
                               const Target& target, const std::string& source) {
  const Compiler& compiler = compiler_for(target);
  std::string options;
  for (const std::string& o : compiler.options(target)) options += o + "\n";
  cache::KeyRecord r;
  r.add("format_version", std::to_string(cache::kFormatVersion))
      .add("fusedopt_version", version())
      .add("kind", body.kind)
      .add("name", body.name)
      .add("dtypes", dtypes.str())
      .add("target", target.str())
      .add("target_fingerprint", compiler.target_fingerprint(target))
      .add("compiler", compiler.identity())
      .add("options", options)
      // Generated sources include no headers: the prelude and skeletons are pasted into the
      // source itself, so hashing the source covers every "header".
      .add("headers", "")
      .add("source", source);
  return r;
}

namespace {

void dump_source(const std::string& dir, const std::string& name, const std::string& source) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const fs::path final_path = fs::path(dir) / name;
  // Unique per process and thread: two threads may dump the same kernel at once.
  static std::atomic<unsigned> counter{0};
  const fs::path tmp =
      fs::path(dir) / fmt::format(".{}.{}.{}.{}.tmp", name, getpid(),
                                  std::hash<std::thread::id>()(std::this_thread::get_id()),
                                  counter++);
  {
    std::ofstream out(tmp, std::ios::binary);
    out << source;
    if (!out) throw Error("FUSEDOPT_DUMP_SOURCE: cannot write " + tmp.string());
  }
  fs::rename(tmp, final_path, ec);
  if (ec)
    throw Error("FUSEDOPT_DUMP_SOURCE: cannot write " + final_path.string() + ": " + ec.message());
}

}  // namespace

BuiltKernel build_kernel(const codegen::KernelBody& body, const DTypeBinding& dtypes,
                         const Target& target, cache::KernelCache& cache) {
  auto start = std::chrono::steady_clock::now();  // the whole lookup: codegen, key, fetch
  BuiltKernel k;
  k.source = codegen::generate_source(body, target);
  const Compiler& compiler = compiler_for(target);
  cache::KeyRecord record = kernel_record(body, dtypes, target, k.source);
  k.key = record.key();
  k.ext = compiler.extension();
  const std::string file = codegen::source_file_name(body, target);
  if (const char* dir = std::getenv("FUSEDOPT_DUMP_SOURCE"); dir && *dir) {
    std::string stem = file.substr(0, file.rfind('.'));
    std::string ext = file.substr(file.rfind('.'));
    dump_source(dir, fmt::format("{}-{}-{}{}", stem, target.str(), k.key.hex().substr(0, 16), ext),
                k.source);
  }
  cache::KernelCache::Result r =
      cache.get_or_compile(record, k.ext, [&] { return compiler.compile(k.source, file, target); });
  k.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  k.binary = r.payload;
  k.origin = r.origin;
  return k;
}

}  // namespace fusedopt::jit
