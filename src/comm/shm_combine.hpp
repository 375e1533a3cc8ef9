// The combining loops of the shared-memory engine: one pass over every source, in order.
#pragma once

#include <cstdint>

#include "fusedopt/comm.hpp"

namespace fusedopt::comm::detail {

/// out[i] = src[0][i] op src[1][i] op ... op src[sources - 1][i], left to right (the rank
/// order: the same bits whatever the timing), into each of `outs` outputs; `n` elements of
/// `dtype` (float64 when `f64`). An output may be a source (in place: each block is read
/// whole before it is written). fp16 and bf16 combine in fp32 and round once; a max
/// propagates NaN.
void shm_combine(DType dtype, bool f64, ReduceOp op, const void* const* src, int sources,
                 void* const* out, int outs, std::int64_t n);

}  // namespace fusedopt::comm::detail
