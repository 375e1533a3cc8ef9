// The CUDA skeleton's quantized states (cuda_kernel.cuh includes it; generated sources paste
// it there): the maps in shared memory, a block's codes decoded per element, the update
// through fp32 values and a block's new absmax by a fixed tree. Not a header of its own: it
// needs cuda_staging.cuh, the entry points' helpers and quant.h before it.
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
    // An element with a lost quantized value restarts: all its quantized states become 0
    // (quant.h: fo_q_lost), so its block's absmax stays finite.
#pragma unroll
    for (int j = 0; j < FO_QE; ++j) {
      unsigned int lost = 0;
      for (int k = 0; k < FO_NUM_QUANT; ++k) lost |= fo_q_lost(vals[j][k]);
      for (int k = 0; k < FO_NUM_QUANT; ++k) vals[j][k] = lost ? 0.0f : vals[j][k];
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
