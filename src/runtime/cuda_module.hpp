// The CUDA Module (module.hpp): a kernel image loaded into one device's primary context.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

#include "abi.h"
#include "provider/kernel_provider.hpp"
#include "runtime/cuda_driver.hpp"
#include "runtime/module.hpp"

namespace fusedopt::runtime {

/// Threads per block of the CUDA kernels: FO_CUDA_BLOCK of abi.h, which the kernels use.
constexpr int kCudaBlock = FO_CUDA_BLOCK;
/// Elements per chunk of the CUDA plan (a multiple of 4, so every chunk can take the
/// vector path): 32 iterations of 512 threads x 4 elements.
constexpr std::int64_t kCudaChunk = 1 << 16;

/// Gets the kernel from `provide(target)` for the context's device: a CUBIN for its sm_XX
/// when NVRTC knows it, else PTX (device_target.hpp), and once more as PTX when the driver
/// refuses the CUBIN; an emulator image on fusedopt's CUDA emulator. Loads it into
/// `context` (which must outlive the module). Throws CudaError, CompileError, Error.
std::unique_ptr<Module> load_cuda_module(
    const cuda::PrimaryContext& context,
    const std::function<provider::ProvidedKernel(const Target&)>& provide);

/// The grid of a chunk launch of `module` (a CUDA one) over `num_chunks` chunks: one wave
/// (the entry's occupancy at kCudaBlock threads times the SMs), never more than the chunks.
unsigned cuda_step_grid(const Module& module, std::int64_t num_chunks);

}  // namespace fusedopt::runtime
