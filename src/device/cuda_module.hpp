// The CUDA Module (module.hpp): a kernel image loaded into one device's primary context.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "abi.h"
#include "device/cuda_driver.hpp"
#include "device/module.hpp"

namespace fusedopt::runtime {

/// Threads per block of the CUDA kernels: FO_CUDA_BLOCK of abi.h, which the kernels use.
constexpr int kCudaBlock = FO_CUDA_BLOCK;
/// Elements per chunk of the CUDA plan (a multiple of 4, so every chunk can take the
/// vector path): 32 iterations of 512 threads x 4 elements.
constexpr std::int64_t kCudaChunk = 1 << 16;

/// `image` loaded into `context` (which must outlive the module): Backend::load of a CUDA
/// backend (null when the driver refuses a CUBIN: `*refusal` says why). Throws CudaError.
std::unique_ptr<Module> load_cuda_module(const cuda::PrimaryContext& context, KernelImage image,
                                         std::string* refusal);

/// The grid of a chunk launch of `module` (a CUDA one) over `num_chunks` chunks: one wave
/// (the entry's occupancy at kCudaBlock threads times the SMs), never more than the chunks.
unsigned cuda_step_grid(const Module& module, std::int64_t num_chunks);

}  // namespace fusedopt::runtime
