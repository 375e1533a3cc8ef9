// The chunk table of a launch: which elements of which tensor each work item covers.
// Shared by the host and CUDA runtimes; needs no device, so it is tested on any machine.
#pragma once

#include <cstdint>
#include <vector>

#include "abi.h"

namespace fusedopt::runtime {

/// Splits every tensor into chunks of at most `chunk_elems` elements: tensor t, elements
/// [begin, end), 64-bit offsets (tensors of 2^31 elements and more are covered exactly).
/// Empty tensors get no chunk; chunks are ordered by group (stable: tensor order within a
/// group), so a block or thread recomputes its uniforms rarely. Each chunk begins at a
/// multiple of `chunk_elems` within its tensor. `group` is empty (all group 0) or one
/// entry per tensor. Throws fusedopt::Error for a negative size, a negative group, a
/// group at or past `num_groups` (when num_groups >= 0), a chunk size below 1, or more
/// tensors or groups than an int holds.
std::vector<fo_chunk> build_chunks(const std::vector<std::int64_t>& numel,
                                   const std::vector<int>& group, std::int64_t chunk_elems,
                                   int num_groups = -1);

}  // namespace fusedopt::runtime
