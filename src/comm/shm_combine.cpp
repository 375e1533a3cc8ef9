// shm_combine.hpp: blocks of 512 elements accumulate in a local array (in L1), so that each
// source and each output is streamed once and the loops vectorise.
#include "shm_combine.hpp"

#include <algorithm>
#include <cstring>

#include "support/half.hpp"

namespace fusedopt::comm::detail {

namespace {

using support::bf16_to_float;
using support::f16_to_float;
using support::float_to_bf16;
using support::float_to_f16;

constexpr std::int64_t kBlock = 512;

template <typename T, typename Acc>
struct Plain {
  static Acc load(const void* p, std::int64_t i) { return static_cast<const T*>(p)[i]; }
  static void store(void* p, std::int64_t i, Acc v) { static_cast<T*>(p)[i] = v; }
};

template <float (*kWiden)(std::uint16_t), std::uint16_t (*kNarrow)(float)>
struct Half {
  static float load(const void* p, std::int64_t i) {
    return kWiden(static_cast<const std::uint16_t*>(p)[i]);
  }
  static void store(void* p, std::int64_t i, float v) {
    static_cast<std::uint16_t*>(p)[i] = kNarrow(v);
  }
};

template <typename Acc>
inline Acc max_nan(Acc x, Acc y) {
  return x != x || y != y ? x + y : (x > y ? x : y);
}

template <typename Acc, typename Io, bool kMax>
void combine(const void* const* src, int sources, void* const* out, int outs, std::int64_t n) {
  Acc acc[kBlock];
  for (std::int64_t b = 0; b < n; b += kBlock) {
    const std::int64_t m = std::min(kBlock, n - b);
    const void* first = src[0];
    for (std::int64_t i = 0; i < m; ++i) acc[i] = Io::load(first, b + i);
    for (int r = 1; r < sources; ++r) {
      const void* s = src[r];
      if (kMax) {
        for (std::int64_t i = 0; i < m; ++i) acc[i] = max_nan(acc[i], Io::load(s, b + i));
      } else {
        for (std::int64_t i = 0; i < m; ++i) acc[i] += Io::load(s, b + i);
      }
    }
    for (int o = 0; o < outs; ++o) {
      void* d = out[o];
      for (std::int64_t i = 0; i < m; ++i) Io::store(d, b + i, acc[i]);
    }
  }
}

template <typename Acc, typename Io>
void combine_op(ReduceOp op, const void* const* src, int sources, void* const* out, int outs,
                std::int64_t n) {
  if (op == ReduceOp::Max) {
    combine<Acc, Io, true>(src, sources, out, outs, n);
  } else {
    combine<Acc, Io, false>(src, sources, out, outs, n);
  }
}

}  // namespace

void shm_combine(DType dtype, bool f64, ReduceOp op, const void* const* src, int sources,
                 void* const* out, int outs, std::int64_t n) {
  if (f64 || dtype == DType::F64) {
    combine_op<double, Plain<double, double>>(op, src, sources, out, outs, n);
    return;
  }
  switch (dtype) {
    case DType::BF16:
      combine_op<float, Half<bf16_to_float, float_to_bf16>>(op, src, sources, out, outs, n);
      return;
    case DType::F16:
      combine_op<float, Half<f16_to_float, float_to_f16>>(op, src, sources, out, outs, n);
      return;
    default:
      combine_op<float, Plain<float, float>>(op, src, sources, out, outs, n);
      return;
  }
}

}  // namespace fusedopt::comm::detail
