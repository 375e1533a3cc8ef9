// CUDA skeleton: one launch runs the rule over every tensor of the step. Each block walks
// the chunk table grid-stride; the uniform values (hypers, step, hoisted subexpressions)
// are computed once per block and group, in shared memory, never per element.
// The generated part (fo_uniform, fo_tensor, fo_bind, fo_prepare, fo_element,
// fo_init_element, fo_grad_finite, FO_NUM_ROLES, FO_NUM_HYPERS) comes before this file.
//
// Two element paths, chosen per chunk (the same for the whole block, so no divergence):
// - vector: when the runtime marked the tensor aligned (every role's pointer 16-byte
//   aligned, L.aligned[tensor] == 1) and the chunk begins at a multiple of 4, each thread
//   loads 4 consecutive elements of every role with one 16-byte (fp32) or 8-byte (fp16,
//   bf16) load into registers, runs the generated fo_element on those registers, and
//   stores each writable role back with one wide store (ILP 4, as apex). Explicit wide
//   loads, because the compiler cannot prove the alignment of fo_element's scalar loads
//   and cannot reorder them across the stores of other roles (which it cannot prove do
//   not alias). The chunk's last (end - begin) % 4 elements take the scalar path.
// - scalar: everything else (misaligned tensors, a null L.aligned, tails), one element
//   per thread per iteration. Always correct.
#ifndef FO_GENERATED
#include "abi.h"
#include "prelude.h"
#include "sample_rule.h"
#endif

// Threads per block: the runtime launches FO_CUDA_BLOCK (abi.h), so every kernel says so.
#define FO_BLOCK FO_CUDA_BLOCK

// ---- 4-element register staging for the vector path ----------------------------------

template <typename T>
struct fo_vec4;
template <>
struct alignas(16) fo_vec4<float> {
  float v[4];
};
template <>
struct alignas(8) fo_vec4<fo_f16> {
  fo_f16 v[4];
};
template <>
struct alignas(8) fo_vec4<fo_bf16> {
  fo_bf16 v[4];
};

/// Elements [i, i+4) of p in one load; p + i must be aligned to sizeof(fo_vec4<T>).
template <typename T>
FO_FN fo_vec4<T> fo_vload(const T* p, long long i) {
  return *reinterpret_cast<const fo_vec4<T>*>(p + i);
}
/// Writes elements [i, i+4) of a writable role in one store.
template <typename T>
FO_FN void fo_vstore(T* p, long long i, const fo_vec4<T>& s) {
  *reinterpret_cast<fo_vec4<T>*>(p + i) = s;
}
/// Read-only roles (the gradient) are never written back.
template <typename T>
FO_FN void fo_vstore(const T*, long long, const fo_vec4<T>&) {}

// FO_ROLEk(X) expands to X(k) when the kernel has a role k. fo_tensor's members are named
// r0, r1, ...: the expansion touches only members that exist. Kernels with more than 16
// roles use the scalar path only.
#if FO_NUM_ROLES <= 16
#define FO_VECTOR_PATH 1
#else
#define FO_VECTOR_PATH 0
#endif
#define FO_ROLE0(X) X(0)
#define FO_ROLE1(X) X(1)
#if FO_NUM_ROLES > 2
#define FO_ROLE2(X) X(2)
#else
#define FO_ROLE2(X)
#endif
#if FO_NUM_ROLES > 3
#define FO_ROLE3(X) X(3)
#else
#define FO_ROLE3(X)
#endif
#if FO_NUM_ROLES > 4
#define FO_ROLE4(X) X(4)
#else
#define FO_ROLE4(X)
#endif
#if FO_NUM_ROLES > 5
#define FO_ROLE5(X) X(5)
#else
#define FO_ROLE5(X)
#endif
#if FO_NUM_ROLES > 6
#define FO_ROLE6(X) X(6)
#else
#define FO_ROLE6(X)
#endif
#if FO_NUM_ROLES > 7
#define FO_ROLE7(X) X(7)
#else
#define FO_ROLE7(X)
#endif
#if FO_NUM_ROLES > 8
#define FO_ROLE8(X) X(8)
#else
#define FO_ROLE8(X)
#endif
#if FO_NUM_ROLES > 9
#define FO_ROLE9(X) X(9)
#else
#define FO_ROLE9(X)
#endif
#if FO_NUM_ROLES > 10
#define FO_ROLE10(X) X(10)
#else
#define FO_ROLE10(X)
#endif
#if FO_NUM_ROLES > 11
#define FO_ROLE11(X) X(11)
#else
#define FO_ROLE11(X)
#endif
#if FO_NUM_ROLES > 12
#define FO_ROLE12(X) X(12)
#else
#define FO_ROLE12(X)
#endif
#if FO_NUM_ROLES > 13
#define FO_ROLE13(X) X(13)
#else
#define FO_ROLE13(X)
#endif
#if FO_NUM_ROLES > 14
#define FO_ROLE14(X) X(14)
#else
#define FO_ROLE14(X)
#endif
#if FO_NUM_ROLES > 15
#define FO_ROLE15(X) X(15)
#else
#define FO_ROLE15(X)
#endif
// clang-format 14 never settles on this macro's line breaks:
// clang-format off
#define FO_EACH_ROLE(X)                                                                 \
  FO_ROLE0(X) FO_ROLE1(X) FO_ROLE2(X) FO_ROLE3(X) FO_ROLE4(X) FO_ROLE5(X) FO_ROLE6(X)   \
  FO_ROLE7(X) FO_ROLE8(X) FO_ROLE9(X) FO_ROLE10(X) FO_ROLE11(X) FO_ROLE12(X)             \
  FO_ROLE13(X) FO_ROLE14(X) FO_ROLE15(X)
// clang-format on

#define FO_STAGE_LOAD(k)              \
  auto fo_s##k = fo_vload(t.r##k, i); \
  s.r##k = fo_s##k.v;
#define FO_STAGE_STORE(k) fo_vstore(t.r##k, i, fo_s##k);

#if FO_VECTOR_PATH
/// Elements [i, i+4) of tensor t through registers: i is a multiple of 4 and every role
/// pointer of t is 16-byte aligned (the caller checked both).
template <bool kInit>
__device__ __forceinline__ void fo_element4(const fo_tensor& t, long long i, const fo_uniform& U,
                                            const fo_tvals& T) {
  fo_tensor s = t;  // the same roles, pointing at the register copies
  FO_EACH_ROLE(FO_STAGE_LOAD)
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    if (kInit) {
      fo_init_element(s, j, U);
    } else {
      fo_element(s, j, U, T);
    }
  }
  FO_EACH_ROLE(FO_STAGE_STORE)
}
#endif

// ---- the entry points ------------------------------------------------------------------

/// The per-tensor reduction values of a tensor (zeros when the rule has none).
__device__ __forceinline__ fo_tvals fo_chunk_values(const fo_launch& L, int tensor) {
  fo_tvals T;
  fo_tensor_values(L.tensor_totals ? L.tensor_totals + (long long)tensor * FO_NUM_TENSOR_SLOTS : 0,
                   T);
  return T;
}

template <bool kInit>
__device__ __forceinline__ void fo_run(const fo_launch& L) {
  __shared__ fo_uniform shared_uniform;
  const double step = L.step_ptr ? (double)*L.step_ptr : L.step;
  const float inv_grad_scale = L.inv_grad_scale_ptr ? *L.inv_grad_scale_ptr : L.inv_grad_scale;
  int group = -1;
  fo_uniform U;
  for (long long c = blockIdx.x; c < L.num_chunks; c += gridDim.x) {
    const fo_chunk chunk = L.chunks[c];
    if (chunk.group != group) {  // the same for every thread of the block
      __syncthreads();
      if (threadIdx.x == 0) {
        shared_uniform = fo_prepare(L.hypers + (long long)chunk.group * FO_NUM_HYPERS, step,
                                    inv_grad_scale, L.global_totals);
      }
      __syncthreads();
      U = shared_uniform;
      group = chunk.group;
    }
    const fo_tensor t = fo_bind(L.ptrs + (long long)chunk.tensor * FO_NUM_ROLES);
    const fo_tvals T = fo_chunk_values(L, chunk.tensor);
    long long scalar_begin = chunk.begin;
#if FO_VECTOR_PATH
    if (L.aligned && L.aligned[chunk.tensor] && (chunk.begin & 3) == 0) {
      const long long groups = (chunk.end - chunk.begin) >> 2;  // whole 4-element groups
      for (long long q = threadIdx.x; q < groups; q += blockDim.x) {
        fo_element4<kInit>(t, chunk.begin + 4 * q, U, T);
      }
      scalar_begin = chunk.begin + 4 * groups;  // the 0..3 element tail
    }
#endif
    for (long long i = scalar_begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
      if (kInit) {
        fo_init_element(t, i, U);
      } else {
        fo_element(t, i, U, T);
      }
    }
  }
}

// ---- reductions: two fixed-order stages, the same bits on every run ----------------------
// Stage 1 (fusedopt_reduce): one block per chunk at a time; each thread accumulates a fixed
// stride of elements in fp32, then a shared-memory tree (fixed shape) gives the chunk's
// partial. Stage 2 (fusedopt_finalize): the chunk partials in chunk order, in double.

__device__ __forceinline__ double fo_combine(bool is_max, double a, double b) {
  return is_max ? fo_maxnan_d(a, b) : a + b;
}

template <int kPass>
__device__ __forceinline__ void fo_reduce_run(const fo_launch& L) {
  __shared__ fo_uniform shared_uniform;
  __shared__ float red[FO_BLOCK];
  const double step = L.step_ptr ? (double)*L.step_ptr : L.step;
  const float inv_grad_scale = L.inv_grad_scale_ptr ? *L.inv_grad_scale_ptr : L.inv_grad_scale;
  const bool check = kPass == 0 && L.check_grads != 0;
  int group = -1;
  fo_uniform U;
  for (long long c = blockIdx.x; c < L.num_chunks; c += gridDim.x) {
    const fo_chunk chunk = L.chunks[c];
    if (chunk.group != group) {
      __syncthreads();
      if (threadIdx.x == 0) {
        shared_uniform = fo_prepare(L.hypers + (long long)chunk.group * FO_NUM_HYPERS, step,
                                    inv_grad_scale, L.global_totals);
      }
      __syncthreads();
      U = shared_uniform;
      group = chunk.group;
    }
    const fo_tensor t = fo_bind(L.ptrs + (long long)chunk.tensor * FO_NUM_ROLES);
    const fo_tvals T = fo_chunk_values(L, chunk.tensor);
    float a[FO_MAX_ACC];
#pragma unroll
    for (int j = 0; j < FO_MAX_ACC; ++j) a[j] = 0.0f;
    for (long long i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
      fo_reduce_element<kPass>(t, i, U, T, a, 1, check);
    }
#pragma unroll
    for (int j = 0; j < FO_MAX_ACC; ++j) {
      if (j >= fo_acc_count(kPass)) break;
      const bool is_max = fo_acc_max(kPass, j) != 0;
      red[threadIdx.x] = a[j];
      __syncthreads();
      for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
          const float other = red[threadIdx.x + s];
          red[threadIdx.x] = is_max ? fo_maxnan(red[threadIdx.x], other) : red[threadIdx.x] + other;
        }
        __syncthreads();
      }
      if (threadIdx.x == 0) L.partials[c * FO_MAX_ACC + j] = red[0];
      __syncthreads();
    }
  }
}

/// Reduction pass `pass` (below FO_REDUCTION_PASSES): every chunk's partials.
extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_reduce(fo_launch L, int pass) {
  FO_REDUCE_DISPATCH(L, pass);  // one case per reduction pass of the rule (codegen)
}

/// Combines pass `pass`'s chunk partials: per-tensor totals (one thread per tensor) and,
/// in block 0, the global totals (strided over chunks, then a fixed tree).
extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_finalize(fo_launch L, int pass) {
  __shared__ double red[FO_BLOCK];
  const int count = fo_acc_count(pass);
  for (int j = 0; j < count; ++j) {
    const bool is_max = fo_acc_max(pass, j) != 0;
    const int slot = fo_acc_slot(pass, j);
    if (slot >= 0) {
      for (long long t = (long long)blockIdx.x * blockDim.x + threadIdx.x; t < L.num_tensors;
           t += (long long)gridDim.x * blockDim.x) {
        const long long first = L.tensor_chunks[2 * t];
        const long long n = L.tensor_chunks[2 * t + 1];
        double acc = 0.0;
        for (long long c = first; c < first + n; ++c)
          acc = fo_combine(is_max, acc, L.partials[c * FO_MAX_ACC + j]);
        L.tensor_totals[t * FO_NUM_TENSOR_SLOTS + slot] = acc;
      }
    } else if (blockIdx.x == 0) {
      double acc = 0.0;
      for (long long c = threadIdx.x; c < L.num_chunks; c += blockDim.x) {
        acc = fo_combine(is_max, acc, L.partials[c * FO_MAX_ACC + j]);
      }
      red[threadIdx.x] = acc;
      __syncthreads();
      for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s)
          red[threadIdx.x] = fo_combine(is_max, red[threadIdx.x], red[threadIdx.x + s]);
        __syncthreads();
      }
      if (threadIdx.x == 0) {
        double* g = L.global_totals + (-1 - slot);
        *g = L.global_accumulate ? fo_combine(is_max, *g, red[0]) : red[0];
      }
      __syncthreads();
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

/// Sets *found_nonfinite to 1 if any unscaled gradient element is not finite (the caller
/// zeroes it first). Runs before a step with grad scaling, on the same stream.
extern "C" __global__ void __launch_bounds__(FO_BLOCK)
    fusedopt_check(fo_launch L, int* found_nonfinite) {
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

/// Capturable mode: advances the device-resident step by one. The runtime launches it
/// (one thread) right before fusedopt_step, so a captured CUDA graph replays with a fresh
/// step each time; it is the one extra launch that capturable mode costs.
extern "C" __global__ void fusedopt_advance_step(float* step) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *step += 1.0f;
}
