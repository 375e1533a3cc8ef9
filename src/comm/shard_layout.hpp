// How a ShardedOptimizer cuts its parameters: each dtype's parameters, laid end to end in
// parameter order, into W equal contiguous shards (the last one shorter); a parameter that
// straddles a boundary has one piece per rank whose shard it overlaps. The optimizer, its
// checkpoints and the checkpoint tools all cut the same way.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::comm::detail {

/// A view of elements [begin, end) of `t`.
Tensor slice(const Tensor& t, std::int64_t begin, std::int64_t end);

/// One rank's piece of a parameter: elements [begin, end).
struct Piece {
  int rank;
  std::int64_t begin, end;
};

/// Each parameter (elements, dtype) cut at the shard boundaries of its dtype over `ranks`.
/// UsageError when a dtype has fewer elements than ranks.
std::vector<std::vector<Piece>> cut_into_shards(
    const std::vector<std::pair<std::int64_t, DType>>& params, int ranks);

}  // namespace fusedopt::comm::detail
