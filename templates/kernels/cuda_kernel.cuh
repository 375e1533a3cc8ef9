// CUDA skeleton: one launch runs the rule over every tensor of the step. Each block walks
// the chunk table grid-stride; the uniform values (hypers, step, hoisted subexpressions)
// are computed once per block and group, in shared memory, never per element.
// The generated part (fo_uniform, fo_tensor, fo_bind, fo_prepare, fo_element,
// fo_init_element, fo_grad_finite, FO_NUM_ROLES, FO_NUM_HYPERS) comes before this file.
// Its parts, where it includes them (generated sources paste them there: codegen/source.cpp):
// cuda_staging.cuh the register staging of the vector path, cuda_quant.cuh quantized states,
// cuda_reduce.cuh the reduction passes and their finalize.
//
// Two element paths, chosen per chunk (the same for the whole block, so no divergence):
// - vector: when the runtime marked the tensor aligned (every role's pointer aligned to
//   4 of its elements: 16 bytes for fp32, 8 for 16-bit; L.aligned[tensor] == 1) and the
//   chunk begins at a multiple of 4, each thread loads 4 consecutive elements of each role the pass
//   reads with one 16-byte (fp32) or 8-byte (fp16, bf16) load into registers, runs the generated
//   fo_element on those registers, and stores each role the pass writes with one wide store (ILP 4,
//   as apex); the roles come from the generated FO_UPDATE_*/FO_INIT_* lists. Explicit wide loads,
//   because the compiler cannot prove the alignment of fo_element's scalar loads and cannot reorder
//   them across the stores of other roles (which it cannot prove do not alias). The chunk's last
//   (end - begin) % 4 elements take the scalar path.
// - scalar: everything else (misaligned tensors, a null L.aligned, tails), one element
//   per thread per iteration. Always correct.
#ifndef FO_GENERATED
#include "abi.h"
#include "prelude.h"
#include "sample_rule.h"
#endif

// Threads per block: the runtime launches FO_CUDA_BLOCK (abi.h), so every kernel says so.
#define FO_BLOCK FO_CUDA_BLOCK

#include "cuda_staging.cuh"

// ---- the entry points ------------------------------------------------------------------

/// Tensor `tensor`'s roles, and which param's elements they are (fo_launch::tensor_ids: the
/// random numbers' counter).
__device__ __forceinline__ fo_tensor fo_bind_tensor(const fo_launch& L, int tensor) {
  fo_tensor t = fo_bind(L.ptrs + (long long)tensor * FO_NUM_ROLES);
  t.pid = L.tensor_ids ? (unsigned int)L.tensor_ids[2 * (long long)tensor] : (unsigned int)tensor;
  t.e0 = L.tensor_ids ? L.tensor_ids[2 * (long long)tensor + 1] : 0;
  return t;
}

/// The per-tensor values of a tensor of group `group`: its reduction results, its scalar
/// states and what element code reads of them (nothing when the rule has none).
__device__ __forceinline__ fo_tvals fo_chunk_values(const fo_launch& L, int tensor, int group,
                                                    double step, double* scalars_out) {
  fo_tvals T;
  fo_tensor_values(L.tensor_totals ? L.tensor_totals + (long long)tensor * FO_NUM_TENSOR_SLOTS : 0,
                   L.scalars ? L.scalars + (long long)tensor * FO_NUM_SCALARS : 0,
                   L.hypers + (long long)group * FO_NUM_HYPERS, step, L.global_totals,
                   L.tensor_whole  ? L.tensor_whole + (long long)tensor * 4
                   : L.tensor_info ? L.tensor_info + (long long)tensor * 4
                                   : 0,
                   T, scalars_out);
  return T;
}

/// A chunk's per-tensor values as every thread of the block reads them. With scalar states
/// (double arithmetic in a non-inlined function) one thread computes them into shared
/// memory; otherwise each thread computes the few conversions itself.
__device__ __forceinline__ fo_tvals fo_block_values(const fo_launch& L, const fo_chunk& chunk,
                                                    double step, fo_tvals* shared_tvals) {
#if FO_NUM_SCALARS > 0
  __syncthreads();
  if (threadIdx.x == 0) *shared_tvals = fo_chunk_values(L, chunk.tensor, chunk.group, step, 0);
  __syncthreads();
  return *shared_tvals;
#else
  (void)shared_tvals;
  return fo_chunk_values(L, chunk.tensor, chunk.group, step, 0);
#endif
}

/// The 1-based step of this launch: by value, or one past the steps the device has counted
/// (the count advances after the step's last launch, unless the step was skipped).
__device__ __forceinline__ double fo_launch_step(const fo_launch& L) {
  return L.step_ptr ? *L.step_ptr + 1.0 : L.step;
}

/// True when the launch must do nothing: a gradient check on the device found a
/// non-finite value (the same for every thread, so an early return before any barrier).
__device__ __forceinline__ bool fo_skipped(const fo_launch& L) {
  return L.skip_if_set != 0 && *L.skip_if_set != 0.0;
}

#include "cuda_quant.cuh"

template <bool kInit>
__device__ __forceinline__ void fo_run(const fo_launch& L) {
  if (fo_skipped(L)) return;
  __shared__ fo_uniform shared_uniform;
  __shared__ fo_tvals shared_tvals;
#if FO_NUM_QUANT > 0
  FO_QUANT_SHARED
#endif
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L.inv_grad_scale, L.grad_scale_ptr);
  int group = -1;
  fo_uniform U;
  for (long long c = blockIdx.x; c < L.num_chunks; c += gridDim.x) {
    const fo_chunk chunk = L.chunks[c];
    if (chunk.group != group) {  // the same for every thread of the block
      __syncthreads();
      if (threadIdx.x == 0) {
        shared_uniform = fo_prepare(L.hypers + (long long)chunk.group * FO_NUM_HYPERS, step,
                                    inv_grad_scale, L.global_totals);
        shared_uniform.seed = L.seed;
      }
      __syncthreads();
      U = shared_uniform;
      group = chunk.group;
    }
    const fo_tensor t = fo_bind_tensor(L, chunk.tensor);
    const fo_tvals T = fo_block_values(L, chunk, step, &shared_tvals);
#if FO_NUM_QUANT > 0
    fo_q_chunk<kInit>(L, chunk, t, U, T, fo_qmaps, fo_qred, fo_qcodes);
    continue;
#endif
#if FO_FACTORED
    if (!kInit) {  // one element per thread, with its row's and column's values
      const long long R = fo_rows_of(L, chunk.tensor), C = fo_cols_of(L, chunk.tensor);
      const fo_rcx X0 = fo_rc_base(L, chunk.tensor);
      float rv[FO_NUM_ROWV], cv[FO_NUM_COLV];
      for (long long i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
        const fo_rcx X = fo_rc_values_at<FO_REDUCTION_PASSES>(fo_rc_at(X0, i, R, C), U, T, rv, cv);
        fo_element_rc(t, i, U, T, X, X.col);
      }
      continue;
    }
#endif
    long long scalar_begin = chunk.begin;
    if (L.aligned && L.aligned[chunk.tensor] && (chunk.begin & 3) == 0) {
      const long long groups = (chunk.end - chunk.begin) >> 2;  // whole 4-element groups
      for (long long q = threadIdx.x; q < groups; q += blockDim.x) {
        fo_element_n<kInit, 4>(t, chunk.begin + 4 * q, U, T);
      }
      scalar_begin = chunk.begin + 4 * groups;  // the 0..3 element tail
    }
    for (long long i = scalar_begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
      fo_element_n<kInit, 1>(t, i, U, T);
    }
  }
}

#include "cuda_reduce.cuh"

/// One optimizer step over the chunk table.
extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_step(fo_launch L) {
  fo_run<false>(L);
}

/// Writes every state tensor's initial value.
extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_init(fo_launch L) {
  fo_run<true>(L);
}

/// Per-tensor scalar states, one thread per tensor (empty tensors included): with `init`,
/// the initial values; else each tensor's values after the step, launched after the step's
/// last pass (and skipped with it). The values come from the same non-inlined function the
/// passes read them through, so what the update used is what is stored.
/// Tensor t's scalar states: their initial values, or the step's.
__device__ __forceinline__ void fo_write_scalars(const fo_launch& L, long long t, int init,
                                                 double step) {
  double* S = L.scalars + t * FO_NUM_SCALARS;
  const int group = L.tensor_groups[t];
  if (init) {
    fo_scalar_init(L.hypers + (long long)group * FO_NUM_HYPERS, S);
  } else {
    (void)fo_chunk_values(L, (int)t, group, step, S);
  }
}

extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_scalars(fo_launch L, int init) {
  if (fo_skipped(L) || (FO_NUM_SCALARS == 0 && !FO_FACTORED)) return;
  const double step = fo_launch_step(L);
#if FO_FACTORED
  // A block per tensor: its rows and columns across the threads, then (after every row read
  // them as the step did) its scalars.
  for (long long t = blockIdx.x; t < L.num_tensors; t += gridDim.x) {
    fo_rc_write(L, t, init, step, fo_unscale_factor(L.inv_grad_scale, L.grad_scale_ptr),
                threadIdx.x, blockDim.x);
    __syncthreads();
    if (FO_NUM_SCALARS > 0 && threadIdx.x == 0) fo_write_scalars(L, t, init, step);
    __syncthreads();
  }
#else
  for (long long t = blockIdx.x * (long long)blockDim.x + threadIdx.x; t < L.num_tensors;
       t += (long long)gridDim.x * blockDim.x) {
    fo_write_scalars(L, t, init, step);
  }
#endif
}

/// Sets *found_nonfinite to 1 if any unscaled gradient element is not finite (the caller
/// zeroes it first). Runs before a step with grad scaling, on the same stream.
extern "C" __global__ void __launch_bounds__(FO_BLOCK)
    fusedopt_check(fo_launch L, double* found_nonfinite) {
  const float inv_grad_scale = fo_unscale_factor(L.inv_grad_scale, L.grad_scale_ptr);
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
  if (__syncthreads_or(bad) && threadIdx.x == 0) *found_nonfinite = 1.0;
}

/// Counts a step taken on the device: adds one to the device-resident count of steps taken,
/// unless `skip` is set (a non-finite gradient found on the device: the step was not taken).
/// The runtime launches it (one thread) after the step's last pass, so a captured CUDA graph
/// replays with a fresh step each time and a skipped step leaves the count as it was.
extern "C" __global__ void fusedopt_advance_step(double* step, const double* skip) {
  if (blockIdx.x == 0 && threadIdx.x == 0 && (skip == 0 || *skip == 0.0)) *step += 1.0;
}

/// A device GradScaler's update after a step (one thread): `found` is the step's grad-check
/// flag (non-zero: the step was skipped); fo_update_scale (abi.h) is torch's
/// _amp_update_scale_. The next step reads the new inverse scale from `s`.
extern "C" __global__ void fusedopt_update_scale(fo_scaler* s, const double* found, float growth,
                                                 float backoff, int interval) {
  if (blockIdx.x == 0 && threadIdx.x == 0)
    fo_update_scale(s, *found != 0.0, growth, backoff, interval);
}
