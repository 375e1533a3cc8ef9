// Quantized states on an AVX-512 host (pasted after quant.h for host targets only): the
// skeleton's dequantize and quantize loops as table lookups in registers. Without AVX-512
// (or for CUDA) the skeleton's portable loops run; both give the same codes and values.
//
// Why: g++ tuned for these cores emits no hardware gather (and one is slower than scalar
// loads here), so a 256-entry map lookup per element was 16 scalar loads and inserts per
// vector, and the encoder's bucket table one more; the step of adamw8bit spent four fifths
// of its time there. A permute (vpermps, vpermi2ps) looks up 16 or 32 entries held in
// registers in one instruction. Decoding also prefetches the codes two blocks ahead: the
// hardware's prefetchers left the step waiting on them (adamw8bit 99 -> 88 ms on BERT-base).
// FO_NO_AVX512_QUANT (defined before this file) turns it off (an AVX2 host's 4-bit path,
// quant_avx2.h, then runs); FO_PORTABLE_QUANT keeps the portable loops everywhere.
//
// Encoding is fo_q_nearest's halving search, lane-parallel: at the level of step s the lanes'
// `lo` are multiples of 2s, so the midpoint they compare with is one of n / 2s values, laid
// out per level (fo_qlevels) and looked up by lo / 2s. The search makes the same comparisons
// as fo_q_nearest (CUDA's encoder) in the same order, on the same fp32 midpoints, so the codes
// are the same bits: ties (x on a midpoint) go up for s >= 2 (lo + s is even) and stay for
// s == 1 (lo + 1 is odd); NaN compares false and gives 0.
#if FO_NUM_QUANT > 0 && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__) && \
    !defined(FO_NO_AVX512_QUANT) && !defined(FO_PORTABLE_QUANT)
#include <immintrin.h>
#define FO_QUANT_AVX512 1

/// The midpoints of a map of n = 2^bits values by search level, packed: level L (step
/// s = n >> (L + 1)) holds its 2^L midpoints mid[k * 2s + s - 1], k = 0 .. 2^L - 1, at offset
/// 2^L - 1 for L <= 3 (levels 0-3 share the first vector) and 2^L for L >= 4.
struct alignas(64) fo_qlevels {
  float mid[256];
};

/// With `floors`, the same layout of the thresholds map[j + 1] instead of the midpoints: the
/// search then finds the largest code whose value is <= y (fo_q_encode_sr's).
static inline fo_qlevels fo_q_levels(const float* map, int bits, bool floors) {
  fo_qlevels t;
  for (int k = 0; k < 256; ++k) t.mid[k] = 0.0f;
  const int n = 1 << bits;
  for (int level = 0; level < bits; ++level) {
    const int s = n >> (level + 1), at = level <= 3 ? (1 << level) - 1 : 1 << level;
    for (int k = 0; k < (1 << level); ++k) {
      const int j = k * 2 * s + s - 1;  // between codes j and j + 1
      t.mid[at + k] = floors ? map[j + 1] : (map[j] + map[j + 1]) * 0.5f;
    }
  }
  return t;
}

/// A table of up to 256 floats in registers (loaded once per block, then only permuted).
struct fo_qregs {
  __m512 r[16];
};

template <int Vectors>
static inline fo_qregs fo_q_load(const float* t) {
  fo_qregs q;
  for (int i = 0; i < Vectors; ++i) q.r[i] = _mm512_loadu_ps(t + 16 * i);
  return q;
}

/// r[k] for each lane's k < M (M a power of two up to 256), r being M / 16 vectors (one when
/// M <= 16).
template <int M>
static inline __m512 fo_lut(const __m512* r, __m512i k) {
  if constexpr (M <= 16) {
    return _mm512_permutexvar_ps(k, r[0]);
  } else if constexpr (M == 32) {
    return _mm512_permutex2var_ps(r[0], k, r[1]);
  } else {  // halves by the top bit of k, each looked up recursively
    const __m512 a = fo_lut<M / 2>(r, k);
    const __m512 b = fo_lut<M / 2>(r + M / 32, k);
    const __mmask16 hi = _mm512_test_epi32_mask(k, _mm512_set1_epi32(M / 2));
    return _mm512_mask_blend_ps(hi, a, b);
  }
}

/// One level of the search: lanes whose y lies above the level's midpoint (or on it when
/// s >= 2, or with Floors, where the thresholds are map values) move up by s.
template <int Level, int Bits, bool Floors = false>
static inline __m512i fo_q_level(const fo_qregs& t, __m512 y, __m512i lo) {
  constexpr int s = (1 << Bits) >> (Level + 1);
  const __m512i k = _mm512_srli_epi32(lo, Bits - Level);
  __m512 mid;
  if constexpr (Level == 0) {  // one midpoint for every lane
    mid = _mm512_permutexvar_ps(_mm512_setzero_si512(), t.r[0]);
  } else if constexpr (Level <= 3) {
    mid = _mm512_permutexvar_ps(_mm512_add_epi32(k, _mm512_set1_epi32((1 << Level) - 1)), t.r[0]);
  } else {
    mid = fo_lut<(1 << Level)>(t.r + (1 << Level) / 16, k);
  }
  const __mmask16 up = _mm512_cmp_ps_mask(y, mid, Floors || s >= 2 ? _CMP_GE_OQ : _CMP_GT_OQ);
  return _mm512_mask_add_epi32(lo, up, lo, _mm512_set1_epi32(s));
}

/// Stores 16 codes c at element j of out (8-bit, or 4-bit packed: lanes past `left` are 0,
/// each 64-bit lane packs its two codes into one byte).
template <int Bits>
static inline void fo_q_store16(__m512i c, int left, unsigned char* out, int j) {
  const __mmask16 m = (__mmask16)((1u << left) - 1u);
  if constexpr (Bits == 8) {
    _mm512_mask_cvtepi32_storeu_epi8(out + j, m, c);
  } else {
    const __m512i cz = _mm512_maskz_mov_epi32(m, c);
    const __m512i packed = _mm512_or_si512(_mm512_slli_epi64(cz, 4), _mm512_srli_epi64(cz, 32));
    const __mmask8 bm = (__mmask8)((1u << ((left + 1) / 2)) - 1u);
    _mm512_mask_cvtepi64_storeu_epi8(out + j / 2, bm, packed);
  }
}

/// Elements [0, n) of a block: codes from `codes` (8-bit, or 4-bit packed as fo_q_code reads
/// them), times a, into out (n rounded up to 16 written).
template <int Bits>
static inline void fo_q_decode_block(const float* map, const unsigned char* codes, int n, float a,
                                     float* out) {
  const fo_qregs table = fo_q_load<(1 << Bits) / 16>(map);
  const __m512 scale = _mm512_set1_ps(a);
  // The codes of the block after the next (a hint: no fault past the end).
  for (int j = 0; j < FO_QUANT_BLOCK * Bits / 8; j += 64)
    _mm_prefetch((const char*)codes + 2 * FO_QUANT_BLOCK * Bits / 8 + j, _MM_HINT_T0);
  for (int j = 0; j < n; j += 16) {
    const int left = n - j < 16 ? n - j : 16;
    __m512i idx;
    if constexpr (Bits == 8) {
      const __mmask16 m = (__mmask16)((1u << left) - 1u);
      idx = _mm512_cvtepu8_epi32(_mm_maskz_loadu_epi8(m, codes + j));
    } else {  // 8 bytes: high nibble first
      const __mmask16 m = (__mmask16)((1u << ((left + 1) / 2)) - 1u);
      const __m128i b = _mm_maskz_loadu_epi8(m, codes + j / 2);
      const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
      const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(15));
      idx = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(hi, lo));
    }
    _mm512_storeu_ps(out + j, _mm512_mul_ps(fo_lut<(1 << Bits)>(table.r, idx), scale));
  }
}

/// The halving search over a block: y[w] = v / a for its nv = (n + 15) / 16 vectors (0 for an
/// all-zero block), lo[w] each lane's code after all levels, one level over every vector
/// before the next (one vector's search waits on each level's permute and compare; the
/// block's vectors are independent). `levels`: midpoints (nearest) or, with Floors, map values.
template <int Bits, bool Floors>
static inline int fo_q_search_block(const fo_qlevels& levels, const float* v, int n, float a,
                                    __m512* y, __m512i* lo) {
  const fo_qregs t = fo_q_load<(1 << Bits) / 16>(levels.mid);
  const int nv = (n + 15) / 16;
  const __m512 d = _mm512_set1_ps(a != 0.0f ? a : 1.0f);
  for (int w = 0; w < nv; ++w) {
    const int left = n - 16 * w < 16 ? n - 16 * w : 16;
    const __m512 x = _mm512_maskz_loadu_ps((__mmask16)((1u << left) - 1u), v + 16 * w);
    y[w] = a != 0.0f ? _mm512_div_ps(x, d) : _mm512_setzero_ps();
    lo[w] = _mm512_setzero_si512();
  }
#define FO_QLEVEL(L) \
  for (int w = 0; w < nv; ++w) lo[w] = fo_q_level<L, Bits, Floors>(t, y[w], lo[w]);
  FO_QLEVEL(0)
  FO_QLEVEL(1)
  FO_QLEVEL(2)
  FO_QLEVEL(3)
  if constexpr (Bits == 8) {
    FO_QLEVEL(Bits == 8 ? 4 : 0)
    FO_QLEVEL(Bits == 8 ? 5 : 0)
    FO_QLEVEL(Bits == 8 ? 6 : 0)
    FO_QLEVEL(Bits == 8 ? 7 : 0)
  }
#undef FO_QLEVEL
  return nv;
}

/// The codes of values v[0, n) of absmax a (n <= FO_QUANT_BLOCK), stored 8-bit or packed
/// 4-bit (an odd n's pad nibble 0): fo_q_encode's, level by level over the whole block. One
/// vector's search waits on each level's permute and compare; the block's vectors are
/// independent, so a level runs over all of them before the next (2.5x faster than one
/// vector after another, 1.9x than four interleaved, on the 2-core EPYC).
template <int Bits>
static inline void fo_q_encode_block16(const fo_qlevels& levels, int fix, int zero, const float* v,
                                       int n, float a, unsigned char* out) {
  constexpr int kMax = (FO_QUANT_BLOCK + 15) / 16;
  __m512 y[kMax];
  __m512i lo[kMax];
  const int nv = fo_q_search_block<Bits, false>(levels, v, n, a, y, lo);
  for (int w = 0; w < nv; ++w) {
    const int left = n - 16 * w < 16 ? n - 16 * w : 16;
    __m512i c = lo[w];
    if (fix) {  // a set sign bit on the code of 0 takes the next code down
      const __mmask16 m = (__mmask16)((1u << left) - 1u);
      const __mmask16 neg = _mm512_movepi32_mask(_mm512_maskz_loadu_epi32(m, v + 16 * w));
      const __mmask16 on_zero = _mm512_cmpeq_epi32_mask(c, _mm512_set1_epi32(zero));
      c = _mm512_mask_sub_epi32(c, neg & on_zero, c, _mm512_set1_epi32(1));
    }
    fo_q_store16<Bits>(c, left, out, 16 * w);
  }
}

// ---- stochastic rounding (quant_sr), 16 lanes at a time ------------------------------------

/// hi and lo words of m * a for each 32-bit lane of a.
static inline void fo_mulhilo16(__m512i a, unsigned int m, __m512i* hi, __m512i* lo) {
  const __m512i mv = _mm512_set1_epi32((int)m);
  *lo = _mm512_mullo_epi32(a, mv);
  const __m512i even = _mm512_mul_epu32(a, mv);  // lanes 0, 2, ...: 64-bit products
  const __m512i odd = _mm512_mul_epu32(_mm512_srli_epi64(a, 32), mv);
  *hi = _mm512_mask_blend_epi32((__mmask16)0xAAAA, _mm512_srli_epi64(even, 32), odd);
}

/// fo_q_rand for elements key.e + j .. key.e + j + 63 (key.e + j a multiple of 4), in out[0]
/// (the first 16) to out[3]: the 16 Philox draws of their groups of four, lane-parallel, then
/// each group's four words moved to its four elements' lanes (a 4x4 transpose per 128-bit lane,
/// then the lanes gathered per vector).
static inline void fo_q_rand64(const fo_qkey& key, int j, int state, __m512i* out) {
  const unsigned long long seed = fo_q_key(key.seed, state);
  const unsigned long long g = (unsigned long long)(key.e + j) >> 2;
  const __m512i base = _mm512_set1_epi32((int)(unsigned int)g);
  __m512i c0 = _mm512_add_epi32(
      base, _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  const __mmask16 carry = _mm512_cmplt_epu32_mask(c0, base);
  const __m512i high = _mm512_set1_epi32((int)(unsigned int)(g >> 32));
  __m512i c1 = _mm512_mask_add_epi32(high, carry, high, _mm512_set1_epi32(1));
  __m512i c2 = _mm512_set1_epi32((int)key.param), c3 = _mm512_set1_epi32((int)key.step);
  unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
  for (int round = 0; round < 10; ++round) {
    __m512i h0, l0, h1, l1;
    fo_mulhilo16(c0, 0xD2511F53u, &h0, &l0);
    fo_mulhilo16(c2, 0xCD9E8D57u, &h1, &l1);
    c0 = _mm512_xor_si512(_mm512_xor_si512(h1, c1), _mm512_set1_epi32((int)k0));
    c2 = _mm512_xor_si512(_mm512_xor_si512(h0, c3), _mm512_set1_epi32((int)k1));
    c1 = l1;
    c3 = l0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Per 128-bit lane L: r_k = the four words of group 4L + k.
  const __m512i t0 = _mm512_unpacklo_epi32(c0, c1), t1 = _mm512_unpacklo_epi32(c2, c3);
  const __m512i t2 = _mm512_unpackhi_epi32(c0, c1), t3 = _mm512_unpackhi_epi32(c2, c3);
  const __m512i r0 = _mm512_unpacklo_epi64(t0, t1), r1 = _mm512_unpackhi_epi64(t0, t1);
  const __m512i r2 = _mm512_unpacklo_epi64(t2, t3), r3 = _mm512_unpackhi_epi64(t2, t3);
  // Vector q: groups 4q .. 4q + 3, i.e. lane q of r0, r1, r2, r3.
  const __m512i a01 = _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i a23 = _mm512_shuffle_i32x4(r0, r1, _MM_SHUFFLE(3, 2, 3, 2));
  const __m512i b01 = _mm512_shuffle_i32x4(r2, r3, _MM_SHUFFLE(1, 0, 1, 0));
  const __m512i b23 = _mm512_shuffle_i32x4(r2, r3, _MM_SHUFFLE(3, 2, 3, 2));
  out[0] = _mm512_shuffle_i32x4(a01, b01, _MM_SHUFFLE(2, 0, 2, 0));
  out[1] = _mm512_shuffle_i32x4(a01, b01, _MM_SHUFFLE(3, 1, 3, 1));
  out[2] = _mm512_shuffle_i32x4(a23, b23, _MM_SHUFFLE(2, 0, 2, 0));
  out[3] = _mm512_shuffle_i32x4(a23, b23, _MM_SHUFFLE(3, 1, 3, 1));
}

/// fo_q_encode_sr's codes of values v[0, n) of absmax a (the rule's state `state`, random
/// numbers keyed on element key.e + j), stored as fo_q_encode_block16 stores them: the search
/// for map[lo] <= y level by level over the block (floors: fo_q_levels' thresholds), then
/// lo + 1 where the lane's unit fraction falls below (y - map[lo]) / (map[lo + 1] - map[lo]).
template <int Bits>
static inline void fo_q_encode_block16_sr(const fo_qlevels& floors, const float* map, int state,
                                          const float* v, int n, float a, const fo_qkey& key,
                                          unsigned char* out) {
  constexpr int kMax = (FO_QUANT_BLOCK + 15) / 16, kTop = (1 << Bits) - 1;
  __m512 y[kMax];
  __m512i lo[kMax];
  const int nv = fo_q_search_block<Bits, true>(floors, v, n, a, y, lo);
  const fo_qregs m = fo_q_load<(1 << Bits) / 16>(map);
  const __m512i top = _mm512_set1_epi32(kTop);
  __m512i words[4];
  for (int w = 0; w < nv; ++w) {
    const int left = n - 16 * w < 16 ? n - 16 * w : 16;
    if (w % 4 == 0) fo_q_rand64(key, 16 * w, state, words);
    const __mmask16 below_top = _mm512_cmplt_epi32_mask(lo[w], top);
    const __m512i next = _mm512_min_epi32(_mm512_add_epi32(lo[w], _mm512_set1_epi32(1)), top);
    const __m512 ml = fo_lut<(1 << Bits)>(m.r, lo[w]), mh = fo_lut<(1 << Bits)>(m.r, next);
    const __m512 p = _mm512_div_ps(_mm512_sub_ps(y[w], ml), _mm512_sub_ps(mh, ml));
    const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(words[w % 4], 8)),
                                   _mm512_set1_ps(5.9604644775390625e-8f));
    const __mmask16 up = below_top & _mm512_cmp_ps_mask(u, p, _CMP_LT_OQ);
    fo_q_store16<Bits>(_mm512_mask_add_epi32(lo[w], up, lo[w], _mm512_set1_epi32(1)), left, out,
                       16 * w);
  }
}

#endif
