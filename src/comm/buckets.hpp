// The bucket layout GradBucketer and ShardedOptimizer share (grad_bucketer.cpp).
#pragma once

#include <vector>

#include "fusedopt/comm.hpp"

namespace fusedopt::comm::detail {

/// GradBucketer::layout, with tensor i going to rank roots[i] (empty: all-reduced): a
/// bucket never holds two roots, so a shard's tensors (a contiguous run) form its own
/// buckets.
std::vector<Bucket> bucket_layout(const std::vector<Tensor>& grads, const BucketOptions& options,
                                  const std::vector<int>& roots);

}  // namespace fusedopt::comm::detail
