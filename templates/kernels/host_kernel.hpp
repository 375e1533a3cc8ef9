// Host skeleton: one call runs the rule over every tensor of the step. OpenMP splits the
// chunk table statically across cores (the same split every run); the inner loop is a
// plain counted loop the compiler vectorises. Uniform values are computed once per thread
// and group, never per element.
// The generated part (fo_uniform, fo_tensor, fo_bind, fo_prepare, fo_element,
// fo_init_element, FO_NUM_ROLES, FO_NUM_HYPERS) comes before this file.
// Its parts, where it includes them (generated sources paste them there: codegen/source.cpp):
// host_quant.hpp quantized states, host_reduce.hpp the reduction passes and their finalize.
#ifndef FO_GENERATED
#include "abi.h"
#include "prelude.h"
#include "sample_rule.h"
#endif

#ifndef FO_LANES
#define FO_LANES 16
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/// Tensor `tensor`'s roles, and which param's elements they are (fo_launch::tensor_ids: the
/// random numbers' counter).
static inline fo_tensor fo_bind_tensor(const fo_launch* L, int tensor) {
  fo_tensor t = fo_bind(L->ptrs + (long long)tensor * FO_NUM_ROLES);
  t.pid = L->tensor_ids ? (unsigned int)L->tensor_ids[2 * (long long)tensor] : (unsigned int)tensor;
  t.e0 = L->tensor_ids ? L->tensor_ids[2 * (long long)tensor + 1] : 0;
  return t;
}

/// The launch's step (abi.h): one past the count the launch points at, else its own.
static inline double fo_launch_step(const fo_launch* L) {
  return L->step_ptr ? *L->step_ptr + 1.0 : L->step;
}

/// Whether the launch does nothing: its skip flag (abi.h's skip_if_set) is set.
static inline bool fo_launch_skipped(const fo_launch* L) {
  return L->skip_if_set != 0 && *L->skip_if_set != 0.0;
}

/// The per-tensor values of a tensor of group `group`: its reduction results, its scalar
/// states and what element code reads of them (nothing when the rule has none).
static inline fo_tvals fo_chunk_values(const fo_launch* L, int tensor, int group, double step,
                                       double* scalars_out) {
  fo_tvals T;
  fo_tensor_values(
      L->tensor_totals ? L->tensor_totals + (long long)tensor * FO_NUM_TENSOR_SLOTS : 0,
      L->scalars ? L->scalars + (long long)tensor * FO_NUM_SCALARS : 0,
      L->hypers + (long long)group * FO_NUM_HYPERS, step, L->global_totals,
      L->tensor_whole  ? L->tensor_whole + (long long)tensor * 4
      : L->tensor_info ? L->tensor_info + (long long)tensor * 4
                       : 0,
      T, scalars_out);
  return T;
}

#if FO_FACTORED
/// Tensor t's base X (fo_rc_base) reading chunk c's column values of pass kPass, computed
/// here once for the chunk (whole rows of one matrix: one set of columns) into the floats
/// after its column sums (exec/plan.cpp), and its column sums slot-major there too.
template <int kPass>
static inline fo_rcx fo_rc_chunk_base(const fo_launch* L, long long c, const fo_chunk& chunk,
                                      const fo_uniform& u, const fo_tvals& tv) {
  const long long R = fo_rows_of(*L, chunk.tensor), C = fo_cols_of(*L, chunk.tensor);
  fo_rcx X0 = fo_rc_base(*L, chunk.tensor);
  const long long b = R * C > 0 ? chunk.begin / (R * C) : 0;  // the chunk's matrix
  fo_rcx Xb = X0;
  Xb.mat += b;
  Xb.row += b * R;
  float* cv = (float*)(L->col_partials + L->chunk_cols[c] + C * FO_NUM_COL_SLOTS);
#pragma omp simd
  for (long long cc = 0; cc < C; ++cc)
    fo_col_values<kPass>(Xb, X0.col + b * C + cc, u, tv, cv + cc, C);
  X0.cv = cv;
  X0.cvs = C;
  X0.cv0 = X0.col + b * C;
  return X0;
}

/// Tensor t's column means of pass `pass` for its columns [k0, k1): fo_rc_col_means's sums
/// in the same order (each column's partials in chunk order, from 0), so the same bits, but
/// a chunk's partials at a time over the columns (contiguous reads) into the totals.
static void fo_rc_col_range(const fo_launch* L, int pass, long long t, long long k0, long long k1) {
  const long long R = fo_rows_of(*L, t), C = fo_cols_of(*L, t), Rw = fo_whole_rows_of(*L, t);
  const long long* o = L->rc_offsets;
  const long long cols = o[3 * t + 4] - o[3 * t + 1];
  const long long c0 = L->tensor_chunks[2 * t], n = L->tensor_chunks[2 * t + 1];
  const long long per = C > 0 && cols >= C ? n / (cols / C) : 0;  // chunks per matrix
  for (int s = 0; s < FO_NUM_COL_SLOTS; ++s) {
    if (fo_col_slot_pass(s) != pass) continue;
    double* tot = L->col_totals + o[3 * t + 1] * FO_NUM_COL_SLOTS + s;  // [k * FO_NUM_COL_SLOTS]
    for (long long k = k0; k < k1;) {
      const long long b = k / C, e = k1 < (b + 1) * C ? k1 : (b + 1) * C;  // in matrix b
      for (long long j = k; j < e; ++j) tot[j * FO_NUM_COL_SLOTS] = 0.0;
      for (long long ch = c0 + b * per; ch < c0 + (b + 1) * per && R > 0; ++ch) {
        const double* p = L->col_partials + L->chunk_cols[ch] + s * C;  // column j - b * C
#pragma omp simd
        for (long long j = k; j < e; ++j) tot[j * FO_NUM_COL_SLOTS] += p[j - b * C];
      }
      for (long long j = k; j < e; ++j)
        tot[j * FO_NUM_COL_SLOTS] = Rw > 0 ? tot[j * FO_NUM_COL_SLOTS] / Rw : 0.0;
      k = e;
    }
  }
}

/// X0 (fo_rc_chunk_base) at row r of its tensor, with the row's values of pass kPass in rv.
template <int kPass>
static inline fo_rcx fo_rc_row(const fo_rcx& X0, long long r, long long R, const fo_uniform& u,
                               const fo_tvals& tv, float* rv) {
  fo_rcx X = X0;
  X.row += r;
  X.mat += r / R;
  fo_row_values<kPass>(X, X.col, u, tv, rv, 1);
  X.rv = rv;
  return X;
}
#endif

#include "host_quant.hpp"

template <bool kInit>
static void fo_run(const fo_launch* L) {
  if (!kInit && fo_launch_skipped(L)) return;
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
  // One chunk (a small launch) runs on the calling thread: waking a thread team would cost
  // more than the work.
#pragma omp parallel if (L->num_chunks > 1)
  {
    int group = -1;
    fo_uniform U;
#pragma omp for schedule(static)
    for (long long c = 0; c < L->num_chunks; ++c) {
      const fo_chunk chunk = L->chunks[c];
      if (chunk.group != group) {
        U = fo_prepare(L->hypers + (long long)chunk.group * FO_NUM_HYPERS, step, inv_grad_scale,
                       L->global_totals);
        U.seed = L->seed;
        group = chunk.group;
      }
      const fo_tensor t = fo_bind_tensor(L, chunk.tensor);
      const fo_uniform u = U;  // a local copy: provably not aliased by the tensor stores
      const fo_tvals tv = fo_chunk_values(L, chunk.tensor, chunk.group, step, 0);
      const long long end = chunk.end;
#if FO_NUM_QUANT > 0
      fo_q_chunk<kInit>(L, c, chunk, t, u, tv);
      continue;
#endif
      if (kInit) {
        for (long long i = chunk.begin; i < end; ++i) fo_init_element(t, i, u);
      } else {
#if FO_FACTORED
        const long long R = fo_rows_of(*L, chunk.tensor), C = fo_cols_of(*L, chunk.tensor);
        const fo_rcx X0 = fo_rc_chunk_base<FO_REDUCTION_PASSES>(L, c, chunk, u, tv);
        float rv[FO_NUM_ROWV];
        for (long long r = chunk.begin / C; r < end / C; ++r) {
          const fo_rcx X = fo_rc_row<FO_REDUCTION_PASSES>(X0, r, R, u, tv, rv);
          const long long c0 = X0.col + (r / R) * C;
#pragma omp simd
          for (long long cc = 0; cc < C; ++cc) fo_element_rc(t, r * C + cc, u, tv, X, c0 + cc);
        }
#else
#pragma omp simd
        for (long long i = chunk.begin; i < end; ++i) fo_element(t, i, u, tv);
#endif
      }
    }
  }
}

#include "host_reduce.hpp"

/// 1 when every gradient element of the chunk table, unscaled, is finite; else 0. Runs
/// before a step with grad scaling so a non-finite step can change nothing.
FO_EXTERN_C int fusedopt_check_host(const fo_launch* L) {
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
  int all_finite = 1;
#pragma omp parallel for schedule(static) reduction(& : all_finite) if (L->num_chunks > 1)
  for (long long c = 0; c < L->num_chunks; ++c) {
    const fo_chunk chunk = L->chunks[c];
    fo_uniform U;
    U.step = (float)step;
    U.inv_grad_scale = inv_grad_scale;
    const fo_tensor t = fo_bind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES);
    int ok = 1;
    for (long long i = chunk.begin; i < chunk.end; ++i) ok &= (int)fo_grad_finite(t, i, U);
    all_finite &= ok;
  }
  return all_finite;
}

/// Per-tensor scalar states: with `init`, every tensor's initial values; else each tensor's
/// values after the step (after its last pass: the same function the passes read them
/// through), for every tensor, empty ones included.
FO_EXTERN_C void fusedopt_scalars_host(const fo_launch* L, int init) {
  if (!init && fo_launch_skipped(L)) return;
  const double step = fo_launch_step(L);
#if FO_FACTORED
  {  // first: the row values read the scalars as the step did
    const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
    for (long long t = 0; t < L->num_tensors; ++t)
      fo_rc_write(*L, t, init, step, inv_grad_scale, 0, 1);
  }
#endif
  for (long long t = 0; t < L->num_tensors && FO_NUM_SCALARS > 0; ++t) {
    double* S = L->scalars + t * FO_NUM_SCALARS;
    const int group = L->tensor_groups[t];
    if (init) {
      fo_scalar_init(L->hypers + (long long)group * FO_NUM_HYPERS, S);
    } else {
      (void)fo_chunk_values(L, (int)t, group, step, S);
    }
  }
}

FO_EXTERN_C int fusedopt_abi_version() { return FO_ABI_VERSION; }
/// Reduction passes before the update (0: an element-wise rule).
FO_EXTERN_C int fusedopt_reduction_passes() { return FO_REDUCTION_PASSES; }
/// One optimizer step over the chunk table.
FO_EXTERN_C void fusedopt_step_host(const fo_launch* L) { fo_run<false>(L); }
/// Writes every state tensor's initial value.
FO_EXTERN_C void fusedopt_init_host(const fo_launch* L) { fo_run<true>(L); }
