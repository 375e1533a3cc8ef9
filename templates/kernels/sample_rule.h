// A hand-written stand-in for generated code (SGD with weight decay, the step scaled by the
// param's norm), so that the kernel
// skeletons compile on their own: tests compile each skeleton with this file.
#ifndef FUSEDOPT_SAMPLE_RULE_H
#define FUSEDOPT_SAMPLE_RULE_H
#define FO_NUM_ROLES 2
#define FO_NUM_HYPERS 2
#define FO_REDUCTION_PASSES 1
#define FO_REDUCE_DISPATCH(L, pass) \
  switch (pass) {                   \
    case 0:                         \
      fo_reduce_run<0>(L);          \
      break;                        \
    default:                        \
      break;                        \
  }
#define FO_REDUCE_KERNELS(X) X(0)
#define FO_NUM_TENSOR_SLOTS 1
#define FO_NUM_GLOBAL_SLOTS 2
#define FO_MAX_ACC 2
#define FO_NUM_SCALARS 0
struct fo_uniform {
  float h[FO_NUM_HYPERS];
  float step;
  float inv_grad_scale;
  float g[FO_NUM_GLOBAL_SLOTS];
  float u[1];
  unsigned int rstep;
  unsigned long long seed;
};
struct fo_tvals {
  float v[FO_NUM_TENSOR_SLOTS];
};
// One reduction pass: the param's norm per tensor (accumulator 0), then the grad check.
FO_FN int fo_acc_count(int pass) { return pass == 0 ? 2 : 0; }
FO_FN int fo_acc_max(int pass, int j) { return pass == 0 && j == 1 ? 1 : 0; }
FO_FN int fo_acc_slot(int pass, int j) { return pass == 0 && j == 1 ? -2 : 0; }
struct fo_tensor {
  float* FO_RESTRICT r0;
  const float* FO_RESTRICT r1;
  long long e0;
  unsigned int pid;
};
FO_FN fo_tensor fo_bind(void* const* p) {
  fo_tensor t;
  t.e0 = 0;
  t.pid = 0;
  t.r0 = (float*)p[0];
  t.r1 = (const float*)p[1];
  return t;
}
FO_FN fo_uniform fo_prepare(const double* h, double step, float inv_grad_scale, const double* G) {
  fo_uniform U;
  for (int k = 0; k < FO_NUM_HYPERS; ++k) U.h[k] = (float)h[k];
  U.step = (float)step;
  U.inv_grad_scale = inv_grad_scale;
  U.rstep = (unsigned int)step;
  U.seed = 0;
  U.u[0] = (float)(h[0] * h[1]);  // uniform values in double, rounded once
  U.g[0] = 0.0f;
  U.g[1] = G ? (float)G[1] : 0.0f;
  return U;
}
FO_FN void fo_tensor_values(const double* R, const double* S, const double* h, double step,
                            const double* G, const double* I, fo_tvals& T, double* S_out) {
  (void)S, (void)h, (void)step, (void)G, (void)I, (void)S_out;
  T.v[0] = R ? (float)fo_sqrt_d(R[0]) : 0.0f;
}
FO_FN void fo_scalar_init(const double*, double*) {}
template <int kPass>
FO_FN void fo_reduce_element(const fo_tensor&, long long, const fo_uniform&, const fo_tvals&,
                             float*, int, bool) {}
template <>
FO_FN void fo_reduce_element<0>(const fo_tensor& t, long long i, const fo_uniform& U,
                                const fo_tvals&, float* a, int stride, bool check) {
  const float p = fo_load(t.r0, i);
  a[0] += p * p;
  if (check)
    a[stride] = fo_max(a[stride], fo_isfinite(fo_load(t.r1, i) * U.inv_grad_scale) ? 0.0f : 1.0f);
}
FO_FN void fo_element(const fo_tensor& t, long long i, const fo_uniform& U, const fo_tvals& T) {
  float p = fo_load(t.r0, i);
  float g = fo_load(t.r1, i) * U.inv_grad_scale;
  p = p - U.h[0] * g * T.v[0] - U.u[0] * p;
  fo_store(t.r0, i, p);
}
FO_FN bool fo_grad_finite(const fo_tensor& t, long long i, const fo_uniform& U) {
  return fo_isfinite(fo_load(t.r1, i) * U.inv_grad_scale);
}
FO_FN void fo_init_element(const fo_tensor&, long long, const fo_uniform&) {}
// What codegen's staging_macros would read from the two functions above.
#define FO_UPDATE_STAGE(LOAD, DECL) LOAD(0) LOAD(1)
#define FO_UPDATE_STORES(STORE) STORE(0)
#define FO_INIT_STAGE(LOAD, DECL)
#define FO_INIT_STORES(STORE)
#define FO_REDUCE0_STAGE(LOAD, DECL) LOAD(0) LOAD(1)
#define FO_REDUCE0_STORES(STORE)
#endif
