// The kernel provider: codegen, then jit through the cache.
#include "compile/kernel_provider.hpp"

#include <map>
#include <mutex>
#include <string>

#include "fusedopt/error.hpp"
#include "support/log.hpp"

namespace fusedopt::provider {

namespace {

jit::KernelSource source_of(const codegen::KernelBody& body, const DTypeBinding& dtypes,
                            const Target& target, std::string text) {
  jit::KernelSource s;
  s.kind = body.kind;
  s.name = body.name;
  s.dtypes = dtypes.str();
  s.file_name = codegen::source_file_name(body, target);
  s.text = std::move(text);
  return s;
}

/// Says once per process that a cache folder could not be written to: kernels then live in
/// memory only. The cache is an optimisation, so nothing fails.
void warn_once_if_unwritable(const cache::KernelCache& cache) {
  const std::string error = cache.last_disk_error();
  if (error.empty()) return;
  static std::once_flag once;
  std::call_once(once, [&] {
    support::log(support::LogLevel::Warn,
                 "the kernel cache folder cannot be written, so kernels are kept in memory only "
                 "(compiled again by every process): " +
                     error);
  });
}

}  // namespace

cache::KeyRecord kernel_record(const codegen::KernelBody& body, const DTypeBinding& dtypes,
                               const Target& target, const std::string& source) {
  return jit::kernel_record(source_of(body, dtypes, target, source), target);
}

ProvidedKernel provide_body(codegen::KernelBody body, const DTypeBinding& dtypes,
                            const Target& target, cache::KernelCache& cache) {
  ProvidedKernel out;
  jit::KernelSource source =
      source_of(body, dtypes, target, codegen::generate_source(body, target));
  static_cast<jit::BuiltKernel&>(out) = jit::build(source, target, cache);
  warn_once_if_unwritable(cache);
  out.source = std::move(source.text);
  body.code.clear();
  out.body = std::move(body);
  return out;
}

ProvidedKernel provide(const KernelRequest& request, cache::KernelCache& cache) {
  if (request.functor) {
    return provide_body(codegen::generate_functor_body(*request.functor, request.dtypes),
                        request.dtypes, request.target, cache);
  }
  if (!request.rule) throw InternalError("provider: a request names no rule and no functor");
  return provide_body(codegen::generate_body(*request.rule, request.dtypes, request.strategy),
                      request.dtypes, request.target, cache);
}

namespace {

/// The process-wide cache, or, when its disk folder cannot be used (cannot be created or
/// written, or refused as unsafe), a memory-only cache with one warning: the cache is an
/// optimisation, so training goes on. An invalid FUSEDOPT_CACHE* value still throws.
cache::KernelCache& default_cache() {
  (void)cache::KernelCache::options_from_env();  // bad environment: CacheError, every call
  try {
    return cache::KernelCache::global();
  } catch (const CacheError& e) {
    static std::mutex mutex;
    static std::unique_ptr<cache::KernelCache> fallback;
    std::lock_guard<std::mutex> lock(mutex);
    if (!fallback) {
      cache::KernelCache::Options options = cache::KernelCache::options_from_env();
      options.mode = cache::KernelCache::Mode::Memory;
      fallback = std::make_unique<cache::KernelCache>(options);
      support::log(support::LogLevel::Warn,
                   std::string("the kernel cache folder cannot be used, so kernels are kept in "
                               "memory only (compiled again by every process): ") +
                       e.what());
    }
    return *fallback;
  }
}

}  // namespace

cache::KernelCache& cache_at(const std::filesystem::path& dir) {
  if (dir.empty()) return default_cache();
  static std::mutex mutex;
  static std::map<std::filesystem::path, std::unique_ptr<cache::KernelCache>> caches;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<cache::KernelCache>& slot = caches[dir.lexically_normal()];
  if (!slot) {
    cache::KernelCache::Options options = cache::KernelCache::options_from_env();
    options.dir = dir;
    options.mode = cache::KernelCache::Mode::On;
    slot = std::make_unique<cache::KernelCache>(options);
  }
  return *slot;
}

}  // namespace fusedopt::provider
