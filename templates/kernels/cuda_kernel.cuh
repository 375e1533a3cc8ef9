// CUDA skeleton: one launch runs the rule over every tensor of the step. Each block walks
// the chunk table grid-stride; the uniform values (hypers, step, hoisted subexpressions)
// are computed once per block and group, in shared memory, never per element.
// The generated part (fo_uniform, fo_tensor, fo_bind, fo_prepare, fo_element,
// fo_init_element, fo_grad_finite, FO_NUM_ROLES, FO_NUM_HYPERS) comes before this file.
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

#if FO_NUM_QUANT > 0
// ---- quantized states: one element per thread, a block's absmax by a fixed tree --------
// The maps live in shared memory (a code is a data-dependent index: the constant cache
// would serialise a warp's different codes).
#define FO_QMAP_MAX 256
// Elements per thread per iteration of a quantized update: FO_QE slices of FO_BLOCK
// consecutive elements, thread tid taking element tid of each (every access coalesced, as
// with one element per thread), whose absmax trees share one set of barriers: a tree's
// barriers per element and the loads' latency per element are an FO_QE-th of one slice's.
#define FO_QE 8
#define FO_QUANT_MAPS_SHARED                            \
  __shared__ float fo_qmaps[FO_NUM_QUANT][FO_QMAP_MAX]; \
  fo_q_load_maps(fo_qmaps);
#define FO_QUANT_SHARED                                 \
  __shared__ float fo_qred[2 * FO_QE * FO_BLOCK];       \
  __shared__ unsigned char fo_qcodes[FO_QE * FO_BLOCK]; \
  FO_QUANT_MAPS_SHARED

// Codes and absmax in global memory, with global accesses (as the staged roles: the pointers
// come from the tables, so the compiler could only emit generic ones).
#if FO_PTX
FO_FN unsigned int fo_ldg_u8(const unsigned char* p) {
  unsigned short v;
  asm volatile("ld.global.L1::no_allocate.u8 %0, [%1];" : "=h"(v) : "l"(p));
  return v;
}
FO_FN float fo_ldg_f32(const float* p) {
  float v;
  asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
  return v;
}
FO_FN void fo_stg_u8(unsigned char* p, unsigned int v) {
  asm volatile("st.global.u8 [%0], %1;" ::"l"(p), "h"((unsigned short)v));
}
FO_FN void fo_stg_f32(float* p, float v) {
  asm volatile("st.global.f32 [%0], %1;" ::"l"(p), "f"(v));
}
#else
FO_FN unsigned int fo_ldg_u8(const unsigned char* p) { return *p; }
FO_FN float fo_ldg_f32(const float* p) { return *p; }
FO_FN void fo_stg_u8(unsigned char* p, unsigned int v) { *p = (unsigned char)v; }
FO_FN void fo_stg_f32(float* p, float v) { *p = v; }
#endif

/// Element i's code (fo_q_code's layout), read with a global access.
FO_FN int fo_q_code_g(const unsigned char* codes, int bits, long long i) {
  return bits == 8 ? (int)fo_ldg_u8(codes + i)
                   : (int)((fo_ldg_u8(codes + (i >> 1)) >> ((~i & 1) * 4)) & 15u);
}

/// Copies each quantized state's map into shared memory (every thread, then a barrier).
/// The tables are the module's constants: the emulator, which checks that every access
/// falls in a device allocation, leaves this function's accesses unchecked.
#ifdef FO_EMU
#define FO_QMAP_READER FO_EMU_NOSAN __device__ __noinline__
#else
#define FO_QMAP_READER __device__ __forceinline__
#endif
FO_QMAP_READER void fo_q_load_maps(float (*qmaps)[FO_QMAP_MAX]) {
  for (int j = threadIdx.x; j < FO_QMAP_MAX; j += blockDim.x) {
#define FO_QMAP_COPY(k, role, bits, map, fix, enc, tiny, zero, sr) \
  if (j < (1 << bits)) qmaps[k][j] = map[j];
    FO_QUANT_LIST(FO_QMAP_COPY)
#undef FO_QMAP_COPY
  }
  __syncthreads();
}

/// Word `index` of an encoder table (a module constant, read through the L1 cache).
FO_QMAP_READER unsigned int fo_q_enc_word(const unsigned int* enc, int index) { return enc[index]; }

/// fo_q_encode's code of v in a block of absmax a by one word of the encoder table (the
/// host's way), not the halving search's 8 dependent loads; a block whose absmax is not
/// finite takes the search.
__device__ __forceinline__ int fo_q_encode_fast(const unsigned int* enc, const float* map, int bits,
                                                int fix, float v, float a) {
  if (!(a <= 3.40282347e38f)) return fo_q_encode(map, bits, fix, v, a);
  const unsigned int u = fo_as_uint(v / (a != 0.0f ? a : 1.0f));
  return fo_q_enc_code(u, (int)fo_q_enc_word(enc, fo_q_enc_index(u)));
}

/// Element i's dequantized values (0 where the thread has no element).
__device__ __forceinline__ void fo_q_values(const fo_qtensor& q, long long i, bool live,
                                            float (*qmaps)[FO_QMAP_MAX], float* vals) {
#define FO_QVAL(k, role, bits, map, fix, enc, tiny, zero, sr)       \
  vals[k] = live ? qmaps[k][fo_q_code_g(q.codes[k], bits, i)] *     \
                       fo_ldg_f32(q.absmax[k] + i / FO_QUANT_BLOCK) \
                 : 0.0f;
  FO_QUANT_LIST(FO_QVAL)
#undef FO_QVAL
}

/// Tensor t's roles at element i, the quantized ones pointing at the thread's values.
__device__ __forceinline__ fo_tensor fo_q_view(const fo_tensor& t, long long i, float* vals) {
  fo_tensor s = fo_offset(t, i);
#define FO_QATTACH(k, role, bits, map, fix, enc, tiny, zero, sr) s.r##role = &vals[k];
  FO_QUANT_LIST(FO_QATTACH)
#undef FO_QATTACH
  return s;
}

/// Stores one quantized state's new values v[j] of elements i0 + j * FO_BLOCK (j < FO_QE;
/// those at or past `end` are not the thread's). Every thread of the block calls it. The
/// absmax of each FO_QUANT_BLOCK threads of a slice (one block of elements: chunks and
/// iterations begin at multiples of it) by a fixed tree in shared memory, NaN winning, the
/// FO_QE slices' trees level by level between the same barriers; then the codes (4-bit: the
/// even element's thread writes the byte, its code in the high nibble, its neighbour's from
/// shared memory in the low one). `sr`: 0 for the nearest code, else 1 + the rule's index of
/// the state, whose codes are rounded stochastically with each element's random word (key:
/// element i0's).
__device__ __forceinline__ void fo_q_commit(unsigned char* codes, float* absmax, int bits, int fix,
                                            int sr, const fo_qkey& key, const float* map,
                                            const unsigned int* enc, const float* v, long long i0,
                                            long long end, float* red,
                                            unsigned char* shared_codes) {
  const unsigned tid = threadIdx.x;
  const unsigned lane = tid & (FO_QUANT_BLOCK - 1);
  float* values = red + FO_QE * FO_BLOCK;  // the values themselves, beside their tree
  __syncthreads();  // red and shared_codes are free: the previous state's reads are done
#pragma unroll
  for (int j = 0; j < FO_QE; ++j) {
    red[j * FO_BLOCK + tid] = i0 + (long long)j * FO_BLOCK < end ? fo_abs(v[j]) : 0.0f;
    values[j * FO_BLOCK + tid] = v[j];
  }
  __syncthreads();
  for (unsigned s = FO_QUANT_BLOCK / 2; s > 0; s >>= 1) {
    if (lane < s) {
#pragma unroll
      for (int j = 0; j < FO_QE; ++j) {
        float* r = red + j * FO_BLOCK + tid;
        *r = fo_maxnan(*r, r[s]);
      }
    }
    __syncthreads();
  }
  // Each slice's codes from shared memory, one slice at a time (the values wait there, not
  // in registers, through the tree).
#pragma unroll 1
  for (int j = 0; j < FO_QE; ++j) {
    const float a = red[j * FO_BLOCK + tid - lane], x = values[j * FO_BLOCK + tid];
    const long long e = key.e + (long long)j * FO_BLOCK;
    const int code =
        sr ? fo_q_encode_sr(map, bits, x, a, fo_q_rand(key.seed, key.step, key.param, e, sr - 1))
           : fo_q_encode_fast(enc, map, bits, fix, x, a);
    shared_codes[j * FO_BLOCK + tid] = (unsigned char)code;
  }
  __syncthreads();
  // The stores: after the last barrier of this state, so that no branch separates two
  // barriers (the emulator tells barriers apart by call site, which a compiler may copy
  // into both arms of a branch).
  for (int j = 0; j < FO_QE; ++j) {
    const long long i = i0 + (long long)j * FO_BLOCK;
    if (i >= end) break;  // the later slices' elements lie further on
    const unsigned at = j * FO_BLOCK + tid;
    if (lane == 0) fo_stg_f32(absmax + i / FO_QUANT_BLOCK, red[at]);
    if (bits == 8) {
      fo_stg_u8(codes + i, shared_codes[at]);
    } else if ((i & 1) == 0) {
      const int odd = i + 1 < end ? shared_codes[at + 1] : 0;
      fo_stg_u8(codes + (i >> 1), (unsigned int)((shared_codes[at] << 4) | odd));
    }
  }
}

/// The staging of one role in the quantized path: the plain roles through registers with
/// one global access each (as fo_element_n), the quantized ones not at all (their values are
/// the thread's, from fo_q_values; their codes are stored by fo_q_commit).
template <bool kQuantized>
struct fo_qstage {
  template <typename T>
  static __device__ __forceinline__ fo_vec1<T> load(const T* p, long long i) {
    return fo_load_n(fo_width<1>(), p, i);
  }
  template <typename T, typename V>
  static __device__ __forceinline__ void store(T* p, long long i, const V& s) {
    fo_store_n(p, i, s);
  }
};
template <>
struct fo_qstage<true> {
  template <typename T>
  static __device__ __forceinline__ fo_vec1<T> load(const T*, long long) {
    return fo_vec1<T>{};
  }
  template <typename T, typename V>
  static __device__ __forceinline__ void store(T*, long long, const V&) {}
};
#define FO_QROLE(k) (((FO_QROLE_MASK >> (k)) & 1ull) != 0)
#define FO_QSTAGE_LOAD(k)                                 \
  auto fo_s##k = fo_qstage<FO_QROLE(k)>::load(t.r##k, i); \
  s.r##k = fo_s##k.v;
#define FO_QSTAGE_DECL(k)                           \
  auto fo_s##k = fo_empty_n(fo_width<1>(), t.r##k); \
  s.r##k = fo_s##k.v;
#define FO_QSTAGE_STORE(k) fo_qstage<FO_QROLE(k)>::store(t.r##k, i, fo_s##k);

#if FO_FACTORED
#define FO_QRC_PARAM , const fo_rcx& X
#define FO_QRC_ARG , X
#define FO_QRC_UPDATE fo_element_rc(s, 0, U, T, X, X.col);
#else
#define FO_QRC_PARAM
#define FO_QRC_ARG
#define FO_QRC_UPDATE fo_element(s, 0, U, T);
#endif

/// Element i of tensor t in the quantized path: the plain roles staged through registers,
/// the quantized ones pointing at the thread's values (a factored rule's element with its
/// row's and column's values X).
template <bool kInit>
__device__ __forceinline__ void fo_q_element(const fo_tensor& t, long long i, const fo_uniform& U,
                                             const fo_tvals& T, float* vals FO_QRC_PARAM) {
  fo_tensor s = t;
  s.e0 = t.e0 + i;  // element 0 of s is element i of t
  if (kInit) {
    FO_INIT_STAGE(FO_QSTAGE_LOAD, FO_QSTAGE_DECL)
#define FO_QATTACH(k, role, bits, map, fix, enc, tiny, zero, sr) s.r##role = &vals[k];
    FO_QUANT_LIST(FO_QATTACH)
    fo_init_element(s, 0, U);
    FO_INIT_STORES(FO_QSTAGE_STORE)
  } else {
    FO_UPDATE_STAGE(FO_QSTAGE_LOAD, FO_QSTAGE_DECL)
    FO_QUANT_LIST(FO_QATTACH)
#undef FO_QATTACH
    FO_QRC_UPDATE
    FO_UPDATE_STORES(FO_QSTAGE_STORE)
  }
  (void)T;
}

/// One chunk of an update (or init) of a binding with quantized states: FO_QE slices of the
/// block's width per iteration (FO_QE).
template <bool kInit>
__device__ __forceinline__ void fo_q_chunk(const fo_launch& L, const fo_chunk& chunk,
                                           const fo_tensor& t, const fo_uniform& U,
                                           const fo_tvals& T, float (*qmaps)[FO_QMAP_MAX],
                                           float* red, unsigned char* shared_codes) {
  const fo_qtensor q = fo_qbind(L.ptrs + (long long)chunk.tensor * FO_NUM_ROLES,
                                (long long)L.tensor_info[4 * (long long)chunk.tensor]);
#if FO_FACTORED
  const long long R = fo_rows_of(L, chunk.tensor), C = fo_cols_of(L, chunk.tensor);
  const fo_rcx X0 = fo_rc_base(L, chunk.tensor);
#endif
  for (long long base = chunk.begin; base < chunk.end; base += (long long)FO_QE * FO_BLOCK) {
    const long long i0 = base + threadIdx.x;
    float vals[FO_QE][FO_NUM_QUANT];
#pragma unroll
    for (int j = 0; j < FO_QE; ++j) {
      const long long i = i0 + (long long)j * FO_BLOCK;
      fo_q_values(q, i, i < chunk.end && !kInit, qmaps, vals[j]);
    }
#pragma unroll
    for (int j = 0; j < FO_QE; ++j) {
      const long long i = i0 + (long long)j * FO_BLOCK;
      if (i >= chunk.end) break;
#if FO_FACTORED
      float rv[FO_NUM_ROWV], cv[FO_NUM_COLV];
      // X points at rv and cv on every path, so that they stay in registers.
      const fo_rcx X =
          kInit ? fo_rc_at(X0, i, R, C)
                : fo_rc_values_at<FO_REDUCTION_PASSES>(fo_rc_at(X0, i, R, C), U, T, rv, cv);
#endif
      fo_q_element<kInit>(t, i, U, T, vals[j] FO_QRC_ARG);
    }
    const fo_qkey key = {U.seed, U.rstep, t.pid, t.e0 + i0};
#define FO_QCOMMIT(k, role, bits, map, fix, enc, tiny, zero, sr)                                   \
  {                                                                                                \
    float v[FO_QE];                                                                                \
    for (int j = 0; j < FO_QE; ++j) v[j] = vals[j][k];                                             \
    fo_q_commit(q.codes[k], q.absmax[k], bits, fix, sr, key, qmaps[k], enc, v, i0, chunk.end, red, \
                shared_codes);                                                                     \
  }
    FO_QUANT_LIST(FO_QCOMMIT)
#undef FO_QCOMMIT
  }
  (void)T;
}
#endif

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
    {
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
#endif
}

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
