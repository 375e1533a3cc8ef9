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

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "fusedopt/error.hpp"
#include "presets.hpp"
#include "provider/kernel_provider.hpp"

using namespace fusedopt;
namespace fs = std::filesystem;

namespace {

cache::KernelCache::Options options(cache::KernelCache::Mode mode, const fs::path& dir) {
  cache::KernelCache::Options o;
  o.mode = mode;
  o.dir = dir;
  return o;
}

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

void BM_ColdCompile(benchmark::State& state, const std::string& preset) {
  const Target target = target_arg(state.range(0));
  cache::KernelCache cache(options(cache::KernelCache::Mode::Off, {}));
  auto body = codegen::generate_body(*preset_rule(preset), DTypeBinding{});
  std::size_t bytes = 0;
  try {
    for (auto _ : state)
      bytes = provider::provide_body(body, DTypeBinding{}, target, cache).binary->size();
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  state.counters["binary_bytes"] = static_cast<double>(bytes);
  label(state, preset, target);
}

/// Fills the disk cache once for (preset, target) and returns the body.
codegen::KernelBody warm(const std::string& preset, const Target& target) {
  auto body = codegen::generate_body(*preset_rule(preset), DTypeBinding{});
  cache::KernelCache cache(options(cache::KernelCache::Mode::On, bench_dir()));
  provider::provide_body(body, DTypeBinding{}, target, cache);
  return body;
}

/// Runs in a new process (`fusedopt-bench --probe-disk-hit TARGET`): one build_kernel of
/// AdamW from the disk cache, printing "<seconds> <origin>". Everything a real first call
/// pays is inside: loading NVRTC, asking the host compiler its version, codegen, hashing.
int probe_disk_hit(const std::string& target_text, const std::string& dir) {
  try {
    auto start = std::chrono::steady_clock::now();
    const Target target = Target::parse(target_text);
    cache::KernelCache cache(options(cache::KernelCache::Mode::On, dir));
    auto body = codegen::generate_body(*preset_rule("adamw"), DTypeBinding{});
    provider::ProvidedKernel k = provider::provide_body(body, DTypeBinding{}, target, cache);
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("%.9f %s\n", s, cache::to_string(k.origin));
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

void BM_DiskHit(benchmark::State& state) {
  const Target target = target_arg(state.range(0));
  codegen::KernelBody body;
  try {
    body = warm("adamw", target);
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::size_t bytes = 0;
  for (auto _ : state) {
    cache::KernelCache cache(
        options(cache::KernelCache::Mode::On, bench_dir()));  // empty memory tier
    provider::ProvidedKernel k = provider::provide_body(body, DTypeBinding{}, target, cache);
    if (k.origin != cache::Origin::Disk) state.SkipWithError("not a disk hit");
    bytes += k.binary->size();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  label(state, "adamw", target);
}

void BM_MemoryHit(benchmark::State& state) {
  const Target target = target_arg(state.range(0));
  const bool with_codegen = state.range(1) != 0;
  auto body = codegen::generate_body(*preset_rule("adamw"), DTypeBinding{});
  cache::KernelCache cache(options(cache::KernelCache::Mode::Memory, {}));
  try {
    provider::provide_body(body, DTypeBinding{}, target, cache);
  } catch (const Error& e) {
    state.SkipWithError(e.what());
    return;
  }
  std::string source = codegen::generate_source(body, target);
  cache::KeyRecord record = provider::kernel_record(body, DTypeBinding{}, target, source);
  const std::string ext = target.kind == Target::Kind::Host ? "so" : "cubin";
  for (auto _ : state) {
    if (with_codegen) {
      // What a new Optimizer pays: generate the source, hash the record, look it up.
      auto k = provider::provide_body(body, DTypeBinding{}, target, cache);
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
  for (const std::string& preset : preset_names()) {
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

int main(int argc, char** argv) {
  if (argc == 4 && std::string(argv[1]) == "--probe-disk-hit")
    return probe_disk_hit(argv[2], argv[3]);
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 2;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::error_code ec;
  fs::remove_all(bench_dir(), ec);
  return 0;
}
