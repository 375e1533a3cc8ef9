// How a ShardedOptimizer cuts its parameters: each dtype's parameters, laid end to end in
// parameter order, into W equal contiguous shards (the last one shorter); a parameter that
// straddles a boundary has one piece per rank whose shard it overlaps. A parameter with
// block-quantized states is cut only on its blocks' boundaries (the nearest one), so each
// piece quantizes as the whole param does. The optimizer, its checkpoints and the
// checkpoint tools all cut the same way, and the index of a sharded checkpoint lists its
// pieces.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
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

/// Each parameter (elements, dtype) cut at the shard boundaries of its dtype over `ranks`;
/// parameter i only at multiples of align[i] (empty: 1 for every one), the boundary moved
/// to the nearest. UsageError when a dtype has fewer elements than ranks, or when the
/// aligned cut leaves a rank none of a dtype (the error says how to fix it).
std::vector<std::vector<Piece>> cut_into_shards(
    const std::vector<std::pair<std::int64_t, DType>>& params, int ranks,
    const std::vector<std::int64_t>& align = {});

/// How a state tensor saved for a piece follows the piece's elements: `per` param elements
/// to each of its elements. 1: a value (or an 8-bit code) per element; 2: 4-bit codes, two
/// per byte; a block: one absmax per block (NAME.absmax).
struct StateCut {
  std::int64_t per = 1;
  /// Its elements that hold param elements [a, b) of the piece (a a multiple of per).
  std::pair<std::int64_t, std::int64_t> range(std::int64_t a, std::int64_t b) const {
    return {a / per, (b + per - 1) / per};
  }
};

/// The cut of state tensor `state` of `count` elements saved for `numel` param elements:
/// an absmax ("NAME.absmax") has one per `block` elements (0: the block, a power of two
/// from 32 to 512, that its count implies; the smallest when several do); codes have one
/// per element or one per two. nullopt when the count fits none of these.
std::optional<StateCut> state_cut(const std::string& state, std::int64_t count, std::int64_t numel,
                                  std::int64_t block);

}  // namespace fusedopt::comm::detail
