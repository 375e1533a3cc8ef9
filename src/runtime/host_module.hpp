// The host's Module (module.hpp): a kernel the provider built for Target::host(), loaded.
#pragma once

#include <memory>

#include "lang/ast.hpp"
#include "provider/kernel_provider.hpp"
#include "runtime/module.hpp"

namespace fusedopt::runtime {

/// Elements per host work item (chunks come from build_chunks in chunks.hpp): large enough
/// to amortise the per-chunk work, small enough to balance a few large tensors across cores.
inline constexpr std::int64_t kHostChunkElems = 1 << 15;

/// Loads `built` (a host kernel of `rule`). Throws InternalError when it lacks an entry
/// point or was built for another ABI.
std::unique_ptr<Module> load_host_module(const lang::Rule& rule, provider::ProvidedKernel built);

}  // namespace fusedopt::runtime
