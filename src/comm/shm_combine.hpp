// The combining loops of the shared-memory engine: one pass over every source, in order.
#pragma once

#include <cstdint>

#include "fusedopt/comm.hpp"

namespace fusedopt::comm::detail {

/// out[i] = src[0][i] op src[1][i] op ... op src[sources - 1][i], left to right (the rank
/// order: the same bits whatever the timing), into `out` and, when not null, `copy`; `n`
/// elements of `dtype` (float64 when `f64`). fp16 and bf16 combine in fp32 and round once;
/// a max propagates NaN.
void shm_combine(DType dtype, bool f64, ReduceOp op, const void* const* src, int sources, void* out,
                 void* copy, std::int64_t n);

}  // namespace fusedopt::comm::detail
