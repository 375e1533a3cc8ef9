// runtime::Plan: everything a launch over one tensor list needs, built once on the host:
// the chunk table, the pointer table, the hyper table, each tensor's chunk range, the
// alignment class of each tensor and the layout of the Store strategy's scratch tensors.
// A Binding copies its tables into the backend's memory (the host's as the device's, through
// Backend::allocate and copy_from_host) and launches from that copy (exec/binding.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "abi.h"
#include "kernel_layout.hpp"

namespace fusedopt::runtime {

/// The widest alignment the vector path asks of a role pointer (an fp32 role's 4 elements).
inline constexpr std::size_t kVectorAlign = 16;

/// A tensor as matrices: `batch` matrices of rows x cols (its last two dimensions; fewer
/// than two dimensions: numel rows of one column, one matrix).
struct MatrixShape {
  std::int64_t batch = 1, rows = 0, cols = 1;
};
/// A tensor of `shape` (empty: 1-D of `numel`) as `batch` matrices of rows x cols (its last
/// two dimensions). UsageError when batch * rows or batch * cols does not fit in 64 bits
/// (possible with a 0 dimension: {2^32, 2^32, 0} has no elements but 2^64 rows).
MatrixShape matrix_shape(const std::vector<std::int64_t>& shape, std::int64_t numel);

/// Bytes role `role`'s pointer must be aligned to for the vector path: 4 elements of it
/// (16 for fp32, 8 for fp16/bf16).
std::size_t vector_align(const KernelLayout& body, int role);

/// What a plan is built from.
struct PlanRequest {
  PlanRequest() = default;
  PlanRequest(const char* who_, const std::vector<std::vector<void*>>& ptrs_,
              const std::vector<std::int64_t>& numel_,
              const std::vector<std::vector<double>>& hypers_, const std::vector<int>& group_,
              std::int64_t chunk_elems_)
      : who(who_),
        ptrs(&ptrs_),
        numel(&numel_),
        hypers(&hypers_),
        group(&group_),
        chunk_elems(chunk_elems_) {}

  const char* who = "plan";  ///< prefixes every error ("Binding")
  /// `ptrs[t]`: tensor t's role pointers (param, grad, states, outputs, master), plus the
  /// scratch tensors unless `lay_out_scratch`.
  const std::vector<std::vector<void*>>* ptrs = nullptr;
  const std::vector<std::int64_t>* numel = nullptr;
  const std::vector<std::vector<double>>* hypers = nullptr;  ///< [group][Rule::hypers order]
  const std::vector<int>* group = nullptr;  ///< tensor t's group; null or empty: all 0
  /// Tensor t's shape (its product is numel[t]); null, or an empty list or shape: 1-D.
  const std::vector<std::vector<std::int64_t>>* shapes = nullptr;
  std::int64_t chunk_elems = 1;
  /// The fewest rows a chunk of a factored rule's matrix covers (Backend::factored_min_rows).
  std::int64_t factored_min_rows = 1;
  /// Lay out the Store strategy's scratch tensors (bind_scratch() then points at them)
  /// instead of taking their pointers from `ptrs`.
  bool lay_out_scratch = false;
  std::size_t scratch_align = 64;  ///< alignment of each scratch view, in bytes
};

class Plan {
 public:
  /// Validates the request against `body` (errors name the tensor, role or group) and
  /// builds every table.
  static Plan build(const KernelLayout& body, const PlanRequest& request);

  /// Replaces the hyper table (`hypers[g]`: group g's values).
  void set_hypers(const std::vector<std::vector<double>>& hypers);
  /// Points the scratch roles at views of one allocation of scratch_bytes() at `base`.
  void bind_scratch(void* base);
  /// New role pointers for every tensor (`ptrs[t]`, as PlanRequest::ptrs without the
  /// scratch roles), the sizes unchanged: the pointer table and each tensor's alignment
  /// class are redone, the chunks stay. Nothing changes when it throws.
  void rebind(const KernelLayout& body, const std::vector<std::vector<void*>>& ptrs);

  const std::vector<fo_chunk>& chunks() const { return chunks_; }
  /// [tensor * num_roles() + role].
  const std::vector<void*>& ptrs() const { return ptrs_; }
  /// [group * num_hypers() + hyper], plus one pad value (never empty).
  const std::vector<double>& hypers() const { return hypers_; }
  /// [2 * tensor]: first chunk, chunk count (rules with reductions; else empty).
  const std::vector<long long>& tensor_chunks() const { return tensor_chunks_; }
  /// Per tensor: 1 when every role pointer is aligned to its vector_align().
  const std::vector<unsigned char>& aligned() const { return aligned_; }
  /// Per tensor (empty ones included): its group (at least one entry).
  const std::vector<int>& tensor_groups() const { return tensor_groups_; }
  /// [tensor * 4]: numel, dims, rows, cols of each tensor (the rule's built-in per-tensor
  /// values; fewer than 2 dimensions: numel rows of 1 column), at least 4 entries.
  const std::vector<double>& tensor_info() const { return tensor_info_; }

  std::int64_t num_tensors() const { return num_tensors_; }
  std::int64_t num_chunks() const { return static_cast<std::int64_t>(chunks_.size()); }
  bool empty() const { return chunks_.empty(); }
  int num_roles() const { return num_roles_; }
  int num_hypers() const { return num_hypers_; }
  int num_groups() const { return num_groups_; }
  /// Non-empty tensors that take the vector path.
  int num_aligned() const { return num_aligned_; }

  /// Reduction buffers the launches need: chunk partials (floats), per-tensor totals and
  /// global totals (doubles). Zero for an element-wise rule, except the global slot count.
  std::size_t num_partials() const { return num_partials_; }
  std::size_t num_tensor_totals() const { return num_tensor_totals_; }
  std::size_t num_global_totals() const { return num_global_totals_; }
  /// Per-tensor scalar states (doubles) the launches read and write: num_tensors() times
  /// the rule's scalar count (0: the rule has none).
  std::size_t num_scalars() const { return num_scalars_; }
  // Factored rules (body.factored): chunks cover whole rows of one matrix.
  /// [3 * tensor + 0/1/2]: first row, column and matrix; the last three: the totals.
  const std::vector<long long>& rc_offsets() const { return rc_offsets_; }
  /// [chunk]: offset of the chunk's column sums in the column partials.
  const std::vector<long long>& chunk_cols() const { return chunk_cols_; }
  std::int64_t num_rows() const { return num_rows_; }
  std::int64_t num_cols() const { return num_cols_; }
  std::int64_t num_matrices() const { return num_mats_; }
  std::size_t num_col_partials() const { return num_col_partials_; }
  /// Doubles (floats for states) per row, column or matrix of each buffer: row_mean,
  /// col_mean and matrix_mean slots, row states, column states (at least 1 each).
  struct RcWidths {
    int row_slots = 1, col_slots = 1, matrix_slots = 1, row_states = 1, col_states = 1;
  };
  const RcWidths& rc_widths() const { return rc_widths_; }
  /// Bytes of the scratch allocation bind_scratch() wants (0: none).
  std::size_t scratch_bytes() const { return scratch_bytes_; }

 private:
  void take_tensor(const KernelLayout& body, const PlanRequest& request, std::size_t t,
                   const std::vector<std::int64_t>& shape, int group);
  void lay_out_reductions(const KernelLayout& body);
  void lay_out_factored(const KernelLayout& body, const std::vector<std::int64_t>& numel,
                        const std::vector<std::vector<std::int64_t>>& shapes,
                        std::int64_t chunk_elems, std::int64_t min_rows);
  void lay_out_scratch(const std::vector<std::int64_t>& numel, std::size_t scratch_align);

  std::vector<fo_chunk> chunks_;
  std::vector<void*> ptrs_;
  std::vector<double> hypers_;
  std::vector<long long> tensor_chunks_;
  std::vector<unsigned char> aligned_;
  std::vector<int> tensor_groups_;
  std::vector<double> tensor_info_;
  std::vector<long long> rc_offsets_;
  std::vector<long long> chunk_cols_;
  std::int64_t num_rows_ = 0, num_cols_ = 0, num_mats_ = 0;
  std::size_t num_col_partials_ = 0;
  RcWidths rc_widths_;
  std::vector<std::size_t> scratch_offsets_;  ///< [tensor * scratch values + j], bytes
  const char* who_ = "plan";
  std::int64_t num_tensors_ = 0;
  int num_roles_ = 0;
  int num_scratch_ = 0;
  int num_given_roles_ = 0;  ///< roles PlanRequest::ptrs gave (scratch ones laid out here excluded)
  int num_hypers_ = 0;
  int num_groups_ = 0;
  int num_aligned_ = 0;
  std::size_t num_partials_ = 0;
  std::size_t num_tensor_totals_ = 0;
  std::size_t num_global_totals_ = 0;
  std::size_t num_scalars_ = 0;
  std::size_t scratch_bytes_ = 0;
};

}  // namespace fusedopt::runtime
