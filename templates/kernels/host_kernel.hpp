// Host skeleton: one call runs the rule over every tensor of the step. OpenMP splits the
// chunk table statically across cores (the same split every run); the inner loop is a
// plain counted loop the compiler vectorises. Uniform values are computed once per thread
// and group, never per element.
// The generated part (fo_uniform, fo_tensor, fo_bind, fo_prepare, fo_element,
// fo_init_element, FO_NUM_ROLES, FO_NUM_HYPERS) comes before this file.
#ifndef FO_GENERATED
#include "prelude.h"
#include "abi.h"
#include "sample_rule.h"
#endif

template <bool kInit>
static void fo_run(const fo_launch* L) {
  const float step = L->step_ptr ? *L->step_ptr : L->step;
  const float inv_grad_scale = L->inv_grad_scale_ptr ? *L->inv_grad_scale_ptr : L->inv_grad_scale;
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
        U = fo_prepare(L->hypers + (long long)chunk.group * FO_NUM_HYPERS, step, inv_grad_scale);
        group = chunk.group;
      }
      const fo_tensor t = fo_bind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES);
      const fo_uniform u = U;  // a local copy: provably not aliased by the tensor stores
      const long long end = chunk.end;
      if (kInit) {
        for (long long i = chunk.begin; i < end; ++i) fo_init_element(t, i, u);
      } else {
#pragma omp simd
        for (long long i = chunk.begin; i < end; ++i) fo_element(t, i, u);
      }
    }
  }
}

/// 1 when every gradient element of the chunk table, unscaled, is finite; else 0. Runs
/// before a step with grad scaling so a non-finite step can change nothing.
FO_EXTERN_C int fusedopt_check_host(const fo_launch* L) {
  const float step = L->step_ptr ? *L->step_ptr : L->step;
  const float inv_grad_scale = L->inv_grad_scale_ptr ? *L->inv_grad_scale_ptr : L->inv_grad_scale;
  int all_finite = 1;
#pragma omp parallel for schedule(static) reduction(& : all_finite) if (L->num_chunks > 1)
  for (long long c = 0; c < L->num_chunks; ++c) {
    const fo_chunk chunk = L->chunks[c];
    fo_uniform U;
    U.step = step;
    U.inv_grad_scale = inv_grad_scale;
    const fo_tensor t = fo_bind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES);
    int ok = 1;
    for (long long i = chunk.begin; i < chunk.end; ++i) ok &= (int)fo_grad_finite(t, i, U);
    all_finite &= ok;
  }
  return all_finite;
}

FO_EXTERN_C int fusedopt_abi_version() { return FO_ABI_VERSION; }
/// One optimizer step over the chunk table.
FO_EXTERN_C void fusedopt_step_host(const fo_launch* L) { fo_run<false>(L); }
/// Writes every state tensor's initial value.
FO_EXTERN_C void fusedopt_init_host(const fo_launch* L) { fo_run<true>(L); }
