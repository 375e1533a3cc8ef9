// fusedopt kernel prelude: math and fp16/bf16 conversions for generated kernels, with no
// toolkit or standard headers (NVRTC compiles faster without them, and a GPU machine that
// has only the NVRTC library still works). Valid as host C++17 and as NVRTC CUDA C++.
#ifndef FUSEDOPT_PRELUDE_H
#define FUSEDOPT_PRELUDE_H

#if defined(__CUDACC__)
#define FO_DEVICE_CODE 1
#define FO_FN __device__ __forceinline__
#define FO_FN_NOINLINE __device__ __noinline__
#define FO_RESTRICT __restrict__
#define FO_EXTERN_C extern "C"
FO_FN float fo_as_float(unsigned int u) { return __uint_as_float(u); }
FO_FN unsigned int fo_as_uint(float f) { return __float_as_uint(f); }
FO_FN float fo_sqrt(float x) { return sqrtf(x); }
FO_FN float fo_rsqrt(float x) { return rsqrtf(x); }
FO_FN float fo_exp(float x) { return expf(x); }
FO_FN float fo_log(float x) { return logf(x); }
FO_FN float fo_pow(float a, float b) { return powf(a, b); }
FO_FN float fo_tanh(float x) { return tanhf(x); }
FO_FN float fo_log1p(float x) { return log1pf(x); }
FO_FN float fo_expm1(float x) { return expm1f(x); }
FO_FN float fo_floor(float x) { return floorf(x); }
// a % b as torch.remainder and Python: the sign of b (a NaN for b == 0).
FO_FN float fo_mod(float a, float b) { return a - b * floorf(a / b); }
FO_FN float fo_fma(float a, float b, float c) { return fmaf(a, b, c); }
FO_FN float fo_abs(float x) { return fabsf(x); }
FO_FN float fo_min(float a, float b) { return fminf(a, b); }
FO_FN float fo_max(float a, float b) { return fmaxf(a, b); }
FO_FN bool fo_isfinite(float x) { return isfinite(x); }
/// A select on a uniform condition (every thread takes the same arm).
FO_FN float fo_usel(bool c, float a, float b) { return c ? a : b; }
FO_FN double fo_sqrt_d(double x) { return sqrt(x); }
// Double overloads: fo_prepare computes uniform values (hypers, step) in double.
FO_FN double fo_sqrt(double x) { return sqrt(x); }
FO_FN double fo_rsqrt(double x) { return rsqrt(x); }
FO_FN double fo_exp(double x) { return exp(x); }
FO_FN double fo_log(double x) { return log(x); }
FO_FN double fo_pow(double a, double b) { return pow(a, b); }
FO_FN double fo_tanh(double x) { return tanh(x); }
FO_FN double fo_log1p(double x) { return log1p(x); }
FO_FN double fo_expm1(double x) { return expm1(x); }
FO_FN double fo_floor(double x) { return floor(x); }
FO_FN double fo_mod(double a, double b) { return a - b * floor(a / b); }
FO_FN double fo_fma(double a, double b, double c) { return fma(a, b, c); }
FO_FN double fo_abs(double x) { return fabs(x); }
FO_FN double fo_min(double a, double b) { return fmin(a, b); }
FO_FN double fo_max(double a, double b) { return fmax(a, b); }
FO_FN bool fo_isfinite(double x) { return isfinite(x); }
#else
// Not static: FO_FN also marks member functions (trusted functors). -fvisibility=hidden
// keeps these out of the shared object's exports.
#define FO_FN inline __attribute__((always_inline))
#define FO_FN_NOINLINE __attribute__((noinline))
#define FO_RESTRICT __restrict__
#define FO_EXTERN_C extern "C" __attribute__((visibility("default")))
FO_FN float fo_as_float(unsigned int u) { return __builtin_bit_cast(float, u); }
FO_FN unsigned int fo_as_uint(float f) { return __builtin_bit_cast(unsigned int, f); }
FO_FN float fo_sqrt(float x) { return __builtin_sqrtf(x); }
FO_FN float fo_rsqrt(float x) { return 1.0f / __builtin_sqrtf(x); }
FO_FN float fo_exp(float x) { return __builtin_expf(x); }
FO_FN float fo_log(float x) { return __builtin_logf(x); }
FO_FN float fo_pow(float a, float b) { return __builtin_powf(a, b); }
FO_FN float fo_tanh(float x) { return __builtin_tanhf(x); }
FO_FN float fo_log1p(float x) { return __builtin_log1pf(x); }
FO_FN float fo_expm1(float x) { return __builtin_expm1f(x); }
FO_FN float fo_floor(float x) { return __builtin_floorf(x); }
// a % b as torch.remainder and Python: the sign of b (a NaN for b == 0).
FO_FN float fo_mod(float a, float b) { return a - b * __builtin_floorf(a / b); }
FO_FN float fo_fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
FO_FN float fo_abs(float x) { return __builtin_fabsf(x); }
// fminf/fmaxf as selects (a NaN operand yields the other one, as fminf/fmaxf): g++
// vectorises these where it keeps the libm calls scalar (x86 min/max instructions differ
// from fmaxf on NaN), which left max/clamp rules (AMSGrad, Rprop) several times off the
// copy floor.
FO_FN float fo_min(float a, float b) { return (b != b || a < b) ? a : b; }
FO_FN float fo_max(float a, float b) { return (b != b || a > b) ? a : b; }
/// A select on a uniform (loop-invariant) condition, as a blend of the two values' bits:
/// g++ vectorises it, where a ?: on such a truth value nested in another select stays
/// scalar (it needs a vector mask). Exactly a or b.
FO_FN float fo_usel(bool c, float a, float b) {
  const unsigned int m = 0u - (unsigned int)c;
  return fo_as_float((fo_as_uint(a) & m) | (fo_as_uint(b) & ~m));
}
FO_FN bool fo_isfinite(float x) { return __builtin_isfinite(x); }
FO_FN double fo_sqrt_d(double x) { return __builtin_sqrt(x); }
// Double overloads: fo_prepare computes uniform values (hypers, step) in double.
FO_FN double fo_sqrt(double x) { return __builtin_sqrt(x); }
FO_FN double fo_rsqrt(double x) { return 1.0 / __builtin_sqrt(x); }
FO_FN double fo_exp(double x) { return __builtin_exp(x); }
FO_FN double fo_log(double x) { return __builtin_log(x); }
FO_FN double fo_pow(double a, double b) { return __builtin_pow(a, b); }
FO_FN double fo_tanh(double x) { return __builtin_tanh(x); }
FO_FN double fo_log1p(double x) { return __builtin_log1p(x); }
FO_FN double fo_expm1(double x) { return __builtin_expm1(x); }
FO_FN double fo_floor(double x) { return __builtin_floor(x); }
FO_FN double fo_mod(double a, double b) { return a - b * __builtin_floor(a / b); }
FO_FN double fo_fma(double a, double b, double c) { return __builtin_fma(a, b, c); }
FO_FN double fo_abs(double x) { return __builtin_fabs(x); }
FO_FN double fo_min(double a, double b) { return __builtin_fmin(a, b); }
FO_FN double fo_max(double a, double b) { return __builtin_fmax(a, b); }
FO_FN bool fo_isfinite(double x) { return __builtin_isfinite(x); }
#endif

// FO_PTX: compiled by NVRTC for a GPU, so inline PTX is available. The CUDA emulator
// (cuda_emu.h, FO_EMU) compiles the same CUDA source with the host compiler: it takes the
// portable forms below and in the skeleton instead, the only places its code differs.
#if defined(__CUDACC__) && !defined(FO_EMU)
#define FO_PTX 1
#else
#define FO_PTX 0
#endif

#if FO_PTX
// Hardware conversions, round to nearest even.
FO_FN float fo_f16_to_f32(unsigned short h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
FO_FN unsigned short fo_f32_to_f16(float f) {
  unsigned short h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
#else
// Software conversions, round to nearest even (same results as the GPU's cvt.rn).
FO_FN float fo_f16_to_f32(unsigned short h) {
  unsigned int sign = (unsigned int)(h & 0x8000u) << 16;
  unsigned int exponent = (h >> 10) & 0x1fu;
  unsigned int mantissa = h & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    return fo_as_float(sign | fo_as_uint((float)mantissa * 5.9604644775390625e-8f));
  }
  if (exponent == 31) return fo_as_float(sign | 0x7f800000u | (mantissa << 13));
  return fo_as_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}
FO_FN unsigned short fo_f32_to_f16(float f) {
  unsigned int u = fo_as_uint(f);
  unsigned int sign = (u >> 16) & 0x8000u;
  unsigned int a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return (unsigned short)(sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u));
  if (a >= 0x477ff000u) return (unsigned short)(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (a < 0x38800000u) {
    // Below 2^-14 the result is subnormal: adding 0.5f lines the fp16 ulp up with the fp32
    // ulp, so the fp32 adder does the round-to-nearest-even for us.
    float t = fo_as_float(a) + 0.5f;
    return (unsigned short)(sign | (fo_as_uint(t) - 0x3f000000u));
  }
  unsigned int odd = (a >> 13) & 1u;
  a += 0xc8000fffu + odd;  // re-bias the exponent (127 -> 15) and round half to even
  return (unsigned short)(sign | (a >> 13));
}
#endif

FO_FN float fo_sign(float x) { return (float)(x > 0.0f) - (float)(x < 0.0f); }
FO_FN float fo_clamp(float x, float lo, float hi) { return fo_min(fo_max(x, lo), hi); }
FO_FN float fo_bool(bool b) { return b ? 1.0f : 0.0f; }
FO_FN float fo_sq(float x) { return x * x; }
/// torch.lerp: a + w (b - a) for |w| < 0.5, else b - (b - a)(1 - w), each as one fused
/// multiply-add as torch's vectorised CPU kernel and its CUDA kernel compute them.
FO_FN float fo_lerp(float a, float b, float w) {
  const float d = b - a;
  return fo_abs(w) < 0.5f ? fo_fma(w, d, a) : fo_fma(w - 1.0f, d, b);
}
FO_FN double fo_lerp(double a, double b, double w) {
  const double d = b - a;
  return fo_abs(w) < 0.5 ? fo_fma(w, d, a) : fo_fma(w - 1.0, d, b);
}
FO_FN float fo_inf() { return fo_as_float(0x7f800000u); }
FO_FN double fo_sign(double x) { return (double)(x > 0.0) - (double)(x < 0.0); }
FO_FN double fo_clamp(double x, double lo, double hi) { return fo_min(fo_max(x, lo), hi); }
FO_FN double fo_bool_d(bool b) { return b ? 1.0 : 0.0; }
FO_FN double fo_sq(double x) { return x * x; }
FO_FN double fo_inf_d() { return (double)fo_inf(); }
/// max that lets NaN win (a NaN anywhere in a max reduction shows in its result).
FO_FN float fo_maxnan(float a, float b) { return (b > a || b != b) ? b : a; }
FO_FN double fo_maxnan_d(double a, double b) { return (b > a || b != b) ? b : a; }

FO_FN float fo_bf16_to_f32(unsigned short h) { return fo_as_float((unsigned int)h << 16); }
FO_FN unsigned short fo_f32_to_bf16(float f) {
  unsigned int u = fo_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round half to even
  return (unsigned short)(u >> 16);
}

// Storage types: loads widen to fp32, stores round to nearest even.
struct fo_f16 {
  unsigned short bits;
};
struct fo_bf16 {
  unsigned short bits;
};
FO_FN float fo_load(const float* p, long long i) { return p[i]; }
FO_FN float fo_load(const fo_f16* p, long long i) { return fo_f16_to_f32(p[i].bits); }
FO_FN float fo_load(const fo_bf16* p, long long i) { return fo_bf16_to_f32(p[i].bits); }
FO_FN void fo_store(float* p, long long i, float v) { p[i] = v; }
FO_FN void fo_store(fo_f16* p, long long i, float v) { p[i].bits = fo_f32_to_f16(v); }
FO_FN void fo_store(fo_bf16* p, long long i, float v) { p[i].bits = fo_f32_to_bf16(v); }

// ---- counter-based random numbers (Philox4x32-10, Salmon et al., SC'11) -------------------
// A value depends only on its key and counter, never on threads, chunks or memory: fusedopt
// keys it on (seed) and counts (element index within the param, param index, step), so a run
// gives the same bits on any thread count, layout or sharding.
struct fo_rand4 {
  unsigned int x[4];
};
FO_FN unsigned int fo_mulhi32(unsigned int a, unsigned int b) {
  return (unsigned int)(((unsigned long long)a * b) >> 32);
}
FO_FN fo_rand4 fo_philox(unsigned int c0, unsigned int c1, unsigned int c2, unsigned int c3,
                         unsigned int k0, unsigned int k1) {
  for (int round = 0; round < 10; ++round) {
    const unsigned int h0 = fo_mulhi32(0xD2511F53u, c0), l0 = 0xD2511F53u * c0;
    const unsigned int h1 = fo_mulhi32(0xCD9E8D57u, c2), l1 = 0xCD9E8D57u * c2;
    const unsigned int n0 = h1 ^ c1 ^ k0, n2 = h0 ^ c3 ^ k1;
    c0 = n0;
    c1 = l1;
    c2 = n2;
    c3 = l0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  fo_rand4 r;
  r.x[0] = c0;
  r.x[1] = c1;
  r.x[2] = c2;
  r.x[3] = c3;
  return r;
}
/// The random words of element `e` of param `param` at `step` under `seed`: word 0 rounds the
/// param's store stochastically, word 1 is the rule's rand().
FO_FN fo_rand4 fo_element_rand(unsigned long long seed, unsigned int step, unsigned int param,
                               long long e) {
  return fo_philox((unsigned int)(unsigned long long)e, (unsigned int)((unsigned long long)e >> 32),
                   param, step, (unsigned int)seed, (unsigned int)(seed >> 32));
}
/// A uniform float in [0, 1) from 24 random bits.
FO_FN float fo_unit(unsigned int r) { return (float)(r >> 8) * 5.9604644775390625e-8f; }

/// fp32 to bf16, rounded stochastically with the random word r: up (in magnitude) with
/// probability (the dropped 16 bits) / 2^16, so the expected result is f. NaN and infinities
/// as round-to-nearest; a value past bf16's largest may become infinite.
FO_FN unsigned short fo_f32_to_bf16_sr(float f, unsigned int r) {
  const unsigned int u = fo_as_uint(f);
  if ((u & 0x7f800000u) == 0x7f800000u) return fo_f32_to_bf16(f);
  return (unsigned short)((u + (r >> 16)) >> 16);
}
/// fp32 to fp16, rounded stochastically: the bits below fp16's last place (13 in fp16's
/// normal range, more among its subnormals) get a random addend and are dropped; below
/// fp16's smallest subnormal, 0 or 2^-24 with the probability that keeps the mean.
FO_FN unsigned short fo_f32_to_f16_sr(float f, unsigned int r) {
  const unsigned int u = fo_as_uint(f);
  const unsigned int e = (u >> 23) & 255u;
  if (e == 255u) return fo_f32_to_f16(f);
  if (e <= 102u) {                            // |f| < 2^-24
    const float a = fo_abs(f) * 16777216.0f;  // exact: a power of two
    const unsigned short up = fo_unit(r) < a ? (unsigned short)1 : (unsigned short)0;
    return (unsigned short)(((u >> 16) & 0x8000u) | up);
  }
  const unsigned int shift = e >= 113u ? 13u : 126u - e;
  const unsigned int mask = (1u << shift) - 1u;
  return fo_f32_to_f16(fo_as_float((u + (r & mask)) & ~mask));  // exact in fp16 now
}
FO_FN void fo_store_sr(float* p, long long i, float v, unsigned int) { p[i] = v; }
FO_FN void fo_store_sr(fo_f16* p, long long i, float v, unsigned int r) {
  p[i].bits = fo_f32_to_f16_sr(v, r);
}
FO_FN void fo_store_sr(fo_bf16* p, long long i, float v, unsigned int r) {
  p[i].bits = fo_f32_to_bf16_sr(v, r);
}

#endif  // FUSEDOPT_PRELUDE_H
