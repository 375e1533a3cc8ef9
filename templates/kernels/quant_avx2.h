// 4-bit quantized states on an AVX2 host without the AVX-512 path (pasted after
// quant_avx512.h for host targets only): the skeleton's 4-bit dequantize and nearest-code loops
// as permutes of registers, nearest or stochastically rounded. 8-bit states, AVX-512 hosts and
// CUDA keep their own loops; every path gives the same codes and values.
//
// Why: a 4-bit map has 16 values, two 8-lane registers, so a lookup is two permutes and a
// blend (vpermps, vblendvps) where the portable loops gather from memory: the 256-entry
// encoder table per value and the map per element, and a gather costs about twice a scalar
// load on the Zen 3 VM this was measured on.
//
// Encoding counts the map's fp32 midpoints below y = v / absmax in two steps of three
// independent comparisons (which quarter, then where in it), 16 values at a time in
// registers: the same decisions as fo_q_nearest's halving search on the same midpoints, so
// the same codes (a tie goes up where fo_q_nearest's does; NaN gives 0). A search level by
// level over the whole block, as quant_avx512.h does it, spilled its vectors to the stack
// here and cost more than the gathers it replaced.
// FO_PORTABLE_QUANT or FO_NO_AVX2_QUANT (defined before this file) keeps the portable loops.
#if FO_NUM_QUANT > 0 && defined(__AVX2__) && !defined(FO_QUANT_AVX512) && \
    !defined(FO_PORTABLE_QUANT) && !defined(FO_NO_AVX2_QUANT)
#include <immintrin.h>
#define FO_QUANT_AVX2 1

/// A 4-bit map's fp32 midpoints m_j = (map[j] + map[j + 1]) * 0.5 as the search reads them:
/// m_3, m_7 and m_11 (which quarter of the map), then m_{4q}, m_{4q+1} (in one register) and
/// m_{4q+2} for each quarter q.
struct alignas(32) fo_q4mids {
  float quarter[3];
  float within01[8];  // m_0, m_4, m_8, m_12, m_1, m_5, m_9, m_13
  float within2[8];   // m_2, m_6, m_10, m_14, then unused
};

static inline fo_q4mids fo_q4_mids(const float* map) {
  fo_q4mids t;
  float m[15];
  for (int j = 0; j < 15; ++j) m[j] = (map[j] + map[j + 1]) * 0.5f;
  for (int q = 0; q < 4; ++q) {
    if (q < 3) t.quarter[q] = m[4 * q + 3];
    t.within01[q] = m[4 * q];
    t.within01[4 + q] = m[4 * q + 1];
    t.within2[q] = m[4 * q + 2];
    t.within2[4 + q] = 0.0f;
  }
  return t;
}

/// t[idx] for 8 lanes of idx < 16, t being t0 (0-7) and t1 (8-15).
static inline __m256 fo_q4_lut(__m256 t0, __m256 t1, __m256i idx) {
  const __m256 a = _mm256_permutevar8x32_ps(t0, idx), b = _mm256_permutevar8x32_ps(t1, idx);
  return _mm256_blendv_ps(a, b, _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28)));  // bit 3
}

/// Elements [0, n) of a block from its packed codes (element 2j in the high nibble of byte j),
/// map[code] * a, into out (n rounded up to 16 written; no byte past (n + 1) / 2 read).
static inline void fo_q4_decode_block(const float* map, const unsigned char* codes, int n, float a,
                                      float* out) {
  const __m256 t0 = _mm256_loadu_ps(map), t1 = _mm256_loadu_ps(map + 8);
  const __m256 scale = _mm256_set1_ps(a);
  const int bytes = (n + 1) / 2;
  for (int j = 0; j < n; j += 16) {
    const int left = bytes - j / 2;
    __m128i b;
    if (left >= 8) {
      b = _mm_loadl_epi64((const __m128i*)(codes + j / 2));
    } else {  // the block's last bytes only
      unsigned long long w = 0;
      __builtin_memcpy(&w, codes + j / 2, left);
      b = _mm_cvtsi64_si128((long long)w);
    }
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(15));
    const __m128i lo = _mm_and_si128(b, _mm_set1_epi8(15));
    const __m128i c = _mm_unpacklo_epi8(hi, lo);  // 16 codes in element order
    const __m256i i0 = _mm256_cvtepu8_epi32(c), i1 = _mm256_cvtepu8_epi32(_mm_srli_si128(c, 8));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(fo_q4_lut(t0, t1, i0), scale));
    _mm256_storeu_ps(out + j + 8, _mm256_mul_ps(fo_q4_lut(t0, t1, i1), scale));
  }
}

/// The codes of 8 values y (= v / absmax): the count of midpoints m_j below y, a tie counting
/// when j + 1 is even (fo_q_nearest's halving makes the same comparisons' decisions: the
/// midpoints increase, so the codes are the same); NaN gives 0. First the quarter q (m_3, m_7,
/// m_11), then within it (m_{4q}, m_{4q+1}, m_{4q+2}): three independent comparisons each.
struct fo_q4search {
  __m256 m3, m7, m11, w01, w2;
  explicit fo_q4search(const fo_q4mids& t)
      : m3(_mm256_set1_ps(t.quarter[0])),
        m7(_mm256_set1_ps(t.quarter[1])),
        m11(_mm256_set1_ps(t.quarter[2])),
        w01(_mm256_load_ps(t.within01)),
        w2(_mm256_load_ps(t.within2)) {}
  __m256i codes(__m256 y) const {
    // A comparison is all ones (-1) where it holds: subtracting it counts.
    __m256i q = _mm256_sub_epi32(_mm256_setzero_si256(),
                                 _mm256_castps_si256(_mm256_cmp_ps(y, m3, _CMP_GE_OQ)));
    q = _mm256_sub_epi32(q, _mm256_castps_si256(_mm256_cmp_ps(y, m7, _CMP_GE_OQ)));
    q = _mm256_sub_epi32(q, _mm256_castps_si256(_mm256_cmp_ps(y, m11, _CMP_GE_OQ)));
    const __m256 a = _mm256_permutevar8x32_ps(w01, q);
    const __m256 b = _mm256_permutevar8x32_ps(w01, _mm256_add_epi32(q, _mm256_set1_epi32(4)));
    const __m256 c = _mm256_permutevar8x32_ps(w2, q);
    __m256i code = _mm256_slli_epi32(q, 2);
    code = _mm256_sub_epi32(code, _mm256_castps_si256(_mm256_cmp_ps(y, a, _CMP_GT_OQ)));
    code = _mm256_sub_epi32(code, _mm256_castps_si256(_mm256_cmp_ps(y, b, _CMP_GE_OQ)));
    return _mm256_sub_epi32(code, _mm256_castps_si256(_mm256_cmp_ps(y, c, _CMP_GT_OQ)));
  }
};

/// Codes c0, c1 of 16 values (elements past `count` set to 0: the pad nibble) packed into
/// bytes (element 2k in the high nibble of byte k) at out: (min(count, 16) + 1) / 2 bytes.
static inline void fo_q4_store16(__m256i c0, __m256i c1, int count, unsigned char* out) {
  const int left = (count + 1) / 2;  // bytes
  if (count < 16) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    c0 = _mm256_and_si256(c0, _mm256_cmpgt_epi32(_mm256_set1_epi32(count), iota));
    c1 = _mm256_and_si256(c1, _mm256_cmpgt_epi32(_mm256_set1_epi32(count - 8), iota));
  }
  // 16 codes as 16-bit lanes in order, then byte k = code 2k << 4 | code 2k + 1.
  const __m256i c16 = _mm256_permute4x64_epi64(_mm256_packus_epi32(c0, c1), 0xD8);
  const __m256i pair =
      _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(c16, _mm256_set1_epi32(0xffff)), 4),
                      _mm256_srli_epi32(c16, 16));
  const __m128i p16 =
      _mm_packus_epi32(_mm256_castsi256_si128(pair), _mm256_extracti128_si256(pair, 1));
  const __m128i bytes8 = _mm_packus_epi16(p16, p16);
  if (left >= 8) {
    _mm_storel_epi64((__m128i*)out, bytes8);
  } else {  // the block's last bytes only
    const unsigned long long v8 = (unsigned long long)_mm_cvtsi128_si64(bytes8);
    __builtin_memcpy(out, &v8, left);
  }
}

/// y = v / a for 8 values (an all-zero block, a == 0: +0).
static inline __m256 fo_q4_ratio(const float* v, float a, __m256 d) {
  return a != 0.0f ? _mm256_div_ps(_mm256_loadu_ps(v), d) : _mm256_setzero_ps();
}

/// Codes c of values x less one where x's sign bit is set, map[c] >= 0 and c > 0 (fo_q_encode's
/// sign fix: a negative value or -0 on a non-negative code takes the code below).
static inline __m256i fo_q4_sign_fix(__m256 t0, __m256 t1, __m256 x, __m256i c) {
  const __m256i neg = _mm256_srai_epi32(_mm256_castps_si256(x), 31);
  const __m256i nonneg =
      _mm256_castps_si256(_mm256_cmp_ps(fo_q4_lut(t0, t1, c), _mm256_setzero_ps(), _CMP_GE_OQ));
  const __m256i above0 = _mm256_cmpgt_epi32(c, _mm256_setzero_si256());
  return _mm256_add_epi32(c, _mm256_and_si256(neg, _mm256_and_si256(nonneg, above0)));
}

/// The packed codes of values v[0, n) of absmax a (n <= FO_QUANT_BLOCK; v readable up to n
/// rounded up to 16): fo_q_encode's (with `fix`, its sign fix), an odd n's pad nibble 0, exactly (n
/// + 1) / 2 bytes written. 16 values (8 bytes) at a time, in registers.
static inline void fo_q4_encode_block(const float* map, int fix, const float* v, int n, float a,
                                      unsigned char* out) {
  const fo_q4mids mids = fo_q4_mids(map);
  const fo_q4search search(mids);
  const __m256 d = _mm256_set1_ps(a != 0.0f ? a : 1.0f);
  const __m256 t0 = _mm256_loadu_ps(map), t1 = _mm256_loadu_ps(map + 8);
  for (int j = 0; j < n; j += 16) {
    __m256i c0 = search.codes(fo_q4_ratio(v + j, a, d));
    __m256i c1 = search.codes(fo_q4_ratio(v + j + 8, a, d));
    if (fix) {  // fo_q_encode's sign fix: -1 where the sign bit is set on a code >= 0 above 0
      c0 = fo_q4_sign_fix(t0, t1, _mm256_loadu_ps(v + j), c0);
      c1 = fo_q4_sign_fix(t0, t1, _mm256_loadu_ps(v + j + 8), c1);
    }
    fo_q4_store16(c0, c1, n - j, out + j / 2);
  }
}

/// fo_q_encode_sr's codes of 8 values: from the nearest code c, the floor lo (the largest code
/// whose value is <= y: c, or c - 1 where map[c] > y), then lo + 1 where the word's unit
/// fraction falls below (y - map[lo]) / (map[lo + 1] - map[lo]).
static inline __m256i fo_q4_round8(__m256 t0, __m256 t1, __m256 y, __m256i c, __m256i words) {
  const __m256i top = _mm256_set1_epi32(15), one = _mm256_set1_epi32(1);
  __m256i lo =
      _mm256_add_epi32(c, _mm256_castps_si256(_mm256_cmp_ps(fo_q4_lut(t0, t1, c), y, _CMP_GT_OQ)));
  lo = _mm256_max_epi32(lo, _mm256_setzero_si256());
  const __m256i hi = _mm256_min_epi32(_mm256_add_epi32(lo, one), top);
  const __m256 ml = fo_q4_lut(t0, t1, lo), mh = fo_q4_lut(t0, t1, hi);
  const __m256 p = _mm256_div_ps(_mm256_sub_ps(y, ml), _mm256_sub_ps(mh, ml));
  const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(words, 8)),
                                 _mm256_set1_ps(5.9604644775390625e-8f));
  const __m256i up = _mm256_and_si256(_mm256_cmpgt_epi32(top, lo),
                                      _mm256_castps_si256(_mm256_cmp_ps(u, p, _CMP_LT_OQ)));
  return _mm256_sub_epi32(lo, up);
}

/// fo_q_encode_block_sr's packed codes of values v[0, n) of absmax a with the random words
/// words[0, n) (v and words readable up to n rounded up to 16), as fo_q4_encode_block stores.
static inline void fo_q4_encode_block_sr(const float* map, const unsigned int* words,
                                         const float* v, int n, float a, unsigned char* out) {
  const fo_q4mids mids = fo_q4_mids(map);
  const fo_q4search search(mids);
  const __m256 t0 = _mm256_loadu_ps(map), t1 = _mm256_loadu_ps(map + 8);
  const __m256 d = _mm256_set1_ps(a != 0.0f ? a : 1.0f);
  for (int j = 0; j < n; j += 16) {
    const __m256 y0 = fo_q4_ratio(v + j, a, d), y1 = fo_q4_ratio(v + j + 8, a, d);
    const __m256i w0 = _mm256_loadu_si256((const __m256i*)(words + j));
    const __m256i w1 = _mm256_loadu_si256((const __m256i*)(words + j + 8));
    fo_q4_store16(fo_q4_round8(t0, t1, y0, search.codes(y0), w0),
                  fo_q4_round8(t0, t1, y1, search.codes(y1), w1), n - j, out + j / 2);
  }
}

#endif
