// From a generated body to a binary: generates the source for the target, computes the
// cache key over everything that goes into the binary, and compiles only on a miss.
#pragma once

#include <memory>
#include <string>

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/target.hpp"

namespace fusedopt::jit {

struct BuiltKernel {
  std::shared_ptr<const std::string> binary;
  cache::Origin origin = cache::Origin::Compiled;
  cache::Key key;
  std::string ext;     ///< "cubin" or "so"
  double seconds = 0;  ///< wall time of the whole call: source, key, fetch or compile
  std::string source;  ///< the generated translation unit
};

/// The canonical key record: format and fusedopt versions, kind, name, dtypes, target,
/// target fingerprint, compiler identity, options, and the whole source (which contains
/// every template and the prelude: generated sources include no headers).
cache::KeyRecord kernel_record(const codegen::KernelBody& body, const DTypeBinding& dtypes,
                               const Target& target, const std::string& source);

/// Gets the binary from `cache` or compiles it. With FUSEDOPT_DUMP_SOURCE=<dir>, writes the
/// generated source to <dir>/<name>-<target>-<key>.<cu|cpp> first.
BuiltKernel build_kernel(const codegen::KernelBody& body, const DTypeBinding& dtypes,
                         const Target& target, cache::KernelCache& cache);

/// fusedopt's version string (part of every key).
const char* version();

}  // namespace fusedopt::jit
