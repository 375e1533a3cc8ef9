// The shard layout (see shard_layout.hpp).
#include "comm/shard_layout.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "support/check.hpp"

namespace fusedopt::comm::detail {

Tensor slice(const Tensor& t, std::int64_t begin, std::int64_t end) {
  Tensor v = t;
  v.data = static_cast<std::byte*>(t.data) + begin * static_cast<std::int64_t>(dtype_size(t.dtype));
  v.numel = end - begin;
  return v;
}

std::vector<std::vector<Piece>> cut_into_shards(
    const std::vector<std::pair<std::int64_t, DType>>& params, int ranks) {
  std::map<DType, std::int64_t> total;
  for (const auto& [n, d] : params) total[d] += n;
  std::map<DType, std::int64_t> shard, offset;
  for (const auto& [d, n] : total) {
    FUSEDOPT_CHECK_USAGE(n >= ranks,
                         "the {} parameters hold {} elements, fewer than the {} ranks (every "
                         "rank must own some of each dtype)",
                         to_string(d), n, ranks);
    shard[d] = (n + ranks - 1) / ranks;
  }
  std::vector<std::vector<Piece>> out(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto [n, d] = params[i];
    const std::int64_t s = shard[d], at = offset[d];
    for (std::int64_t e = 0; e < n;) {
      const int r = static_cast<int>((at + e) / s);
      const std::int64_t end = std::min(n, (r + 1) * s - at);
      out[i].push_back({r, e, end});
      e = end;
    }
    offset[d] += n;
  }
  return out;
}

}  // namespace fusedopt::comm::detail
