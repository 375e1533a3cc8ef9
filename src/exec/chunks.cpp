// build_chunks: the chunk table, with 64-bit offsets and no chunk for an empty tensor.
#include "exec/chunks.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <numeric>

#include "fusedopt/error.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {

std::vector<fo_chunk> build_chunks(const std::vector<std::int64_t>& numel,
                                   const std::vector<int>& group, std::int64_t chunk_elems,
                                   int num_groups) {
  const std::size_t n = numel.size();
  FUSEDOPT_CHECK_USAGE(chunk_elems >= 1, "chunk size {} is below 1", chunk_elems);
  FUSEDOPT_CHECK_USAGE(!(!group.empty() && group.size() != n), "{} tensors but {} group indices", n,
                       group.size());
  if (n > static_cast<std::size_t>(INT_MAX))
    throw UsageError(fmt::format("{} tensors: at most {}", n, INT_MAX));
  auto group_of = [&](std::size_t t) { return group.empty() ? 0 : group[t]; };
  std::size_t total = 0;
  for (std::size_t t = 0; t < n; ++t) {
    FUSEDOPT_CHECK_USAGE(numel[t] >= 0, "tensor {} has a negative size ({})", t, numel[t]);
    const int g = group_of(t);
    FUSEDOPT_CHECK_USAGE(g >= 0, "tensor {} has a negative group ({})", t, g);
    if (num_groups >= 0 && g >= num_groups) {
      throw UsageError(
          fmt::format("tensor {} is in group {}, but there are {} groups", t, g, num_groups));
    }
    // Ceiling division without overflow (numel may be close to INT64_MAX).
    total += static_cast<std::size_t>(numel[t] / chunk_elems + (numel[t] % chunk_elems != 0));
  }
  std::vector<std::size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return group_of(a) < group_of(b); });
  std::vector<fo_chunk> chunks;
  // A bound on the table (2^31 chunks: 2^46 elements at the host's chunk size), so that a
  // request of 2^62 elements is refused rather than failing to allocate the table.
  FUSEDOPT_CHECK_USAGE(total <= static_cast<std::size_t>(INT_MAX),
                       "{} chunks of {} elements: the tensors are too large for one plan "
                       "(at most {} chunks)",
                       total, chunk_elems, INT_MAX);
  chunks.reserve(total);
  for (std::size_t t : order) {
    const std::int64_t size = numel[t];
    for (std::int64_t b = 0; b < size; b += chunk_elems) {
      fo_chunk c{};
      c.tensor = static_cast<int>(t);
      c.group = group_of(t);
      c.begin = static_cast<long long>(b);
      c.end = static_cast<long long>(size - b > chunk_elems ? b + chunk_elems : size);
      chunks.push_back(c);
      if (size - b <= chunk_elems) break;  // b + chunk_elems could overflow past INT64_MAX
    }
  }
  return chunks;
}

}  // namespace fusedopt::runtime
