// Host skeleton: one call runs the rule over every tensor of the step. OpenMP splits the
// chunk table statically across cores (the same split every run); the inner loop is a
// plain counted loop the compiler vectorises. Uniform values are computed once per thread
// and group, never per element.
// The generated part (fo_uniform, fo_tensor, fo_bind, fo_prepare, fo_element,
// fo_init_element, FO_NUM_ROLES, FO_NUM_HYPERS) comes before this file.
#ifndef FO_GENERATED
#include "abi.h"
#include "prelude.h"
#include "sample_rule.h"
#endif

#ifndef FO_LANES
#define FO_LANES 16
#endif

#ifdef _OPENMP
#include <omp.h>
#endif

/// Tensor `tensor`'s roles, and which param's elements they are (fo_launch::tensor_ids: the
/// random numbers' counter).
static inline fo_tensor fo_bind_tensor(const fo_launch* L, int tensor) {
  fo_tensor t = fo_bind(L->ptrs + (long long)tensor * FO_NUM_ROLES);
  t.pid = L->tensor_ids ? (unsigned int)L->tensor_ids[2 * (long long)tensor] : (unsigned int)tensor;
  t.e0 = L->tensor_ids ? L->tensor_ids[2 * (long long)tensor + 1] : 0;
  return t;
}

/// The launch's step (abi.h): one past the count the launch points at, else its own.
static inline double fo_launch_step(const fo_launch* L) {
  return L->step_ptr ? *L->step_ptr + 1.0 : L->step;
}

/// Whether the launch does nothing: its skip flag (abi.h's skip_if_set) is set.
static inline bool fo_launch_skipped(const fo_launch* L) {
  return L->skip_if_set != 0 && *L->skip_if_set != 0.0;
}

/// The per-tensor values of a tensor of group `group`: its reduction results, its scalar
/// states and what element code reads of them (nothing when the rule has none).
static inline fo_tvals fo_chunk_values(const fo_launch* L, int tensor, int group, double step,
                                       double* scalars_out) {
  fo_tvals T;
  fo_tensor_values(
      L->tensor_totals ? L->tensor_totals + (long long)tensor * FO_NUM_TENSOR_SLOTS : 0,
      L->scalars ? L->scalars + (long long)tensor * FO_NUM_SCALARS : 0,
      L->hypers + (long long)group * FO_NUM_HYPERS, step, L->global_totals,
      L->tensor_whole  ? L->tensor_whole + (long long)tensor * 4
      : L->tensor_info ? L->tensor_info + (long long)tensor * 4
                       : 0,
      T, scalars_out);
  return T;
}

#if FO_FACTORED
/// Tensor t's base X (fo_rc_base) reading chunk c's column values of pass kPass, computed
/// here once for the chunk (whole rows of one matrix: one set of columns) into the floats
/// after its column sums (runtime/plan.cpp), and its column sums slot-major there too.
template <int kPass>
static inline fo_rcx fo_rc_chunk_base(const fo_launch* L, long long c, const fo_chunk& chunk,
                                      const fo_uniform& u, const fo_tvals& tv) {
  const long long R = fo_rows_of(*L, chunk.tensor), C = fo_cols_of(*L, chunk.tensor);
  fo_rcx X0 = fo_rc_base(*L, chunk.tensor);
  const long long b = R * C > 0 ? chunk.begin / (R * C) : 0;  // the chunk's matrix
  fo_rcx Xb = X0;
  Xb.mat += b;
  Xb.row += b * R;
  float* cv = (float*)(L->col_partials + L->chunk_cols[c] + C * FO_NUM_COL_SLOTS);
#pragma omp simd
  for (long long cc = 0; cc < C; ++cc)
    fo_col_values<kPass>(Xb, X0.col + b * C + cc, u, tv, cv + cc, C);
  X0.cv = cv;
  X0.cvs = C;
  X0.cv0 = X0.col + b * C;
  return X0;
}

/// Tensor t's column means of pass `pass` for its columns [k0, k1): fo_rc_col_means's sums
/// in the same order (each column's partials in chunk order, from 0), so the same bits, but
/// a chunk's partials at a time over the columns (contiguous reads) into the totals.
static void fo_rc_col_range(const fo_launch* L, int pass, long long t, long long k0, long long k1) {
  const long long R = fo_rows_of(*L, t), C = fo_cols_of(*L, t), Rw = fo_whole_rows_of(*L, t);
  const long long* o = L->rc_offsets;
  const long long cols = o[3 * t + 4] - o[3 * t + 1];
  const long long c0 = L->tensor_chunks[2 * t], n = L->tensor_chunks[2 * t + 1];
  const long long per = C > 0 && cols >= C ? n / (cols / C) : 0;  // chunks per matrix
  for (int s = 0; s < FO_NUM_COL_SLOTS; ++s) {
    if (fo_col_slot_pass(s) != pass) continue;
    double* tot = L->col_totals + o[3 * t + 1] * FO_NUM_COL_SLOTS + s;  // [k * FO_NUM_COL_SLOTS]
    for (long long k = k0; k < k1;) {
      const long long b = k / C, e = k1 < (b + 1) * C ? k1 : (b + 1) * C;  // in matrix b
      for (long long j = k; j < e; ++j) tot[j * FO_NUM_COL_SLOTS] = 0.0;
      for (long long ch = c0 + b * per; ch < c0 + (b + 1) * per && R > 0; ++ch) {
        const double* p = L->col_partials + L->chunk_cols[ch] + s * C;  // column j - b * C
#pragma omp simd
        for (long long j = k; j < e; ++j) tot[j * FO_NUM_COL_SLOTS] += p[j - b * C];
      }
      for (long long j = k; j < e; ++j)
        tot[j * FO_NUM_COL_SLOTS] = Rw > 0 ? tot[j * FO_NUM_COL_SLOTS] / Rw : 0.0;
      k = e;
    }
  }
}

/// X0 (fo_rc_chunk_base) at row r of its tensor, with the row's values of pass kPass in rv.
template <int kPass>
static inline fo_rcx fo_rc_row(const fo_rcx& X0, long long r, long long R, const fo_uniform& u,
                               const fo_tvals& tv, float* rv) {
  fo_rcx X = X0;
  X.row += r;
  X.mat += r / R;
  fo_row_values<kPass>(X, X.col, u, tv, rv, 1);
  X.rv = rv;
  return X;
}
#endif

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

/// The block's new absmax, then each element's code (key: the random numbers' of element b).
static inline void fo_q_stage_out(const fo_qtensor& q, long long b, int n,
                                  float (*stage)[FO_QUANT_BLOCK], const fo_qkey& key) {
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

template <bool kInit>
static void fo_run(const fo_launch* L) {
  if (!kInit && fo_launch_skipped(L)) return;
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
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
        U = fo_prepare(L->hypers + (long long)chunk.group * FO_NUM_HYPERS, step, inv_grad_scale,
                       L->global_totals);
        U.seed = L->seed;
        group = chunk.group;
      }
      const fo_tensor t = fo_bind_tensor(L, chunk.tensor);
      const fo_uniform u = U;  // a local copy: provably not aliased by the tensor stores
      const fo_tvals tv = fo_chunk_values(L, chunk.tensor, chunk.group, step, 0);
      const long long end = chunk.end;
#if FO_NUM_QUANT > 0
      fo_q_chunk<kInit>(L, c, chunk, t, u, tv);
      continue;
#endif
      if (kInit) {
        for (long long i = chunk.begin; i < end; ++i) fo_init_element(t, i, u);
      } else {
#if FO_FACTORED
        const long long R = fo_rows_of(*L, chunk.tensor), C = fo_cols_of(*L, chunk.tensor);
        const fo_rcx X0 = fo_rc_chunk_base<FO_REDUCTION_PASSES>(L, c, chunk, u, tv);
        float rv[FO_NUM_ROWV];
        for (long long r = chunk.begin / C; r < end / C; ++r) {
          const fo_rcx X = fo_rc_row<FO_REDUCTION_PASSES>(X0, r, R, u, tv, rv);
          const long long c0 = X0.col + (r / R) * C;
#pragma omp simd
          for (long long cc = 0; cc < C; ++cc) fo_element_rc(t, r * C + cc, u, tv, X, c0 + cc);
        }
#else
#pragma omp simd
        for (long long i = chunk.begin; i < end; ++i) fo_element(t, i, u, tv);
#endif
      }
    }
  }
}

// ---- reductions: two fixed-order stages, so the bits never depend on the thread count ----
// Stage 1 (fusedopt_reduce_host): each chunk's accumulators, over FO_LANES interleaved
// lanes combined in lane order, into L->partials. Which thread runs a chunk does not matter.
// Stage 2 (fusedopt_finalize_host): per tensor and globally, the chunk partials in chunk
// order, in double.

FO_FN double fo_combine(bool is_max, double a, double b) {
  return is_max ? fo_maxnan_d(a, b) : a + b;
}

template <int kPass>
static void fo_reduce_run(const fo_launch* L) {
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
  const int count = fo_acc_count(kPass);
  const bool check = kPass == 0 && L->check_grads != 0;
#pragma omp parallel if (L->num_chunks > 1)
  {
    int group = -1;
    fo_uniform U;
#pragma omp for schedule(static)
    for (long long c = 0; c < L->num_chunks; ++c) {
      const fo_chunk chunk = L->chunks[c];
      if (chunk.group != group) {
        U = fo_prepare(L->hypers + (long long)chunk.group * FO_NUM_HYPERS, step, inv_grad_scale,
                       L->global_totals);
        U.seed = L->seed;
        group = chunk.group;
      }
      const fo_tensor t = fo_bind_tensor(L, chunk.tensor);
      const fo_uniform u = U;
      const fo_tvals tv = fo_chunk_values(L, chunk.tensor, chunk.group, step, 0);
      float lanes[FO_MAX_ACC][FO_LANES];
      for (int j = 0; j < FO_MAX_ACC; ++j) {
        for (int l = 0; l < FO_LANES; ++l) lanes[j][l] = 0.0f;
      }
#if FO_FACTORED
      // Row sums are complete within the chunk (whole rows): each row's mean is written
      // here; column sums are this chunk's partials, combined by the finalize in chunk order.
      const long long R = fo_rows_of(*L, chunk.tensor), C = fo_cols_of(*L, chunk.tensor);
      const fo_rcx X0 = fo_rc_chunk_base<kPass>(L, c, chunk, u, tv);
      double* colp = L->col_partials + L->chunk_cols[c];  // [slot * C + column]
      float rv[FO_NUM_ROWV];
      for (long long k = 0; k < C * FO_NUM_COL_SLOTS; ++k) colp[k] = 0.0;
#if FO_NUM_QUANT > 0
      // Quantized states: each block dequantized once, when the walk reaches it (the pass
      // writes no state).
      const fo_qtensor q = fo_qbind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES,
                                    (long long)L->tensor_info[4 * (long long)chunk.tensor]);
      const long long numel = (long long)L->tensor_info[4 * (long long)chunk.tensor];
      float stage[FO_NUM_QUANT][FO_QUANT_BLOCK];
      long long staged = -1;  // the first element of the block in the stage
      fo_tensor qs = t;
#endif
      for (long long r = chunk.begin / C; r < chunk.end / C; ++r) {
        const fo_rcx X = fo_rc_row<kPass>(X0, r, R, u, tv, rv);
        const long long c0 = X0.col + (r / R) * C;
        // The row's sums in FO_LANES lanes of double (column cc in lane cc % FO_LANES),
        // combined in lane order at its end; each column's sum in its own partial.
        double rr[FO_NUM_ROW_SLOTS][FO_LANES];
        for (int s = 0; s < FO_NUM_ROW_SLOTS; ++s) {
          for (int l = 0; l < FO_LANES; ++l) rr[s][l] = 0.0;
        }
#if FO_NUM_QUANT > 0
        for (long long cc = 0; cc < C; ++cc) {
          const long long i = r * C + cc;
          if (staged < 0 || i >= staged + FO_QUANT_BLOCK) {
            staged = i - i % FO_QUANT_BLOCK;
            const long long left = numel - staged;
            qs = fo_q_view(t, staged, stage);
            fo_q_stage_in(q, staged, (int)(left < FO_QUANT_BLOCK ? left : FO_QUANT_BLOCK), stage);
          }
          fo_reduce_element_rc<kPass>(qs, i - staged, u, tv, X, c0 + cc, &lanes[0][cc % FO_LANES],
                                      FO_LANES, check, &rr[0][cc % FO_LANES], colp + cc);
        }
#else
        long long cc = 0;
        for (; cc + FO_LANES <= C; cc += FO_LANES) {
#pragma omp simd
          for (int l = 0; l < FO_LANES; ++l) {
            fo_reduce_element_rc<kPass>(t, r * C + cc + l, u, tv, X, c0 + cc + l, &lanes[0][l],
                                        FO_LANES, check, &rr[0][l], colp + cc + l);
          }
        }
        for (int l = 0; cc < C; ++cc, ++l) {
          fo_reduce_element_rc<kPass>(t, r * C + cc, u, tv, X, c0 + cc, &lanes[0][l], FO_LANES,
                                      check, &rr[0][l], colp + cc);
        }
#endif
        for (int s = 0; s < FO_NUM_ROW_SLOTS; ++s) {
          if (fo_row_slot_pass(s) != kPass) continue;
          double sum = 0.0;
          for (int l = 0; l < FO_LANES; ++l) sum += rr[s][l];
          L->row_totals[X.row * FO_NUM_ROW_SLOTS + s] = sum / C;
        }
      }
#elif FO_NUM_QUANT > 0
      // Block by block through the dequantized stage (the pass writes no state: quantized
      // bindings recompute).
      const fo_qtensor q = fo_qbind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES,
                                    (long long)L->tensor_info[4 * (long long)chunk.tensor]);
      float stage[FO_NUM_QUANT][FO_QUANT_BLOCK];
      for (long long b = chunk.begin; b < chunk.end; b += FO_QUANT_BLOCK) {
        const int n = (int)(chunk.end - b < FO_QUANT_BLOCK ? chunk.end - b : FO_QUANT_BLOCK);
        const fo_tensor s = fo_q_view(t, b, stage);
        fo_q_stage_in(q, b, n, stage);
        int j = 0;
        for (; j + FO_LANES <= n; j += FO_LANES) {
#pragma omp simd
          for (int l = 0; l < FO_LANES; ++l) {
            fo_reduce_element<kPass>(s, j + l, u, tv, &lanes[0][l], FO_LANES, check);
          }
        }
        for (int l = 0; j < n; ++j, ++l) {
          fo_reduce_element<kPass>(s, j, u, tv, &lanes[0][l], FO_LANES, check);
        }
      }
#else
      long long i = chunk.begin;
      for (; i + FO_LANES <= chunk.end; i += FO_LANES) {
#pragma omp simd
        for (int l = 0; l < FO_LANES; ++l) {
          fo_reduce_element<kPass>(t, i + l, u, tv, &lanes[0][l], FO_LANES, check);
        }
      }
      for (int l = 0; i < chunk.end; ++i, ++l) {
        fo_reduce_element<kPass>(t, i, u, tv, &lanes[0][l], FO_LANES, check);
      }
#endif
      for (int j = 0; j < count; ++j) {
        const bool is_max = fo_acc_max(kPass, j) != 0;
        float acc = lanes[j][0];
        for (int l = 1; l < FO_LANES; ++l)
          acc = is_max ? fo_maxnan(acc, lanes[j][l]) : acc + lanes[j][l];
        L->partials[c * FO_MAX_ACC + j] = acc;
      }
    }
  }
}

/// Reduction pass `pass` (0-based, below FO_REDUCTION_PASSES): every chunk's partials.
FO_EXTERN_C void fusedopt_reduce_host(const fo_launch* L, int pass) {
  if (fo_launch_skipped(L)) return;
  FO_REDUCE_DISPATCH(L, pass);  // one case per reduction pass of the rule (codegen)
}

/// Combines pass `pass`'s chunk partials into the per-tensor and global totals, then a
/// factored rule's column and matrix means; with pieces in stages (L->rc_stage, abi.h).
FO_EXTERN_C void fusedopt_finalize_host(const fo_launch* L, int pass) {
  if (fo_launch_skipped(L)) return;
  const int count = fo_acc_count(pass);
  for (int j = 0; j < count && L->rc_stage <= 1; ++j) {
    const bool is_max = fo_acc_max(pass, j) != 0;
    const int slot = fo_acc_slot(pass, j);
    if (slot >= 0) {
      for (long long t = 0; t < L->num_tensors; ++t) {
        const long long first = L->tensor_chunks[2 * t];
        const long long n = L->tensor_chunks[2 * t + 1];
        double acc = 0.0;
        for (long long c = first; c < first + n; ++c)
          acc = fo_combine(is_max, acc, L->partials[c * FO_MAX_ACC + j]);
        L->tensor_totals[t * FO_NUM_TENSOR_SLOTS + slot] = acc;
      }
    } else {
      double acc = 0.0;
      for (long long c = 0; c < L->num_chunks; ++c)
        acc = fo_combine(is_max, acc, L->partials[c * FO_MAX_ACC + j]);
      double* g = L->global_totals + (-1 - slot);
      *g = L->global_accumulate ? fo_combine(is_max, *g, acc) : acc;
    }
  }
#if FO_FACTORED
  const int stage = L->rc_stage;
  if (stage == 3) {
    // The matrix means over rows of the tensors whose sums span pieces, from the combined sums.
    for (long long t = 0; t < L->num_tensors; ++t) {
      const double* sh = fo_rc_shard(*L, t);
      if (!sh || !fo_rc_matrix_pass(*L, pass, t)) continue;
      const long long cols = L->rc_offsets[3 * t + 4] - L->rc_offsets[3 * t + 1];
      for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) {
        if (!fo_matrix_slot_col(s))
          fo_rc_matrix_store(*L, pass, t, 0, s, sh[cols * FO_NUM_COL_SLOTS + s]);
      }
    }
    return;
  }
  // After every per-tensor and global total: the column and matrix means.
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
  // The column means over the team, each thread a range of each tensor's columns (a
  // tensor whose sums span pieces: thread 0, through the shard).
#pragma omp parallel if (L->num_chunks > 1)
  {
#ifdef _OPENMP
    const long long nt = omp_get_num_threads(), id = omp_get_thread_num();
#else
    const long long nt = 1, id = 0;
#endif
    for (long long t = 0; t < L->num_tensors; ++t) {
      const long long cols = L->rc_offsets[3 * t + 4] - L->rc_offsets[3 * t + 1];
      if (fo_rc_shard(*L, t)) {
        if (id == 0) fo_rc_col_means(*L, pass, t, 0, 1);
      } else if (stage != 1) {
        fo_rc_col_range(L, pass, t, cols * id / nt, cols * (id + 1) / nt);
      }
    }
  }
  if (stage == 1) return;
  for (long long t = 0; t < L->num_tensors; ++t) {
    double* sh = fo_rc_shard(*L, t);
    const long long cols = L->rc_offsets[3 * t + 4] - L->rc_offsets[3 * t + 1];
    if (sh) {  // what the hook combines next: this pass's matrix sums over rows, else 0
      for (long long k = 0; k < cols * FO_NUM_COL_SLOTS + FO_NUM_MATRIX_SLOTS; ++k) sh[k] = 0.0;
    }
    if (!fo_rc_matrix_pass(*L, pass, t)) continue;
    for (long long b = 0; b < fo_rc_matrices(*L, t); ++b) {
      double sums[FO_NUM_MATRIX_SLOTS > 0 ? FO_NUM_MATRIX_SLOTS : 1];
      fo_rc_matrix_partials(*L, pass, t, b, step, inv_grad_scale, 0, 1, sums);
      for (int s = 0; s < FO_NUM_MATRIX_SLOTS; ++s) {
        if (sh && !fo_matrix_slot_col(s)) {
          if (fo_matrix_slot_pass(s) == pass) sh[cols * FO_NUM_COL_SLOTS + s] = sums[s];
        } else {
          fo_rc_matrix_store(*L, pass, t, b, s, sums[s]);
        }
      }
    }
  }
#endif
}

/// 1 when every gradient element of the chunk table, unscaled, is finite; else 0. Runs
/// before a step with grad scaling so a non-finite step can change nothing.
FO_EXTERN_C int fusedopt_check_host(const fo_launch* L) {
  const double step = fo_launch_step(L);
  const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
  int all_finite = 1;
#pragma omp parallel for schedule(static) reduction(& : all_finite) if (L->num_chunks > 1)
  for (long long c = 0; c < L->num_chunks; ++c) {
    const fo_chunk chunk = L->chunks[c];
    fo_uniform U;
    U.step = (float)step;
    U.inv_grad_scale = inv_grad_scale;
    const fo_tensor t = fo_bind(L->ptrs + (long long)chunk.tensor * FO_NUM_ROLES);
    int ok = 1;
    for (long long i = chunk.begin; i < chunk.end; ++i) ok &= (int)fo_grad_finite(t, i, U);
    all_finite &= ok;
  }
  return all_finite;
}

/// Per-tensor scalar states: with `init`, every tensor's initial values; else each tensor's
/// values after the step (after its last pass: the same function the passes read them
/// through), for every tensor, empty ones included.
FO_EXTERN_C void fusedopt_scalars_host(const fo_launch* L, int init) {
  if (!init && fo_launch_skipped(L)) return;
  const double step = fo_launch_step(L);
#if FO_FACTORED
  {  // first: the row values read the scalars as the step did
    const float inv_grad_scale = fo_unscale_factor(L->inv_grad_scale, L->grad_scale_ptr);
    for (long long t = 0; t < L->num_tensors; ++t)
      fo_rc_write(*L, t, init, step, inv_grad_scale, 0, 1);
  }
#endif
  for (long long t = 0; t < L->num_tensors && FO_NUM_SCALARS > 0; ++t) {
    double* S = L->scalars + t * FO_NUM_SCALARS;
    const int group = L->tensor_groups[t];
    if (init) {
      fo_scalar_init(L->hypers + (long long)group * FO_NUM_HYPERS, S);
    } else {
      (void)fo_chunk_values(L, (int)t, group, step, S);
    }
  }
}

FO_EXTERN_C int fusedopt_abi_version() { return FO_ABI_VERSION; }
/// Reduction passes before the update (0: an element-wise rule).
FO_EXTERN_C int fusedopt_reduction_passes() { return FO_REDUCTION_PASSES; }
/// One optimizer step over the chunk table.
FO_EXTERN_C void fusedopt_step_host(const fo_launch* L) { fo_run<false>(L); }
/// Writes every state tensor's initial value.
FO_EXTERN_C void fusedopt_init_host(const fo_launch* L) { fo_run<true>(L); }
