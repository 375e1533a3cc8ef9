// Where the compile side meets the device seam: a rule's kernel compiled (or fetched from the
// cache) for what the backend loads, and loaded. The backends know no compiler; the
// provider knows no device. The one runtime file that includes the provider.
#pragma once

#include <memory>

#include "cache/kernel_cache.hpp"
#include "device/backend.hpp"
#include "device/module.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/kernel.hpp"
#include "lang/ast.hpp"

namespace fusedopt::runtime {

/// The kernel of `rule` for `dtypes` (and `strategy`) on `backend`'s device, from `cache` or
/// compiled: for the host a shared object; on fusedopt's CUDA emulator an emulator image; on
/// a GPU a CUBIN for its sm_XX when NVRTC knows it, else PTX (device_target.hpp), and once
/// more as PTX when the driver refuses the CUBIN. Throws CompileError, CudaError,
/// UnavailableError, Error.
std::unique_ptr<Module> load_kernel(Backend& backend, std::shared_ptr<const lang::Rule> rule,
                                    const DTypeBinding& dtypes, ReductionStrategy strategy,
                                    cache::KernelCache& cache);

}  // namespace fusedopt::runtime
