// The checks and derived values of dim-0 pieces (pieces.hpp).
#include "optimizer/pieces.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "exec/plan.hpp"
#include "fusedopt/error.hpp"
#include "support/check.hpp"
#include "support/checked_math.hpp"

namespace fusedopt::runtime {

namespace {

std::string dims_text(const std::vector<std::int64_t>& shape) {
  std::string dims;
  for (std::int64_t d : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  return "[" + dims + "]";
}

}  // namespace

void infer_piece_shape(Tensor& t) {
  if (t.whole_shape.size() < 2 || !t.shape.empty()) return;
  std::int64_t row = 1;
  for (std::size_t d = 1; d < t.whole_shape.size(); ++d) {
    const std::optional<std::int64_t> r = support::checked_mul(row, t.whole_shape[d]);
    if (!r || t.whole_shape[d] < 0) return;  // validate_piece names the bad whole_shape
    row = *r;
  }
  if (row <= 0 || t.numel < 0 || t.numel % row != 0) return;
  t.shape = t.whole_shape;
  t.shape[0] = t.numel / row;
}

void validate_piece(const Tensor& t, const std::string& who) {
  if (t.whole_shape.empty()) {
    FUSEDOPT_CHECK_USAGE(t.whole_offset == 0,
                         "{}: whole_offset is {} but whole_shape is empty (a piece gives the "
                         "whole tensor's shape; an empty one means the tensor is whole)",
                         who, t.whole_offset);
    return;
  }
  const std::vector<std::int64_t> piece =
      t.shape.empty() ? std::vector<std::int64_t>{t.numel} : t.shape;
  std::int64_t elements = 1;
  for (std::int64_t d : t.whole_shape) {
    FUSEDOPT_CHECK_USAGE(d >= 0, "{}: whole_shape {} has a negative dimension", who,
                         dims_text(t.whole_shape));
    const std::optional<std::int64_t> e = support::checked_mul(elements, d);
    FUSEDOPT_CHECK_USAGE(e.has_value(), "{}: whole_shape {} has more elements than 64 bits count",
                         who, dims_text(t.whole_shape));
    elements = *e;
  }
  bool same = piece.size() == t.whole_shape.size();
  for (std::size_t d = 1; d < piece.size() && same; ++d) same = piece[d] == t.whole_shape[d];
  FUSEDOPT_CHECK_USAGE(same,
                       "{}: shape {} is not a dim-0 piece of whole_shape {} (a piece has the "
                       "whole's shape but in dim 0)",
                       who, dims_text(piece), dims_text(t.whole_shape));
  FUSEDOPT_CHECK_USAGE(t.whole_offset >= 0 && t.whole_offset <= t.whole_shape[0] - piece[0],
                       "{}: rows [{}, {}) of dim 0 are not within whole_shape {} (whole_offset "
                       "{} + {} rows must be at most {})",
                       who, t.whole_offset, t.whole_offset + piece[0], dims_text(t.whole_shape),
                       t.whole_offset, piece[0], t.whole_shape[0]);
  try {
    (void)matrix_shape(t.whole_shape, elements);
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}: whole_shape {}", who, e.what()));
  }
}

std::int64_t whole_numel(const Tensor& t) {
  if (t.whole_shape.empty()) return t.numel;
  std::int64_t n = 1;
  for (std::int64_t d : t.whole_shape) n *= d;  // fits: validate_piece
  return n;
}

long long piece_offset(const Tensor& t) {
  const std::vector<std::int64_t>& w = t.whole_shape;
  long long row = 1;
  for (std::size_t d = 1; d < w.size(); ++d) row *= w[d];
  return w.empty() ? 0 : static_cast<long long>(t.whole_offset) * row;
}

void append_whole_info(const Tensor& t, std::vector<double>& info) {
  const std::vector<std::int64_t>& shape = t.whole_shape.empty() ? t.shape : t.whole_shape;
  const std::int64_t numel = whole_numel(t);
  const bool matrix = shape.size() >= 2;
  info.push_back(static_cast<double>(numel));
  info.push_back(static_cast<double>(std::max<std::size_t>(shape.size(), 1)));
  info.push_back(static_cast<double>(matrix ? shape[shape.size() - 2] : numel));
  info.push_back(static_cast<double>(matrix ? shape.back() : 1));
}

bool spans_pieces(const Tensor& t) { return !t.whole_shape.empty() && t.whole_shape.size() <= 2; }

}  // namespace fusedopt::runtime
