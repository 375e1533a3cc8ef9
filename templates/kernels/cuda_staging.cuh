// The CUDA skeleton's register staging (cuda_kernel.cuh includes it; generated sources paste
// it there): the vector path's 4-element loads and stores of each role a pass reads and
// writes, and the scalar path's 1-element ones, around the generated element functions.
// Not a header of its own: it needs abi.h, prelude.h and the generated part before it.
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

// Staging moves kN elements (4: the vector path, 1: the scalar path for tails and
// misaligned tensors) of each role through registers. fo_width<kN> picks the width.
template <int kN>
struct fo_width {};
template <typename T>
struct fo_vec1 {
  T v[1];
};

// Role data lives in global memory, but the pointers come from a table, so the compiler
// would emit generic loads (LD.E): these say global in PTX. Loads do not allocate in L1 (the
// data is streamed once per step; L2 still holds it), which also marks them in the SASS
// (LDG.E.NA) for tests/cuda/test_sass.cpp. volatile keeps the order of a thread's own
// accesses (the store of a role after its load).
#if FO_PTX
/// Elements [i, i+4) of p in one load; p + i must be aligned to sizeof(fo_vec4<T>).
FO_FN fo_vec4<float> fo_load_n(fo_width<4>, const float* p, long long i) {
  fo_vec4<float> r;
  asm volatile("ld.global.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
               : "=f"(r.v[0]), "=f"(r.v[1]), "=f"(r.v[2]), "=f"(r.v[3])
               : "l"(p + i));
  return r;
}
/// The 4 16-bit elements of a 16-bit role in one 8-byte load (element 0 in the low half).
template <typename T>
FO_FN fo_vec4<T> fo_load_n(fo_width<4>, const T* p, long long i) {
  unsigned int a, b;
  asm volatile("ld.global.L1::no_allocate.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p + i));
  fo_vec4<T> r;
  r.v[0].bits = (unsigned short)(a & 0xffffu);
  r.v[1].bits = (unsigned short)(a >> 16);
  r.v[2].bits = (unsigned short)(b & 0xffffu);
  r.v[3].bits = (unsigned short)(b >> 16);
  return r;
}
FO_FN fo_vec1<float> fo_load_n(fo_width<1>, const float* p, long long i) {
  fo_vec1<float> r;
  asm volatile("ld.global.L1::no_allocate.f32 %0, [%1];" : "=f"(r.v[0]) : "l"(p + i));
  return r;
}
template <typename T>
FO_FN fo_vec1<T> fo_load_n(fo_width<1>, const T* p, long long i) {
  unsigned short h;
  asm volatile("ld.global.L1::no_allocate.u16 %0, [%1];" : "=h"(h) : "l"(p + i));
  fo_vec1<T> r;
  r.v[0].bits = h;
  return r;
}
/// Writes the staged elements of a writable role back, in one store.
FO_FN void fo_store_n(float* p, long long i, const fo_vec4<float>& s) {
  asm volatile("st.global.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p + i), "f"(s.v[0]), "f"(s.v[1]),
               "f"(s.v[2]), "f"(s.v[3]));
}
template <typename T>
FO_FN void fo_store_n(T* p, long long i, const fo_vec4<T>& s) {
  const unsigned int a = (unsigned int)s.v[0].bits | ((unsigned int)s.v[1].bits << 16);
  const unsigned int b = (unsigned int)s.v[2].bits | ((unsigned int)s.v[3].bits << 16);
  asm volatile("st.global.v2.u32 [%0], {%1, %2};" ::"l"(p + i), "r"(a), "r"(b));
}
FO_FN void fo_store_n(float* p, long long i, const fo_vec1<float>& s) {
  asm volatile("st.global.f32 [%0], %1;" ::"l"(p + i), "f"(s.v[0]));
}
template <typename T>
FO_FN void fo_store_n(T* p, long long i, const fo_vec1<T>& s) {
  asm volatile("st.global.u16 [%0], %1;" ::"l"(p + i), "h"(s.v[0].bits));
}
#else
// The portable forms (the CUDA emulator, cuda_emu.h): the same accesses as plain loads and
// stores of the staging types. FO_VECTOR_ACCESS(address, bytes, write) lets the emulator
// check what the GPU requires of a vector access (an address aligned to its size) and
// record it as the one access the GPU makes.
#ifndef FO_VECTOR_ACCESS
#define FO_VECTOR_ACCESS(address, bytes, write)
#endif
template <typename T>
FO_FN fo_vec4<T> fo_load_n(fo_width<4>, const T* p, long long i) {
  FO_VECTOR_ACCESS(p + i, sizeof(fo_vec4<T>), 0);
  return *(const fo_vec4<T>*)(p + i);
}
template <typename T>
FO_FN fo_vec1<T> fo_load_n(fo_width<1>, const T* p, long long i) {
  fo_vec1<T> r;
  r.v[0] = p[i];
  return r;
}
template <typename T>
FO_FN void fo_store_n(T* p, long long i, const fo_vec4<T>& s) {
  FO_VECTOR_ACCESS(p + i, sizeof(fo_vec4<T>), 1);
  *(fo_vec4<T>*)(p + i) = s;
}
template <typename T>
FO_FN void fo_store_n(T* p, long long i, const fo_vec1<T>& s) {
  p[i] = s.v[0];
}
#endif
/// An unloaded staging copy for a role the pass only writes.
template <typename T>
FO_FN fo_vec4<T> fo_empty_n(fo_width<4>, const T*) {
  return fo_vec4<T>{};
}
template <typename T>
FO_FN fo_vec1<T> fo_empty_n(fo_width<1>, const T*) {
  return fo_vec1<T>{};
}
/// Read-only roles (the gradient) are never written back.
template <typename T, typename V>
FO_FN void fo_store_n(const T*, long long, const V&) {}

// The generated FO_UPDATE_STAGE(LOAD, DECL) names each role fo_element loads (LOAD) and
// each it only stores (DECL); FO_UPDATE_STORES(STORE) each role it stores; the same for
// fo_init_element (FO_INIT_*) and each reduction pass (FO_REDUCE<k>_*). They are read from
// the generated functions' code, so both paths move exactly the roles a pass reads and
// writes. The macros expect t (the tensor), s (its staged copy), i and kN in scope.
#define FO_STAGE_LOAD(k)                               \
  auto fo_s##k = fo_load_n(fo_width<kN>(), t.r##k, i); \
  s.r##k = fo_s##k.v;
#define FO_STAGE_DECL(k)                             \
  auto fo_s##k = fo_empty_n(fo_width<kN>(), t.r##k); \
  s.r##k = fo_s##k.v;
#define FO_STAGE_STORE(k) fo_store_n(t.r##k, i, fo_s##k);

/// Elements [i, i+kN) of tensor t through registers. kN = 4: i is a multiple of 4 and
/// every role pointer of t is aligned to 4 of its elements (the caller checked both).
template <bool kInit, int kN>
__device__ __forceinline__ void fo_element_n(const fo_tensor& t, long long i, const fo_uniform& U,
                                             const fo_tvals& T) {
  fo_tensor s = t;  // the same roles; the staged ones point at the register copies
  s.e0 = t.e0 + i;  // element j of s is element i + j of t
  if (kInit) {
    FO_INIT_STAGE(FO_STAGE_LOAD, FO_STAGE_DECL)
#pragma unroll
    for (int j = 0; j < kN; ++j) fo_init_element(s, j, U);
    FO_INIT_STORES(FO_STAGE_STORE)
  } else {
#if !FO_FACTORED  // factored rules update one element at a time (fo_run)
    FO_UPDATE_STAGE(FO_STAGE_LOAD, FO_STAGE_DECL)
#pragma unroll
    for (int j = 0; j < kN; ++j) fo_element(s, j, U, T);
    FO_UPDATE_STORES(FO_STAGE_STORE)
#endif
  }
  (void)T;
}
