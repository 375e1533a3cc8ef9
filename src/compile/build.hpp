// From a translation unit to a binary through the kernel cache: computes the cache key over
// everything that goes into the binary, and compiles only on a miss. jit knows sources,
// compilers and the cache; it knows nothing of rules or code generation.
#pragma once

#include <memory>
#include <string>

#include "cache/kernel_cache.hpp"
#include "fusedopt/target.hpp"

namespace fusedopt::jit {

/// A generated translation unit and what identifies it besides its text.
struct KernelSource {
  std::string kind;       ///< "rule" or "trusted-functor"
  std::string name;       ///< rule or functor name
  std::string dtypes;     ///< the dtype binding, as DTypeBinding::str()
  std::string file_name;  ///< the name #line directives and diagnostics use
  std::string text;       ///< the whole translation unit
};

struct BuiltKernel {
  std::shared_ptr<const std::string> binary;
  cache::Origin origin = cache::Origin::Compiled;
  cache::Key key;
  std::string ext;     ///< "cubin" or "so"
  double seconds = 0;  ///< wall time of the key and the fetch or compile
};

/// The canonical key record: format and fusedopt versions, kind, name, dtypes, target,
/// target fingerprint, compiler identity, options, and the whole source (which contains
/// every template and the prelude: generated sources include no headers).
cache::KeyRecord kernel_record(const KernelSource& source, const Target& target);

/// Gets the binary from `cache` or compiles it. With FUSEDOPT_DUMP_SOURCE=<dir>, writes the
/// source to <dir>/<stem>-<target>-<key>.<ext> first.
BuiltKernel build(const KernelSource& source, const Target& target, cache::KernelCache& cache);

/// fusedopt's version string (part of every key).
const char* version();

}  // namespace fusedopt::jit
