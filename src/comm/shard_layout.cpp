// The shard layout (see shard_layout.hpp).
#include "shard_layout.hpp"

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
    const std::vector<std::pair<std::int64_t, DType>>& params, int ranks,
    const std::vector<std::int64_t>& align) {
  std::map<DType, std::int64_t> total;
  for (const auto& [n, d] : params) total[d] += n;
  std::map<DType, std::int64_t> shard, offset;
  for (const auto& [d, n] : total) {
    FUSEDOPT_CHECK_USAGE(n >= ranks,
                         "the {} parameters hold {} elements, fewer than the {} ranks (every "
                         "rank must own some of each dtype)",
                         to_string(d), n, ranks);  // else a shard would be empty
    shard[d] = (n + ranks - 1) / ranks;
  }
  std::vector<std::vector<Piece>> out(params.size());
  std::vector<std::int64_t> owned(static_cast<std::size_t>(ranks), 0);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto [n, d] = params[i];
    const std::int64_t s = shard[d], at = offset[d];
    offset[d] += n;
    if (n == 0) continue;
    const std::int64_t a = align.empty() ? 1 : std::max<std::int64_t>(1, align[i]);
    // Where rank r's shard begins inside this param, moved to the nearest multiple of a.
    auto start = [&](int r) {
      const std::int64_t x = std::clamp<std::int64_t>(r * s - at, 0, n);
      return std::min(n, (x + a / 2) / a * a);
    };
    const int first = static_cast<int>(at / s), last = static_cast<int>((at + n - 1) / s);
    for (int r = first; r <= last; ++r) {
      const std::int64_t begin = r == first ? 0 : start(r), end = r == last ? n : start(r + 1);
      if (begin >= end) continue;
      out[i].push_back({r, begin, end});
      owned[static_cast<std::size_t>(r)] += end - begin;
    }
  }
  // A rank without any piece would have no optimizer to run.
  for (int r = 0; r < ranks; ++r) {
    FUSEDOPT_CHECK_USAGE(owned[static_cast<std::size_t>(r)] > 0,
                         "cut into {} shards{}, the parameters leave rank {} none of their "
                         "elements: use fewer ranks{}",
                         ranks, align.empty() ? "" : " on the blocks of their quantized states", r,
                         align.empty() ? "" : " or a smaller quant_block");
  }
  return out;
}

std::optional<StateCut> state_cut(const std::string& state, std::int64_t count, std::int64_t numel,
                                  std::int64_t block) {
  const std::string suffix = ".absmax";
  const bool absmax = state.size() > suffix.size() &&
                      state.compare(state.size() - suffix.size(), suffix.size(), suffix) == 0;
  auto blocks = [&](std::int64_t b) { return (numel + b - 1) / b; };
  if (absmax) {
    for (std::int64_t b = 32; b <= 512 && block == 0; b *= 2) {
      if (blocks(b) == count) block = b;
    }
    if (block <= 0 || blocks(block) != count) return std::nullopt;
    return StateCut{block};
  }
  if (count == numel) return StateCut{1};
  if (count == (numel + 1) / 2) return StateCut{2};
  return std::nullopt;
}

}  // namespace fusedopt::comm::detail
