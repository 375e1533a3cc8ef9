// Plan::build: validation that names the tensor, then the chunk, pointer, hyper, range,
// alignment and scratch tables, once.
#include "exec/plan.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <numeric>
#include <optional>
#include <string>

#include "exec/chunks.hpp"
#include "fusedopt/error.hpp"
#include "support/check.hpp"
#include "support/checked_math.hpp"

namespace fusedopt::runtime {

namespace {

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

}  // namespace

MatrixShape matrix_shape(const std::vector<std::int64_t>& shape, std::int64_t numel) {
  MatrixShape m;
  if (shape.size() < 2) {
    m.rows = numel;
    return m;
  }
  bool fits = true;
  for (std::size_t d = 0; d + 2 < shape.size() && fits; ++d) {
    const std::optional<std::int64_t> b = support::checked_mul(m.batch, shape[d]);
    fits = b.has_value();
    if (fits) m.batch = *b;
  }
  m.rows = shape[shape.size() - 2];
  m.cols = shape.back();
  fits = fits && support::checked_mul(m.batch, m.rows) && support::checked_mul(m.batch, m.cols);
  if (!fits) {
    std::string dims;
    for (std::int64_t d : shape) dims += (dims.empty() ? "" : ", ") + std::to_string(d);
    throw UsageError(
        fmt::format("shape [{}] has more rows or columns than 64 bits count "
                    "(its row and column states could not be laid out)",
                    dims));
  }
  return m;
}

std::size_t vector_align(const KernelLayout& body, int role) {
  const auto r = static_cast<std::size_t>(role);
  // The vector path moves 4 elements of each role at once: 16 bytes of an fp32 role, 8 of a
  // 16-bit one (4 x bits / 8). A role codegen knows no size for gets the widest.
  return r < body.role_bits.size() && body.role_bits[r] > 0
             ? static_cast<std::size_t>(body.role_bits[r]) / 2
             : kVectorAlign;
}

/// Tensor `t` of `request` (its pointers, size, group and shape checked) into the plan.
void Plan::take_tensor(const KernelLayout& body, const PlanRequest& request, std::size_t t,
                       const std::vector<std::int64_t>& shape, int group) {
  const auto& ptrs = *request.ptrs;
  const auto& numel = *request.numel;
  const char* who = request.who;
  const int given_roles = num_given_roles_;
  FUSEDOPT_CHECK_USAGE(static_cast<int>(ptrs[t].size()) == given_roles,
                       "{}: tensor {} has {} pointers, the kernel needs {}", who, t, ptrs[t].size(),
                       given_roles);
  FUSEDOPT_CHECK_USAGE(numel[t] >= 0, "{}: tensor {} has a negative size", who, t);
  FUSEDOPT_CHECK_USAGE(!(group < 0 || group >= num_groups_),
                       "{}: tensor {} is in group {}, but there are {} groups", who, t, group,
                       num_groups_);
  tensor_groups_[t] = group;
  std::int64_t product = 1;
  for (std::int64_t d : shape) {
    FUSEDOPT_CHECK_USAGE(d >= 0 && (d == 0 || product <= INT64_MAX / d),
                         "{}: tensor {} has a bad shape (a negative or too large dimension)", who,
                         t);
    product *= d;
  }
  FUSEDOPT_CHECK_USAGE(shape.empty() || product == numel[t],
                       "{}: tensor {} has a shape of {} elements but {} elements", who, t, product,
                       numel[t]);
  const bool matrix = shape.size() >= 2;
  double* info = &tensor_info_[4 * t];
  info[0] = static_cast<double>(numel[t]);
  info[1] = static_cast<double>(std::max<std::size_t>(shape.size(), 1));
  info[2] = static_cast<double>(matrix ? shape[shape.size() - 2] : numel[t]);
  info[3] = static_cast<double>(matrix ? shape.back() : 1);
  bool all_aligned = true;
  for (int r = 0; r < given_roles; ++r) {
    void* ptr = ptrs[t][static_cast<std::size_t>(r)];
    FUSEDOPT_CHECK_USAGE(numel[t] == 0 || ptr, "{}: tensor {} role {} is a null pointer", who, t,
                         r);
    all_aligned &= reinterpret_cast<std::uintptr_t>(ptr) % vector_align(body, r) == 0;
    ptrs_[t * static_cast<std::size_t>(num_roles_) + static_cast<std::size_t>(r)] = ptr;
  }
  // Scratch views are laid out kVectorAlign-aligned (scratch_align is a multiple).
  // A tensor whose 16-bit roles sit at 8 bytes still takes the vector path: each role
  // needs only its own 4 elements' width.
  aligned_[t] = all_aligned ? 1 : 0;
  num_aligned_ += all_aligned && numel[t] > 0;
}

Plan Plan::build(const KernelLayout& body, const PlanRequest& request) {
  static const std::vector<int> kNoGroups;
  const auto& ptrs = *request.ptrs;
  const auto& numel = *request.numel;
  const auto& hypers = *request.hypers;
  const auto& group = request.group ? *request.group : kNoGroups;
  const char* who = request.who;
  const std::size_t n = ptrs.size();
  Plan p;
  p.who_ = who;
  p.num_roles_ = body.num_roles;
  p.num_scratch_ = static_cast<int>(body.scratch.size());
  p.num_hypers_ = body.num_hypers;
  const int given_roles = p.num_roles_ - (request.lay_out_scratch ? p.num_scratch_ : 0);
  p.num_given_roles_ = given_roles;
  FUSEDOPT_CHECK_USAGE(numel.size() == n, "{}: {} pointer lists but {} sizes", who, n,
                       numel.size());
  FUSEDOPT_CHECK_USAGE(!(!group.empty() && group.size() != n),
                       "{}: {} tensors but {} group indices", who, n, group.size());
  FUSEDOPT_CHECK_USAGE(!hypers.empty(), "{}: no hyper group given", who);
  FUSEDOPT_CHECK_USAGE(hypers.size() <= static_cast<std::size_t>(INT_MAX), "{}: too many groups",
                       who);
  p.num_groups_ = static_cast<int>(hypers.size());
  p.hypers_.assign(hypers.size() * static_cast<std::size_t>(p.num_hypers_) + 1, 0.0);
  p.set_hypers(hypers);

  p.ptrs_.assign(std::max<std::size_t>(n, 1) * static_cast<std::size_t>(p.num_roles_), nullptr);
  p.aligned_.assign(std::max<std::size_t>(n, 1), 0);
  p.tensor_groups_.assign(std::max<std::size_t>(n, 1), 0);
  p.tensor_info_.assign(4 * std::max<std::size_t>(n, 1), 0.0);
  static const std::vector<std::vector<std::int64_t>> kNoShapes;
  const auto& shapes = request.shapes ? *request.shapes : kNoShapes;
  FUSEDOPT_CHECK_USAGE(shapes.empty() || shapes.size() == n, "{}: {} tensors but {} shapes", who, n,
                       shapes.size());
  for (std::size_t t = 0; t < n; ++t) {
    static const std::vector<std::int64_t> kNoShape;
    p.take_tensor(body, request, t, shapes.empty() ? kNoShape : shapes[t],
                  group.empty() ? 0 : group[t]);
  }
  p.chunks_ = build_chunks(numel, group, request.chunk_elems, p.num_groups_);
  p.num_tensors_ = static_cast<std::int64_t>(n);
  p.num_scalars_ = n * static_cast<std::size_t>(body.num_scalars);

  if (body.factored) {
    p.lay_out_factored(body, numel, shapes, request.chunk_elems, request.factored_min_rows);
  }
  p.lay_out_reductions(body);
  if (request.lay_out_scratch) p.lay_out_scratch(numel, request.scratch_align);
  return p;
}

void Plan::rebind(const KernelLayout& body, const std::vector<std::vector<void*>>& ptrs) {
  const int given_roles = num_given_roles_;
  FUSEDOPT_CHECK_USAGE(static_cast<std::int64_t>(ptrs.size()) == num_tensors_,
                       "{}: rebind: {} pointer lists for {} tensors", who_, ptrs.size(),
                       num_tensors_);
  std::vector<void*> table = ptrs_;
  std::vector<unsigned char> aligned = aligned_;
  int num_aligned = 0;
  for (std::size_t t = 0; t < ptrs.size(); ++t) {
    FUSEDOPT_CHECK_USAGE(static_cast<int>(ptrs[t].size()) == given_roles,
                         "{}: rebind: tensor {} has {} pointers, the kernel needs {}", who_, t,
                         ptrs[t].size(), given_roles);
    const bool empty = tensor_info_[4 * t] == 0.0;
    bool all_aligned = true;
    for (int r = 0; r < given_roles; ++r) {
      void* ptr = ptrs[t][static_cast<std::size_t>(r)];
      FUSEDOPT_CHECK_USAGE(empty || ptr, "{}: rebind: tensor {} role {} is a null pointer", who_, t,
                           r);
      all_aligned &= reinterpret_cast<std::uintptr_t>(ptr) % vector_align(body, r) == 0;
      table[t * static_cast<std::size_t>(num_roles_) + static_cast<std::size_t>(r)] = ptr;
    }
    aligned[t] = all_aligned ? 1 : 0;
    num_aligned += all_aligned && !empty;
  }
  ptrs_ = std::move(table);
  aligned_ = std::move(aligned);
  num_aligned_ = num_aligned;
}

void Plan::lay_out_factored(const KernelLayout& body, const std::vector<std::int64_t>& numel,
                            const std::vector<std::vector<std::int64_t>>& shapes,
                            std::int64_t chunk_elems, std::int64_t min_rows) {
  static const std::vector<std::int64_t> kNoShape;
  const std::size_t n = numel.size();
  rc_widths_.row_slots = std::max(body.num_row_slots, 1);
  rc_widths_.col_slots = std::max(body.num_col_slots, 1);
  rc_widths_.matrix_slots = std::max(body.num_matrix_slots, 1);
  rc_widths_.row_states = std::max(body.num_row_states, 1);
  rc_widths_.col_states = std::max(body.num_col_states, 1);
  std::vector<MatrixShape> m(n);
  rc_offsets_.assign(3 * (n + 1), 0);
  for (std::size_t t = 0; t < n; ++t) {
    m[t] = matrix_shape(shapes.empty() ? kNoShape : shapes[t], numel[t]);
    rc_offsets_[3 * t] = num_rows_;
    rc_offsets_[3 * t + 1] = num_cols_;
    rc_offsets_[3 * t + 2] = num_mats_;
    // Each product fits (matrix_shape); their sums over tensors are checked too.
    const std::optional<std::int64_t> rows =
        support::checked_add(num_rows_, m[t].batch * m[t].rows);
    const std::optional<std::int64_t> cols =
        support::checked_add(num_cols_, m[t].batch * m[t].cols);
    const std::optional<std::int64_t> mats = support::checked_add(num_mats_, m[t].batch);
    FUSEDOPT_CHECK_USAGE(rows && cols && mats,
                         "tensor {}: the rows and columns of the tensors up to it overflow 64 bits",
                         t);
    num_rows_ = *rows;
    num_cols_ = *cols;
    num_mats_ = *mats;
  }
  rc_offsets_[3 * n] = num_rows_;
  rc_offsets_[3 * n + 1] = num_cols_;
  rc_offsets_[3 * n + 2] = num_mats_;
  // Whole rows of one matrix per chunk, in the order build_chunks put the tensors: about
  // chunk_elems elements, or min_rows rows where that is more, up to 16 x chunk_elems (so a
  // very wide matrix still splits into chunks of a few rows); one row at least.
  std::vector<fo_chunk> chunks;
  std::vector<bool> seen(n, false);
  // Per column of each chunk: its sums (doubles), then its column values (floats, two to a
  // double; KernelLayout::num_col_values).
  const auto slots =
      static_cast<long long>(std::max(body.num_col_slots, 1)) + (body.num_col_values + 1) / 2;
  for (const fo_chunk& old : chunks_) {
    const auto t = static_cast<std::size_t>(old.tensor);
    if (seen[t]) continue;
    seen[t] = true;
    const MatrixShape& s = m[t];
    const std::int64_t wide = std::min<std::int64_t>(min_rows, 16 * chunk_elems / s.cols);
    std::int64_t per = std::max<std::int64_t>({1, wide, chunk_elems / s.cols});
    if (body.quant_block > 0 && numel[t] > 0) {
      // Quantized states: every chunk begins on an absmax block (the update rewrites whole
      // blocks), so whole rows of a multiple of the block, and each matrix starts on one.
      const std::int64_t B = body.quant_block, step = B / std::gcd(B, s.cols);
      per = (per + step - 1) / step * step;
      FUSEDOPT_CHECK_USAGE(s.batch == 1 || (s.rows * s.cols) % B == 0,
                           "{}: tensor {} is {} matrices of {} x {}: with quantized states each "
                           "must start on a block of {} elements (the optimizer keeps such "
                           "tensors' states unquantized)",
                           who_, t, s.batch, s.rows, s.cols, B);
    }
    for (std::int64_t b = 0; b < s.batch; ++b) {
      for (std::int64_t r = 0; r < s.rows; r += per) {
        fo_chunk c = old;
        c.begin = (b * s.rows + r) * s.cols;
        c.end = (b * s.rows + std::min(s.rows, r + per)) * s.cols;
        chunks.push_back(c);
        chunk_cols_.push_back(static_cast<long long>(num_col_partials_));
        num_col_partials_ += static_cast<std::size_t>(s.cols * slots);
      }
    }
  }
  chunks_ = std::move(chunks);
}

void Plan::lay_out_reductions(const KernelLayout& body) {
  const auto n = static_cast<std::size_t>(num_tensors_);
  num_global_totals_ = static_cast<std::size_t>(body.num_global_slots);
  if (body.reduction_passes == 0) return;
  num_partials_ = std::max<std::size_t>(chunks_.size(), 1) * static_cast<std::size_t>(body.max_acc);
  num_tensor_totals_ =
      std::max<std::size_t>(n, 1) * static_cast<std::size_t>(body.num_tensor_slots);
  tensor_chunks_.assign(2 * std::max<std::size_t>(n, 1), 0);
  for (std::size_t c = 0; c < chunks_.size(); ++c) {  // a tensor's chunks are adjacent
    long long* range = &tensor_chunks_[2 * static_cast<std::size_t>(chunks_[c].tensor)];
    if (range[1] == 0) range[0] = static_cast<long long>(c);
    ++range[1];
  }
}

void Plan::lay_out_scratch(const std::vector<std::int64_t>& numel, std::size_t scratch_align) {
  if (num_scratch_ == 0) return;
  const std::size_t align = std::max(scratch_align, kVectorAlign);
  for (std::int64_t n : numel) {
    for (int j = 0; j < num_scratch_; ++j) {
      scratch_offsets_.push_back(scratch_bytes_);
      scratch_bytes_ += round_up(static_cast<std::size_t>(n) * sizeof(float), align);
    }
  }
}

void Plan::bind_scratch(void* base) {
  if (scratch_offsets_.empty()) return;
  const int first = num_roles_ - num_scratch_;
  for (std::int64_t t = 0; t < num_tensors_; ++t) {
    for (int j = 0; j < num_scratch_; ++j) {
      const std::size_t offset =
          scratch_offsets_[static_cast<std::size_t>(t) * static_cast<std::size_t>(num_scratch_) +
                           static_cast<std::size_t>(j)];
      ptrs_[static_cast<std::size_t>(t) * static_cast<std::size_t>(num_roles_) +
            static_cast<std::size_t>(first + j)] = static_cast<std::byte*>(base) + offset;
    }
  }
}

void Plan::set_hypers(const std::vector<std::vector<double>>& hypers) {
  FUSEDOPT_CHECK_USAGE(static_cast<int>(hypers.size()) == num_groups_,
                       "{}: {} hyper groups given, the plan has {}", who_, hypers.size(),
                       num_groups_);
  for (std::size_t g = 0; g < hypers.size(); ++g) {
    FUSEDOPT_CHECK_USAGE(static_cast<int>(hypers[g].size()) == num_hypers_,
                         "{}: group {} has {} hyper values, the rule has {}", who_, g,
                         hypers[g].size(), num_hypers_);
    std::copy(hypers[g].begin(), hypers[g].end(),
              hypers_.begin() + static_cast<std::ptrdiff_t>(g * num_hypers_));
  }
}

}  // namespace fusedopt::runtime
