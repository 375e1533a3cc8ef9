// The CUDA skeleton's reductions (cuda_kernel.cuh includes it; generated sources paste it
// there): each reduction pass's kernel (fusedopt_reduce_<pass>) and the finalize that
// combines the chunk partials (fusedopt_finalize), in a fixed order. Not a header of its
// own: it needs what cuda_kernel.cuh defines before it.
// ---- reductions: two fixed-order stages, the same bits on every run ----------------------
// Stage 1 (fusedopt_reduce_<pass>, one kernel per pass): one block per chunk at a time; on
// the vector path each thread takes two 4-element groups per iteration (blockDim.x groups
// apart) into two independent accumulator sets, combined at the end; the tail goes one
// element at a time into the first set. Then a shared-memory tree (fixed shape) gives the
// chunk's partial. Stage 2 (fusedopt_finalize): the chunk partials, combined in double in a
// fixed order: per tensor, one block per tensor (threads stride over its chunks, then a
// fixed tree); globally, block 0 alone.

__device__ __forceinline__ double fo_combine(bool is_max, double a, double b) {
  return is_max ? fo_maxnan_d(a, b) : a + b;
}

/// Elements [i, i+kN) of tensor t into the accumulators `a` of reduction pass kPass,
/// through registers (the roles the pass reads, loaded once; those it writes, stored once).
/// One specialisation per pass, since the staging lists are per pass.
template <int kPass>
struct fo_reduce_staging;
#if FO_FACTORED  // factored rules reduce one element at a time (fo_reduce_run)
#define FO_REDUCE_GROUP(k)
#else
#define FO_REDUCE_GROUP(k)                                                                       \
  template <>                                                                                    \
  struct fo_reduce_staging<k> {                                                                  \
    template <int kN>                                                                            \
    static __device__ __forceinline__ void run(const fo_tensor& t, long long i,                  \
                                               const fo_uniform& U, const fo_tvals& T, float* a, \
                                               bool check) {                                     \
      fo_tensor s = t;                                                                           \
      s.e0 = t.e0 + i;                                                                           \
      FO_REDUCE##k##_STAGE(FO_STAGE_LOAD, FO_STAGE_DECL) for (int j = 0; j < kN; ++j)            \
          fo_reduce_element<k>(s, j, U, T, a, 1, check);                                         \
      FO_REDUCE##k##_STORES(FO_STAGE_STORE)                                                      \
    }                                                                                            \
  };
#endif
template <int kPass, int kN>
__device__ __forceinline__ void fo_reduce_n(const fo_tensor& t, long long i, const fo_uniform& U,
                                            const fo_tvals& T, float* a, bool check) {
  fo_reduce_staging<kPass>::template run<kN>(t, i, U, T, a, check);
}
FO_REDUCE_KERNELS(FO_REDUCE_GROUP)

#if FO_FACTORED
#if FO_NUM_QUANT > 0
#define FO_QMAPS_PARAM , float(*fo_qmaps)[FO_QMAP_MAX]
#define FO_QMAPS_ARG , fo_qmaps
#else
#define FO_QMAPS_PARAM
#define FO_QMAPS_ARG
#endif
/// Chunk c of tensor t (whole rows) into the accumulators `a` of pass kPass, and its rows'
/// means and its columns' partial sums; rowred: FO_BLOCK doubles of shared memory (with
/// quantized states, fo_qmaps: their maps in shared memory).
template <int kPass>
__device__ __forceinline__ void fo_reduce_rows(const fo_launch& L, long long c,
                                               const fo_chunk& chunk, const fo_tensor& t,
                                               const fo_uniform& U, const fo_tvals& T, float* a,
                                               bool check, double* rowred FO_QMAPS_PARAM) {
  // Whole rows: a warp per row, its 32 lanes over the row's columns (coalesced), their
  // double sums combined in lane order through shared memory (a row's mean is complete
  // here); then each thread its columns over the chunk's rows (coalesced too: the
  // chunk's partials, combined by the finalize in chunk order). The pass writes no role
  // (the Recompute strategy), so an element read twice gives the same values. The
  // accumulators take each element once (in the row sweep).
  const long long R = fo_rows_of(L, chunk.tensor), C = fo_cols_of(L, chunk.tensor);
  const fo_rcx X0 = fo_rc_base(L, chunk.tensor);
  const long long r0 = chunk.begin / C, rows = (chunk.end - chunk.begin) / C;
#if FO_NUM_QUANT > 0
  // Quantized states: each element through its dequantized values (no state written).
  const fo_qtensor qt = fo_qbind(L.ptrs + (long long)chunk.tensor * FO_NUM_ROLES,
                                 (long long)L.tensor_info[4 * (long long)chunk.tensor]);
  float vals[FO_NUM_QUANT];
#define FO_RC_AT(i) (fo_q_values(qt, (i), true, fo_qmaps, vals), fo_q_view(t, (i), vals)), 0
#else
#define FO_RC_AT(i) t, (i)
#endif
  double rr[FO_NUM_ROW_SLOTS], cr[FO_NUM_COL_SLOTS];
  float rv[FO_NUM_ROWV], cv[FO_NUM_COLV];
  float dummy[FO_MAX_ACC];
  for (int j = 0; j < FO_MAX_ACC; ++j) dummy[j] = 0.0f;
  const int lane = (int)(threadIdx.x & 31u), warps = (int)(blockDim.x >> 5);
  for (long long q0 = 0; q0 < rows; q0 += warps) {  // the same trip count in every thread
    const long long q = q0 + (long long)(threadIdx.x >> 5);
    for (int s = 0; s < FO_NUM_ROW_SLOTS; ++s) rr[s] = 0.0;
    if (q < rows) {
      const long long r = r0 + q;
      for (long long cc = lane; cc < C; cc += 32) {
        const fo_rcx X = fo_rc_values_at<kPass>(fo_rc_at(X0, r * C + cc, R, C), U, T, rv, cv);
        fo_reduce_element_rc<kPass>(FO_RC_AT(r * C + cc), U, T, X, X.col, a, 1, check, rr, cr);
      }
    }
    for (int s = 0; s < FO_NUM_ROW_SLOTS; ++s) {
      rowred[threadIdx.x] = rr[s];
      __syncthreads();
      if (lane == 0 && q < rows && fo_row_slot_pass(s) == kPass) {
        double v = 0.0;
        for (int l = 0; l < 32; ++l) v += rowred[threadIdx.x + l];
        L.row_totals[(X0.row + r0 + q) * FO_NUM_ROW_SLOTS + s] = v / C;
      }
      __syncthreads();
    }
  }
  double* colp = L.col_partials + L.chunk_cols[c];
  for (long long cc = threadIdx.x; cc < C; cc += blockDim.x) {
    for (int s = 0; s < FO_NUM_COL_SLOTS; ++s) cr[s] = 0.0;
    for (long long q = 0; q < rows; ++q) {
      const long long i = (r0 + q) * C + cc;
      const fo_rcx X = fo_rc_values_at<kPass>(fo_rc_at(X0, i, R, C), U, T, rv, cv);
      fo_reduce_element_rc<kPass>(FO_RC_AT(i), U, T, X, X.col, dummy, 1, false, rr, cr);
    }
    for (int s = 0; s < FO_NUM_COL_SLOTS; ++s) colp[s * C + cc] = cr[s];
  }
#undef FO_RC_AT
}
#endif

/// Chunk c's partials of pass kPass: each of the threads' accumulators `a` combined by a
/// fixed-shape tree over red (FO_BLOCK floats of shared memory).
template <int kPass>
__device__ __forceinline__ void fo_chunk_partials(const fo_launch& L, long long c, const float* a,
                                                  float* red) {
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

template <int kPass>
__device__ __forceinline__ void fo_reduce_run(const fo_launch& L) {
  if (fo_skipped(L)) return;
  __shared__ fo_uniform shared_uniform;
  __shared__ fo_tvals shared_tvals;
  __shared__ float red[FO_BLOCK];
#if FO_FACTORED
  __shared__ double rowred[FO_BLOCK];  // a warp's lane sums of its row
#endif
#if FO_NUM_QUANT > 0
  FO_QUANT_MAPS_SHARED
#endif
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L.inv_grad_scale, L.grad_scale_ptr);
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
        shared_uniform.seed = L.seed;
      }
      __syncthreads();
      U = shared_uniform;
      group = chunk.group;
    }
    const fo_tensor t = fo_bind_tensor(L, chunk.tensor);
    const fo_tvals T = fo_block_values(L, chunk, step, &shared_tvals);
    float a[FO_MAX_ACC];
#pragma unroll
    for (int j = 0; j < FO_MAX_ACC; ++j) a[j] = 0.0f;
#if FO_FACTORED
    fo_reduce_rows<kPass>(L, c, chunk, t, U, T, a, check, rowred FO_QMAPS_ARG);
#elif FO_NUM_QUANT > 0
    {  // one element per thread, through its dequantized values (the pass writes no state)
      const fo_qtensor q = fo_qbind(L.ptrs + (long long)chunk.tensor * FO_NUM_ROLES,
                                    (long long)L.tensor_info[4 * (long long)chunk.tensor]);
      for (long long i = chunk.begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
        float vals[FO_NUM_QUANT];
        fo_q_values(q, i, true, fo_qmaps, vals);
        fo_reduce_element<kPass>(fo_q_view(t, i, vals), 0, U, T, a, 1, check);
      }
    }
#else
    long long scalar_begin = chunk.begin;
    if (L.aligned && L.aligned[chunk.tensor] && (chunk.begin & 3) == 0) {
      const long long groups = (chunk.end - chunk.begin) >> 2;
      float b[FO_MAX_ACC];
#pragma unroll
      for (int j = 0; j < FO_MAX_ACC; ++j) b[j] = 0.0f;
      long long q = threadIdx.x;
      for (; q + blockDim.x < groups; q += 2 * (long long)blockDim.x) {
        fo_reduce_n<kPass, 4>(t, chunk.begin + 4 * q, U, T, a, check);
        fo_reduce_n<kPass, 4>(t, chunk.begin + 4 * (q + blockDim.x), U, T, b, check);
      }
      if (q < groups) fo_reduce_n<kPass, 4>(t, chunk.begin + 4 * q, U, T, a, check);
#pragma unroll
      for (int j = 0; j < FO_MAX_ACC; ++j) {
        if (j >= fo_acc_count(kPass)) break;
        a[j] = fo_acc_max(kPass, j) != 0 ? fo_maxnan(a[j], b[j]) : a[j] + b[j];
      }
      scalar_begin = chunk.begin + 4 * groups;  // the 0..3 element tail
    }
    for (long long i = scalar_begin + threadIdx.x; i < chunk.end; i += blockDim.x) {
      fo_reduce_n<kPass, 1>(t, i, U, T, a, check);
    }
#endif
    fo_chunk_partials<kPass>(L, c, a, red);
  }
}

/// Reduction pass k of the rule: every chunk's partials.
#define FO_REDUCE_KERNEL(k)                                                                 \
  extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_reduce_##k(fo_launch L) { \
    fo_reduce_run<k>(L);                                                                    \
  }
FO_REDUCE_KERNELS(FO_REDUCE_KERNEL)

/// A fixed-shape tree over red[0, blockDim.x) in shared memory; the result in red[0].
__device__ __forceinline__ void fo_tree(double* red, bool is_max) {
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s)
      red[threadIdx.x] = fo_combine(is_max, red[threadIdx.x], red[threadIdx.x + s]);
    __syncthreads();
  }
}

#if FO_FACTORED
/// A factored rule's part of fusedopt_finalize for pass `pass` (red: its FO_BLOCK doubles of
/// shared memory).
__device__ __forceinline__ void fo_finalize_rc(const fo_launch& L, int pass, double* red) {
  // After this block's per-tensor totals: the column means of its tensors (a column per
  // thread, coalesced over each chunk's partials), then their matrix means (each thread sums
  // rows and columns threadIdx.x, + blockDim.x, ...; a fixed tree adds the threads' sums;
  // they read per-tensor totals of earlier passes only, and this pass's column means).
  // With pieces (L.rc_stage, abi.h): stage 1 the column sums that span pieces into the shard;
  // stage 2 the means (those sums combined by the hook) and the matrix sums, the spanning
  // ones over rows into the shard; stage 3 their means (combined too).
  for (long long t = blockIdx.x; t < L.num_tensors; t += gridDim.x) {
    double* const sh = fo_rc_shard(L, t);
    const long long cols = L.rc_offsets[3 * t + 4] - L.rc_offsets[3 * t + 1];
    if (L.rc_stage == 3) {
      if (sh && threadIdx.x == 0 && fo_rc_matrix_pass(L, pass, t)) {
        for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) {
          if (!fo_matrix_slot_col(s))
            fo_rc_matrix_store(L, pass, t, 0, s, sh[cols * FO_NUM_COL_SLOTS + s]);
        }
      }
      continue;
    }
    fo_rc_col_means(L, pass, t, threadIdx.x, blockDim.x);
    __syncthreads();
    if (L.rc_stage == 1) continue;
    if (sh) {  // what the hook combines next: this pass's matrix sums over rows, else 0
      for (long long k = threadIdx.x; k < cols * FO_NUM_COL_SLOTS + FO_NUM_MATRIX_SLOTS;
           k += blockDim.x)
        sh[k] = 0.0;
      __syncthreads();
    }
    if (!fo_rc_matrix_pass(L, pass, t)) continue;
    for (long long b = 0; b < fo_rc_matrices(L, t); ++b) {
      double sums[FO_NUM_MATRIX_SLOTS > 0 ? FO_NUM_MATRIX_SLOTS : 1];
      fo_rc_matrix_partials(L, pass, t, b, fo_launch_step(L),
                            fo_unscale_factor(L.inv_grad_scale, L.grad_scale_ptr), threadIdx.x,
                            blockDim.x, sums);
      for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) {
        if (fo_matrix_slot_pass(s) != pass) continue;
        red[threadIdx.x] = sums[s];
        fo_tree(red, false);
        if (threadIdx.x == 0) {
          if (sh && !fo_matrix_slot_col(s)) {
            sh[cols * FO_NUM_COL_SLOTS + s] = red[0];
          } else {
            fo_rc_matrix_store(L, pass, t, b, s, red[0]);
          }
        }
        __syncthreads();
      }
    }
  }
}
#endif

/// Combines pass `pass`'s chunk partials: per-tensor totals (one block per tensor, its
/// threads striding over the tensor's chunks) and, in block 0, the global totals.
extern "C" __global__ void __launch_bounds__(FO_BLOCK) fusedopt_finalize(fo_launch L, int pass) {
  if (fo_skipped(L)) return;
  __shared__ double red[FO_BLOCK];
  const int count = fo_acc_count(pass);
  for (int j = 0; j < count && L.rc_stage <= 1; ++j) {
    const bool is_max = fo_acc_max(pass, j) != 0;
    const int slot = fo_acc_slot(pass, j);
    if (slot >= 0) {
      for (long long t = blockIdx.x; t < L.num_tensors; t += gridDim.x) {
        const long long first = L.tensor_chunks[2 * t];
        const long long n = L.tensor_chunks[2 * t + 1];
        double acc = 0.0;
        for (long long c = first + threadIdx.x; c < first + n; c += blockDim.x)
          acc = fo_combine(is_max, acc, L.partials[c * FO_MAX_ACC + j]);
        red[threadIdx.x] = acc;
        fo_tree(red, is_max);
        if (threadIdx.x == 0) L.tensor_totals[t * FO_NUM_TENSOR_SLOTS + slot] = red[0];
        __syncthreads();
      }
    } else if (blockIdx.x == 0) {
      double acc = 0.0;
      for (long long c = threadIdx.x; c < L.num_chunks; c += blockDim.x) {
        acc = fo_combine(is_max, acc, L.partials[c * FO_MAX_ACC + j]);
      }
      red[threadIdx.x] = acc;
      fo_tree(red, is_max);
      if (threadIdx.x == 0) {
        double* g = L.global_totals + (-1 - slot);
        *g = L.global_accumulate ? fo_combine(is_max, *g, red[0]) : red[0];
      }
      __syncthreads();
    }
  }
#if FO_FACTORED
  fo_finalize_rc(L, pass, red);
#endif
}
