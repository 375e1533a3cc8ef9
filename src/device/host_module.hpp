// The host's Module (module.hpp): a kernel compiled for Target::host(), loaded.
#pragma once

#include <memory>

#include "device/module.hpp"

namespace fusedopt::runtime {

/// Elements per host work item (chunks come from build_chunks in chunks.hpp): large enough
/// to amortise the per-chunk work, small enough to balance a few large tensors across cores.
inline constexpr std::int64_t kHostChunkElems = 1 << 15;

/// Loads `image` (a host kernel). Throws InternalError when it lacks an entry point or was
/// built for another ABI.
std::unique_ptr<Module> load_host_module(KernelImage image);

}  // namespace fusedopt::runtime
