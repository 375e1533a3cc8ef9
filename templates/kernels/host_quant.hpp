// The host skeleton's quantized states (host_kernel.hpp includes it; generated sources paste
// it there): one absmax block at a time, dequantized into an fp32 stage, run through the
// rule and quantized back (AVX-512 or AVX2 lookups where quant_avx512.h or quant_avx2.h
// enable them). Not a header of its own: it needs what host_kernel.hpp defines before it.
#if FO_NUM_QUANT > 0
// ---- quantized states: one absmax block at a time, through an fp32 stage ----------------

#ifndef FO_QUANT_AVX512
/// Elements [b, b + n) of a state of `bits`-bit codes, map[code] * a, into out: 4-bit codes by
/// permutes on AVX2 (quant_avx2.h), else loops (an odd 4-bit tail's pad lands in out).
static inline void fo_q_decode_host(const float* map, int bits, const unsigned char* codes,
                                    long long b, int n, float a, float* out) {
  if (bits == 8) {
    for (int j = 0; j < n; ++j) out[j] = map[codes[b + j]] * a;
    return;
  }
  const unsigned char* c = codes + (b >> 1);
#ifdef FO_QUANT_AVX2
  fo_q4_decode_block(map, c, n, a, out);
#else
  for (int jb = 0; jb < (n + 1) / 2; ++jb) {  // byte by byte: two elements each
    const unsigned int byte = c[jb];
    out[2 * jb] = map[byte >> 4] * a;
    out[2 * jb + 1] = map[byte & 15u] * a;
  }
#endif
}
#endif

/// Elements [b, b + n) of each quantized state, dequantized into its stage row.
static inline void fo_q_stage_in(const fo_qtensor& q, long long b, int n,
                                 float (*stage)[FO_QUANT_BLOCK]) {
#ifdef FO_QUANT_AVX512
#define FO_QIN(k, role, bits, map, fix, enc, tiny, zero, sr)             \
  fo_q_decode_block<bits>(map, q.codes[k] + (bits == 8 ? b : b >> 1), n, \
                          q.absmax[k][b / FO_QUANT_BLOCK], stage[k]);
#else
#define FO_QIN(k, role, bits, map, fix, enc, tiny, zero, sr) \
  fo_q_decode_host(map, bits, q.codes[k], b, n, q.absmax[k][b / FO_QUANT_BLOCK], stage[k]);
#endif
  FO_QUANT_LIST(FO_QIN)
#undef FO_QIN
}

/// The largest |v| of n values, NaN when one is NaN (as the CUDA tree's fo_maxnan fold): the
/// largest of the magnitudes' bits, since a magnitude's bits order as its value and every
/// NaN's lie above infinity's. An integer max, so the loop vectorises.
static inline float fo_q_absmax(const float* v, int n) {
  unsigned int m = 0;
#pragma omp simd reduction(max : m)
  for (int j = 0; j < n; ++j) {
    const unsigned int u = fo_as_uint(v[j]) & 0x7fffffffu;
    m = u > m ? u : m;
  }
  return fo_as_float(m > 0x7f800000u ? 0x7fc00000u : m);
}

/// The codes of n values in a block of absmax a: fo_q_encode's codes (the count of the map's
/// fp32 midpoints below v / a, a tie to the even code, the sign fix with `fix`), from one word
/// of the encoder table per value (codegen/quant.hpp: QuantEncoder, which holds the sign fix
/// and the tiny code), without branches, so that the loop vectorises. a is the values'
/// absmax, so |v / a| <= 1 (all zeros: v / 1, the signed zeros' codes); a block with a NaN or
/// an infinity takes the search.
static inline void fo_q_encode_block(const float* map, int bits, int fix, const unsigned int* enc,
                                     const float* v, int n, float a, unsigned char* out) {
  if (!(a <= 3.40282347e38f)) {
    for (int j = 0; j < n; ++j) out[j] = (unsigned char)fo_q_encode(map, bits, fix, v[j], a);
    return;
  }
  const float d = a != 0.0f ? a : 1.0f;
#pragma omp simd
  for (int j = 0; j < n; ++j) {
    // Straight-line int arithmetic: GCC vectorises no loop with a branch, or a gather with an
    // unsigned index.
    const unsigned int u = fo_as_uint(v[j] / d);
    out[j] = (unsigned char)fo_q_enc_code(u, (int)enc[fo_q_enc_index(u)]);
  }
}

/// fo_q_rand's words of the rule's state `state` for elements e, e + 1, ... of the param (e =
/// key.e, a multiple of four: blocks begin on multiples of 32 elements of the param), n of
/// them rounded up to 16 (words has room for FO_QUANT_BLOCK): one draw per group of four.
static inline void fo_q_sr_words(const fo_qkey& key, int state, int n, unsigned int* words) {
  const unsigned long long k = fo_q_key(key.seed, state);
  const unsigned long long g0 = (unsigned long long)key.e >> 2;
#pragma omp simd
  for (int q = 0; q < (n + 15) / 16 * 4; ++q) {
    const unsigned long long g = g0 + (unsigned long long)q;
    const fo_rand4 r = fo_philox((unsigned int)g, (unsigned int)(g >> 32), key.param, key.step,
                                 (unsigned int)k, (unsigned int)(k >> 32));
    words[4 * q] = r.x[0];
    words[4 * q + 1] = r.x[1];
    words[4 * q + 2] = r.x[2];
    words[4 * q + 3] = r.x[3];
  }
}

/// The codes of n values of a block of absmax a, rounded stochastically (fo_q_encode_sr) with
/// the random words of the rule's state `state` (fo_q_sr_words). The
/// floor code comes from the nearest one (fo_q_encode_block: one table word) and one comparison
/// with its map value, not from fo_q_encode_sr's dependent search. (q8s's table moves y in
/// (-map[zero + 1] / 2, -0] to code zero - 1, its sign fix: the floor is zero - 1 all the same,
/// and for y = -0 the step up has probability 1, so the code is zero, as the search gives.)
static inline void fo_q_encode_block_sr(const float* map, const unsigned int* enc, int bits,
                                        int state, const float* v, int n, float a,
                                        const fo_qkey& key, unsigned char* out) {
  unsigned int words[FO_QUANT_BLOCK];
  fo_q_sr_words(key, state, n, words);
  fo_q_encode_block(map, bits, 0, enc, v, n, a, out);
  const float d = a != 0.0f ? a : 1.0f;
  const int top = (1 << bits) - 1;
#pragma omp simd
  for (int j = 0; j < n; ++j) {
    const float y = a != 0.0f ? v[j] / d : 0.0f;
    int lo = (int)out[j];
    lo -= map[lo] > y ? 1 : 0;  // the nearest code above y: the floor is the one below
    lo = lo < 0 ? 0 : lo;
    const int hi = lo < top ? lo + 1 : lo;
    const float p = (y - map[lo]) / (map[hi] - map[lo]);
    out[j] = (unsigned char)(lo < top && fo_unit(words[j]) < p ? lo + 1 : lo);
  }
}

#ifndef FO_QUANT_AVX512
/// The codes of the n values v of a block of absmax a, at element b of a state of `bits`-bit
/// codes: nearest (sr 0) or stochastically rounded (sr: 1 + the rule's state); 4-bit codes by
/// permutes on AVX2 (quant_avx2.h), else the encoder table's loops, 4-bit codes then packed
/// (an odd n's pad nibble 0).
static inline void fo_q_encode_host(const float* map, const unsigned int* enc, int bits, int fix,
                                    int sr, const float* v, int n, float a, const fo_qkey& key,
                                    unsigned char* codes, long long b) {
#ifdef FO_QUANT_AVX2
  if (bits == 4 && !sr) {
    fo_q4_encode_block(map, fix, v, n, a, codes + (b >> 1));
    return;
  }
  if (bits == 4) {
    unsigned int words[FO_QUANT_BLOCK];
    fo_q_sr_words(key, sr - 1, n, words);
    fo_q4_encode_block_sr(map, words, v, n, a, codes + (b >> 1));
    return;
  }
#endif
  unsigned char staged[FO_QUANT_BLOCK + 1];
  unsigned char* out = bits == 8 ? codes + b : staged;
  if (sr) {
    fo_q_encode_block_sr(map, enc, bits, sr - 1, v, n, a, key, out);
  } else {
    fo_q_encode_block(map, bits, fix, enc, v, n, a, out);
  }
  if (bits == 4) {
    if (n & 1) staged[n] = 0;
    for (int jb = 0; jb < (n + 1) / 2; ++jb)
      codes[(b >> 1) + jb] = (unsigned char)((staged[2 * jb] << 4) | staged[2 * jb + 1]);
  }
}
#endif

/// Each element of the block with a lost quantized value (fo_q_lost) restarts: all its
/// quantized states become 0 (one of them alone would leave, say, AdamW's m of a g of 1e38
/// beside a v of 0). The other elements are as they were.
static inline void fo_q_restart(float (*stage)[FO_QUANT_BLOCK], int n) {
#pragma omp simd
  for (int j = 0; j < n; ++j) {
    unsigned int lost = 0;
    for (int k = 0; k < FO_NUM_QUANT; ++k) lost |= fo_q_lost(stage[k][j]);
    for (int k = 0; k < FO_NUM_QUANT; ++k) stage[k][j] = lost ? 0.0f : stage[k][j];
  }
}

/// The block's new absmax, then each element's code (key: the random numbers' of element b),
/// after the elements whose values are lost restart.
static inline void fo_q_stage_out(const fo_qtensor& q, long long b, int n,
                                  float (*stage)[FO_QUANT_BLOCK], const fo_qkey& key) {
  fo_q_restart(stage, n);
#ifdef FO_QUANT_AVX512
#define FO_QOUT(k, role, bits, map, fix, enc, tiny, zero, sr)                      \
  {                                                                                \
    const float a = fo_q_absmax(stage[k], n);                                      \
    q.absmax[k][b / FO_QUANT_BLOCK] = a;                                           \
    unsigned char* out = q.codes[k] + (bits == 8 ? b : b >> 1);                    \
    if (sr) {                                                                      \
      static const fo_qlevels floors = fo_q_levels(map, bits, true);               \
      fo_q_encode_block16_sr<bits>(floors, map, (sr)-1, stage[k], n, a, key, out); \
    } else {                                                                       \
      static const fo_qlevels levels = fo_q_levels(map, bits, false);              \
      fo_q_encode_block16<bits>(levels, fix, zero, stage[k], n, a, out);           \
    }                                                                              \
  }
  FO_QUANT_LIST(FO_QOUT)
#undef FO_QOUT
#else
#define FO_QOUT(k, role, bits, map, fix, enc, tiny, zero, sr)                      \
  {                                                                                \
    const float a = fo_q_absmax(stage[k], n);                                      \
    q.absmax[k][b / FO_QUANT_BLOCK] = a;                                           \
    fo_q_encode_host(map, enc, bits, fix, sr, stage[k], n, a, key, q.codes[k], b); \
  }
  FO_QUANT_LIST(FO_QOUT)
#undef FO_QOUT
#endif
  (void)key;
}

/// The block view of tensor t at element b: every role advanced by b, the quantized ones
/// pointing at their stage rows.
static inline fo_tensor fo_q_view(const fo_tensor& t, long long b, float (*stage)[FO_QUANT_BLOCK]) {
  fo_tensor s = fo_offset(t, b);
#define FO_QATTACH(k, role, bits, map, fix, enc, tiny, zero, sr) s.r##role = stage[k];
  FO_QUANT_LIST(FO_QATTACH)
#undef FO_QATTACH
  return s;
}

/// One chunk of an update (or init): block by block, dequantize, run the rule, quantize.
/// Chunks begin at multiples of the block (chunk sizes are multiples of it).
template <bool kInit>
static void fo_q_chunk(const fo_launch* L, long long c, const fo_chunk& chunk, const fo_tensor& t,
                       const fo_uniform& uniform, const fo_tvals& values) {
  // Local copies, as fo_run's: a reference would leave the hypers' loads in the loop, and a
  // load used under a rule's where() becomes a masked load GCC does not vectorise.
  const fo_uniform u = uniform;
  const fo_tvals tv = values;
  const fo_qtensor q = fo_qbind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES,
                                (long long)L->tensor_info[4 * (long long)chunk.tensor]);
#if FO_FACTORED
  const long long R = fo_rows_of(*L, chunk.tensor), C = fo_cols_of(*L, chunk.tensor);
  const fo_rcx X0 = kInit ? fo_rc_base(*L, chunk.tensor)
                          : fo_rc_chunk_base<FO_REDUCTION_PASSES>(L, c, chunk, u, tv);
  float rv[FO_NUM_ROWV];
#else
  (void)c;
#endif
  float stage[FO_NUM_QUANT][FO_QUANT_BLOCK];
  for (long long b = chunk.begin; b < chunk.end; b += FO_QUANT_BLOCK) {
    const int n = (int)(chunk.end - b < FO_QUANT_BLOCK ? chunk.end - b : FO_QUANT_BLOCK);
    const fo_tensor s = fo_q_view(t, b, stage);
    if (kInit) {
      for (int k = 0; k < FO_NUM_QUANT; ++k) {
        for (int j = 0; j < n; ++j) stage[k][j] = 0.0f;
      }
      for (int j = 0; j < n; ++j) fo_init_element(s, j, u);
    } else {
      fo_q_stage_in(q, b, n, stage);
#if FO_FACTORED
      // The block's elements row by row, each with its row's and column's values.
      for (long long i = b; i < b + n;) {
        const long long r = i / C, end = (r + 1) * C < b + n ? (r + 1) * C : b + n;
        const fo_rcx X = fo_rc_row<FO_REDUCTION_PASSES>(X0, r, R, u, tv, rv);
        const long long c0 = X0.col + (r / R) * C - r * C;  // element k's column: c0 + k
#pragma omp simd
        for (long long k = i; k < end; ++k) fo_element_rc(s, k - b, u, tv, X, c0 + k);
        i = end;
      }
#else
#pragma omp simd
      for (int j = 0; j < n; ++j) fo_element(s, j, u, tv);
#endif
    }
    fo_q_stage_out(q, b, n, stage, fo_qkey{u.seed, u.rstep, t.pid, t.e0 + b});
  }
}
#endif
