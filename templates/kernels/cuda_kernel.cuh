// CUDA skeleton: one launch runs the rule over every tensor of the step. Each block walks
// the chunk table grid-stride; the uniform values (hypers, step, hoisted subexpressions)
// are computed once per block and group, in shared memory, never per element.
// The generated part (fo_uniform, fo_tensor, fo_bind, fo_prepare, fo_element,
// fo_init_element, FO_NUM_ROLES, FO_NUM_HYPERS) comes before this file.
#ifndef FO_GENERATED
#include "prelude.h"
#include "abi.h"
#include "sample_rule.h"
#endif

#ifndef FO_BLOCK
#define FO_BLOCK 512
#endif

template <bool kInit>
__device__ __forceinline__ void fo_run(const fo_launch& L) {
  __shared__ fo_uniform shared_uniform;
  const float step = L.step_ptr ? *L.step_ptr : L.step;
  const float inv_grad_scale = L.inv_grad_scale_ptr ? *L.inv_grad_scale_ptr : L.inv_grad_scale;
  int group = -1;
  fo_uniform U;
  for (long long c = blockIdx.x; c < L.num_chunks; c += gridDim.x) {
    const fo_chunk chunk = L.chunks[c];
    if (chunk.group != group) {  // the same for every thread of the block
      __syncthreads();
      if (threadIdx.x == 0) {
        shared_uniform = fo_prepare(L.hypers + (long long)chunk.group * FO_NUM_HYPERS, step,
                                    inv_grad_scale);
      }
      __syncthreads();
      U = shared_uniform;
      group = chunk.group;
    }
    const fo_tensor t = fo_bind(L.ptrs + (long long)chunk.tensor * FO_NUM_ROLES);
    for (long long i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
      if (kInit) {
        fo_init_element(t, i, U);
      } else {
        fo_element(t, i, U);
      }
    }
  }
}

/// One optimizer step over the chunk table.
extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_step(fo_launch L) {
  fo_run<false>(L);
}

/// Writes every state tensor's initial value.
extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_init(fo_launch L) {
  fo_run<true>(L);
}

/// Sets *L.found_nonfinite to 1 if any unscaled gradient element is not finite (the caller
/// zeroes it first). Runs before a step with grad scaling, on the same stream.
extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_check(fo_launch L, int* found_nonfinite) {
  const float inv_grad_scale = L.inv_grad_scale_ptr ? *L.inv_grad_scale_ptr : L.inv_grad_scale;
  fo_uniform U;
  U.inv_grad_scale = inv_grad_scale;
  bool bad = false;
  for (long long c = blockIdx.x; c < L.num_chunks; c += gridDim.x) {
    const fo_chunk chunk = L.chunks[c];
    const fo_tensor t = fo_bind(L.ptrs + (long long)chunk.tensor * FO_NUM_ROLES);
    for (long long i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
      bad |= !fo_grad_finite(t, i, U);
    }
  }
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_nonfinite = 1;
}
