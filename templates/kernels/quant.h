// Block-quantized states (DTypeBinding::quant), shared by the host and CUDA skeletons and
// pasted between the generated part and the skeleton (codegen/source.cpp). A quantized
// state's element is map[code] * absmax of its block (abi.h: fo_q_code_bytes and friends
// give the layout). The generated part defines, for a binding with quantized states:
//   FO_NUM_QUANT          how many states are quantized
//   FO_QUANT_BLOCK        elements per absmax block (a power of two from 32 to FO_CUDA_BLOCK)
//   FO_QUANT_LIST(X)      X(k, role, bits, map, fix, enc, tiny, zero, sr) for each: its
//                         index, its role, 8 or 4, its map, 1 for bitsandbytes' sign fix
//                         (q8s), its encoder table (codegen/quant.hpp: QuantEncoder),
//                         its codes of a tiny value and of 0, and 0 when its codes round to
//                         the nearest, else 1 + its index among the rule's states (stochastic
//                         rounding: the random numbers' key)
//   fo_offset(t, i)       the tensor's roles advanced by i elements
// and the tables themselves. The element functions are the rule's, unchanged: they see a
// quantized state as an fp32 role pointing at the dequantized values of the block (host) or
// of the thread's element (CUDA), and the skeleton quantizes what they stored.
#ifndef FO_NUM_QUANT
#define FO_NUM_QUANT 0
#endif
#ifndef FO_QROLE_MASK
#define FO_QROLE_MASK 0ull  // bit r: role r is a quantized state
#endif

#if FO_NUM_QUANT > 0

/// The codes and absmax of each quantized state of one tensor of `numel` elements.
struct fo_qtensor {
  unsigned char* codes[FO_NUM_QUANT];
  float* absmax[FO_NUM_QUANT];
};

FO_FN fo_qtensor fo_qbind(void* const* p, long long numel) {
  fo_qtensor q;
#define FO_QBIND(k, role, bits, map, fix, enc, tiny, zero, sr) \
  q.codes[k] = (unsigned char*)p[role];                        \
  q.absmax[k] = (float*)(q.codes[k] + fo_q_absmax_offset(numel, bits));
  FO_QUANT_LIST(FO_QBIND)
#undef FO_QBIND
  return q;
}

/// Element i's code (4-bit: element 2j in the high nibble of byte j, 2j+1 in the low one,
/// as torchao packs them).
FO_FN int fo_q_code(const unsigned char* codes, int bits, long long i) {
  return bits == 8 ? (int)codes[i] : (int)((codes[i >> 1] >> ((~i & 1) * 4)) & 15);
}

/// Whether an element's new value of a quantized state is lost: a NaN or an infinity (a
/// finite g whose g * g overflows). Such an element restarts (fo_q_restart on the host,
/// fo_q_chunk on CUDA): each of its quantized states is stored as 0, so that its block's
/// absmax, and with it every other element of the block, stays finite; a non-finite absmax
/// turned the whole block NaN, for good (docs/rules.md, "Quantized states").
FO_FN unsigned int fo_q_lost(float x) {
  return (fo_as_uint(x) & 0x7f800000u) == 0x7f800000u ? 1u : 0u;
}

/// The index of the value of `map` (sorted, n a power of two) nearest to x, against the fp32
/// midpoints (map[j] + map[j+1]) * 0.5: the count of midpoints below x, found by halving; x
/// exactly on a midpoint takes the even one of its two neighbours (bitsandbytes' rule). NaN
/// gives 0.
FO_FN int fo_q_nearest(const float* map, int n, float x) {
  int lo = 0;
  for (int step = n >> 1; step > 0; step >>= 1) {
    const float mid = (map[lo + step - 1] + map[lo + step]) * 0.5f;
    if (x > mid || (x == mid && ((lo + step) & 1) == 0)) lo += step;
  }
  return lo;
}

/// The code of value v in a block whose new absmax is `absmax`: v / absmax rounded to the
/// nearest value of the map (an all-zero block: the code nearest 0). With `fix`
/// (bitsandbytes' signed 8-bit map), a value with its sign bit set (negative, or -0) that
/// lands on the code of 0 takes the next code down, so the sign survives.
FO_FN int fo_q_encode(const float* map, int bits, int fix, float v, float absmax) {
  int code = fo_q_nearest(map, 1 << bits, absmax != 0.0f ? v / absmax : 0.0f);
  if (fix && (fo_as_uint(v) >> 31) != 0u && map[code] >= 0.0f && code > 0) code -= 1;
  return code;
}

/// fo_q_encode by the encoder table (codegen/quant.hpp: QuantEncoder), for y = v / absmax with
/// a finite absmax (the table holds the sign fix and the tiny code): the table's index of y's
/// bits u, by y's sign, exponent and top 7 mantissa bits (|y| below 2^-23: the lowest bucket),
/// and the code from that word w: the bucket's code, one more from the key (y's low 16 bits,
/// reversed for y < 0) at which the bucket's midpoint lies. Straight-line int arithmetic: the
/// host's loop vectorises it.
FO_FN int fo_q_enc_index(unsigned int u) {
  const int neg = -(int)(u >> 31);                        // y's sign bit, as a mask
  int b = (int)((u << 1) >> 17) - 104 * 128;              // |y|'s exponent and top 7 bits
  b = b < 0 ? 0 : (b > 24 * 128 - 1 ? 24 * 128 - 1 : b);  // |y| < 2^-23: the lowest bucket
  return b + (neg & (24 * 128));
}
FO_FN int fo_q_enc_code(unsigned int u, int w) {
  const int key = ((int)u ^ -(int)(u >> 31)) & 0xffff;
  return (w & 255) + (key >= (w >> 8) ? 1 : 0);
}

/// What keys the random numbers of an element's stochastic rounding: the launch's seed, the
/// step, the param, and the element's index within the param.
struct fo_qkey {
  unsigned long long seed;
  unsigned int step;
  unsigned int param;
  long long e;
};

/// The random word that rounds element e of the rule's state `state` (0-based)
/// stochastically: word e % 4 of the Philox draw (prelude.h) of counter (e / 4, param, step)
/// under the key seed ^ (state + 1) * 0x9E3779B97F4A7C15: four elements share a draw, and the
/// key keeps these words apart from the param's rounding and rand() (key: the seed) and from
/// the other states' (fo_q_key).
FO_FN unsigned long long fo_q_key(unsigned long long seed, int state) {
  return seed ^ ((unsigned long long)(state + 1) * 0x9E3779B97F4A7C15ull);
}
FO_FN unsigned int fo_q_rand(unsigned long long seed, unsigned int step, unsigned int param,
                             long long e, int state) {
  const unsigned long long key = fo_q_key(seed, state);
  const unsigned long long group = (unsigned long long)e >> 2;
  const fo_rand4 r = fo_philox((unsigned int)group, (unsigned int)(group >> 32), param, step,
                               (unsigned int)key, (unsigned int)(key >> 32));
  return r.x[e & 3];
}

/// The code of v in a block of absmax `absmax`, rounded stochastically with the random word r:
/// y = v / absmax lies between map[lo] (the largest map value <= y, found by halving) and
/// map[lo + 1]; the code is lo + 1 when r's unit fraction falls below (y - map[lo]) /
/// (map[lo + 1] - map[lo]), so the expected value is y. Below the map's smallest value (q4u
/// has no 0) y takes it; at its largest, it; NaN gives 0.
FO_FN int fo_q_encode_sr(const float* map, int bits, float v, float absmax, unsigned int r) {
  const int n = 1 << bits;
  const float y = absmax != 0.0f ? v / absmax : 0.0f;
  int lo = 0;
  for (int step = n >> 1; step > 0; step >>= 1) {
    if (y >= map[lo + step]) lo += step;
  }
  if (lo == n - 1) return lo;
  const float p = (y - map[lo]) / (map[lo + 1] - map[lo]);
  return fo_unit(r) < p ? lo + 1 : lo;
}

#endif  // FO_NUM_QUANT > 0
