// A hand-written stand-in for generated code (SGD with weight decay), so that the kernel
// skeletons compile on their own: tests compile each skeleton with this file.
#ifndef FUSEDOPT_SAMPLE_RULE_H
#define FUSEDOPT_SAMPLE_RULE_H
#define FO_NUM_ROLES 2
#define FO_NUM_HYPERS 2
struct fo_uniform {
  float h[FO_NUM_HYPERS];
  float step;
  float inv_grad_scale;
  float u[1];
};
struct fo_tensor {
  float* FO_RESTRICT r0;
  const float* FO_RESTRICT r1;
};
FO_FN fo_tensor fo_bind(void* const* p) {
  fo_tensor t;
  t.r0 = (float*)p[0];
  t.r1 = (const float*)p[1];
  return t;
}
FO_FN fo_uniform fo_prepare(const float* h, float step, float inv_grad_scale) {
  fo_uniform U;
  for (int k = 0; k < FO_NUM_HYPERS; ++k) U.h[k] = h[k];
  U.step = step;
  U.inv_grad_scale = inv_grad_scale;
  U.u[0] = U.h[0] * U.h[1];
  return U;
}
FO_FN void fo_element(const fo_tensor& t, long long i, const fo_uniform& U) {
  float p = fo_load(t.r0, i);
  float g = fo_load(t.r1, i) * U.inv_grad_scale;
  p = p - U.h[0] * g - U.u[0] * p;
  fo_store(t.r0, i, p);
}
FO_FN bool fo_grad_finite(const fo_tensor& t, long long i, const fo_uniform& U) {
  return fo_isfinite(fo_load(t.r1, i) * U.inv_grad_scale);
}
FO_FN void fo_init_element(const fo_tensor&, long long, const fo_uniform&) {}
#endif
