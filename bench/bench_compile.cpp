// Compile and cache benchmarks: cold compile per preset (NVRTC and host), a disk hit in a
// fresh process (a new exec per iteration: includes the once-per-process costs such as
// loading NVRTC or asking the host compiler its version), a disk hit in a warm process, and a
// memory hit (with and without codegen + key hashing).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "cache/disk_store.hpp"
#include "cache/kernel_cache.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/kernel.hpp"
#include "harness.hpp"

using namespace fusedopt;
namespace fs = std::filesystem;

namespace {

fs::path bench_dir() {
  static fs::path dir = [] {
    std::string tmpl = (fs::temp_directory_path() / "fusedopt-bench-XXXXXX").string();
    if (!mkdtemp(tmpl.data())) throw Error("mkdtemp failed");
    return fs::path(tmpl);
  }();
  return dir;
}

Target target_arg(int64_t t) { return t == 0 ? Target::host() : Target::cuda(static_cast<int>(t)); }

void label(benchmark::State& state, const std::string& preset, const Target& t) {
  state.SetLabel(preset + " " + t.str());
}

/// compile_kernel with a disk cache at `dir` (each folder its own cache, memory tier
/// included, for the process's life).
CompiledKernel compile_at(const std::string& preset, const Target& target, const fs::path& dir) {
  CompileOptions options;
  options.cache_dir = dir;
  return compile_kernel(Rule::preset(preset), target, {}, options);
}

/// Every iteration compiles: a new cache folder each time (the disk write of the entry is
/// inside, a small part of a compile).
void BM_ColdCompile(benchmark::State& state, const std::string& preset) {
  const Target target = target_arg(state.range(0));
  std::size_t bytes = 0;
  int n = 0;
  try {
    for (auto _ : state) {
      CompiledKernel k = compile_at(preset, target, bench_dir() / ("cold-" + std::to_string(n++)));
      if (k.origin != "compiled") state.SkipWithError(("not compiled: " + k.origin).c_str());
      bytes = k.binary->size();
    }
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  state.counters["binary_bytes"] = static_cast<double>(bytes);
  label(state, preset, target);
}

/// Fills the disk cache at bench_dir() once for (preset, target).
CompiledKernel warm(const std::string& preset, const Target& target) {
  return compile_at(preset, target, bench_dir());
}

/// Runs in a new process (`fusedopt-bench --probe-disk-hit TARGET DIR`): one compile_kernel
/// of AdamW from the disk cache at DIR, printing "<seconds> <origin>". Everything a real
/// first call pays is inside: loading NVRTC, asking the host compiler its version, codegen,
/// hashing.
int probe_disk_hit(const std::string& target_text, const std::string& dir) {
  try {
    auto start = std::chrono::steady_clock::now();
    const Target target = Target::parse(target_text);
    CompiledKernel k = compile_at("adamw", target, dir);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%.9f %s\n", s, k.origin.c_str());
    return 0;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}

void BM_DiskHitFreshProcess(benchmark::State& state) {
  const Target target = target_arg(state.range(0));
  try {
    warm("adamw", target);
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  // popen runs a shell, so name this program by its real path, not /proc/self/exe.
  const std::string command = fs::read_symlink("/proc/self/exe").string() + " --probe-disk-hit " +
                              target.str() + " " + bench_dir().string();
  for (auto _ : state) {
    FILE* child = popen(command.c_str(), "r");
    char origin[32] = {0};
    double seconds = -1;
    if (!child || std::fscanf(child, "%lf %31s", &seconds, origin) != 2) seconds = -1;
    if (child) pclose(child);
    if (seconds < 0 || std::string(origin) != "disk") {
      state.SkipWithError("the fresh process did not hit the disk cache");
      return;
    }
    state.SetIterationTime(seconds);
  }
  label(state, "adamw", target);
}

/// The cache's record of `k` (its disk entry's header), for lookups without codegen.
cache::KeyRecord record_of(const CompiledKernel& k, const fs::path& dir) {
  cache::KernelCache::Options o;
  o.mode = cache::KernelCache::Mode::On;
  o.dir = dir;
  cache::KernelCache cache(o);
  for (const cache::EntryInfo& e : cache.disk()->list()) {
    if (e.key.hex() == k.key) return e.record;
  }
  throw Error("no disk entry of " + k.key + " in " + dir.string());
}

/// A lookup in the cache's disk tier in a warm process (the memory tier emptied each time).
void BM_DiskHit(benchmark::State& state) {
  const Target target = target_arg(state.range(0));
  cache::KeyRecord record;
  try {
    record = record_of(warm("adamw", target), bench_dir());
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  cache::KernelCache::Options o;
  o.mode = cache::KernelCache::Mode::On;
  o.dir = bench_dir();
  cache::KernelCache cache(o);
  const std::string ext = target.kind == Target::Kind::Host ? "so" : "cubin";
  std::size_t bytes = 0;
  for (auto _ : state) {
    cache.clear_memory();
    auto r = cache.get_or_compile(record, ext, [] { return std::string(); });
    if (r.origin != cache::Origin::Disk) state.SkipWithError("not a disk hit");
    bytes += r.payload->size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  label(state, "adamw", target);
}

/// A memory hit: with codegen (what a new Optimizer pays: compile_kernel generates the
/// source, hashes the record and looks it up) or the lookup alone (the cache's memory tier).
void BM_MemoryHit(benchmark::State& state) {
  const Target target = target_arg(state.range(0));
  const bool with_codegen = state.range(1) != 0;
  cache::KeyRecord record;
  try {
    record = record_of(warm("adamw", target), bench_dir());
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  cache::KernelCache::Options o;
  o.mode = cache::KernelCache::Mode::Memory;
  cache::KernelCache cache(o);
  const std::string ext = target.kind == Target::Kind::Host ? "so" : "cubin";
  cache.get_or_compile(record, ext, [] { return std::string("binary"); });
  for (auto _ : state) {
    if (with_codegen) {
      auto k = compile_at("adamw", target, bench_dir());
      benchmark::DoNotOptimize(k.binary);
    } else {
      auto r = cache.get_or_compile(record, ext, [] { return std::string(); });
      benchmark::DoNotOptimize(r.payload);
    }
  }
  state.SetLabel(std::string("adamw ") + target.str() +
                 (with_codegen ? " codegen+hash+lookup" : " lookup"));
}

int register_all() {
  for (const std::string& preset : Rule::presets()) {
    if (preset.find('+') != std::string::npos) continue;  // the bases alone
    benchmark::RegisterBenchmark(("BM_ColdCompile/" + preset).c_str(), BM_ColdCompile, preset)
        ->Arg(0)
        ->Arg(90)
        ->Unit(benchmark::kMillisecond)
        ->Iterations(3);
  }
  benchmark::RegisterBenchmark("BM_DiskHitFreshProcess", BM_DiskHitFreshProcess)
      ->Arg(0)
      ->Arg(90)
      ->UseManualTime()
      ->Unit(benchmark::kMillisecond)
      ->Iterations(10);
  benchmark::RegisterBenchmark("BM_DiskHit", BM_DiskHit)
      ->Arg(0)
      ->Arg(90)
      ->Unit(benchmark::kMicrosecond);
  benchmark::RegisterBenchmark("BM_MemoryHit", BM_MemoryHit)
      ->Args({0, 0})
      ->Args({90, 0})
      ->Args({0, 1})
      ->Args({90, 1})
      ->Unit(benchmark::kMicrosecond);
  return 0;
}

}  // namespace

namespace fusedopt::bench {

void register_compile_benchmarks() { register_all(); }

int probe_compile_disk_hit(const std::string& target, const std::string& dir) {
  return probe_disk_hit(target, dir);
}

void remove_compile_dir() {
  std::error_code ec;
  fs::remove_all(bench_dir(), ec);
}

}  // namespace fusedopt::bench
