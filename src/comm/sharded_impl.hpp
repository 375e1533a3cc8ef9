// ShardedOptimizer's private state, shared by its translation units: the step
// (sharded_optimizer.cpp) and the checkpoints (sharded_checkpoint.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "buckets.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/extension.hpp"
#include "fusedopt/sharded.hpp"
#include "shard_layout.hpp"

namespace fusedopt::comm {

using detail::Piece;

/// The sharded optimizer, and its ops in the local optimizer's step program: `begin`
/// finishes the gradient reduction, `hook k` combines pass k's totals across ranks, `publish`
/// gathers the updated pieces.
struct ShardedOptimizer::Impl final : fusedopt::StepExtension {
  explicit Impl(Communicator c) : comm(std::move(c)) {}
  Communicator comm;
  ShardOptions options;
  int rank = 0;
  int ranks = 1;

  /// Every parameter over all groups, in order.
  std::vector<Tensor> params, grads;
  /// Per parameter: its group.
  std::vector<int> param_group;
  /// Per dtype: elements of its parameters.
  std::map<DType, std::int64_t> total;
  /// Per parameter: its pieces, one per rank whose shard it overlaps.
  std::vector<std::vector<Piece>> cut;
  /// Per parameter: the piece this rank owns, [begin, end) of its elements.
  std::vector<std::pair<std::int64_t, std::int64_t>> owned;
  /// Per local (piece) index of the fused optimizer: the parameter it is a piece of.
  std::vector<int> piece_param;

  std::unique_ptr<Optimizer> local;
  std::unique_ptr<GradBucketer> reducer;
  /// ZeRO-2: per parameter, the reducer's gradient indices of its pieces (one per owner).
  std::vector<std::vector<int>> reducer_grads;
  /// The parameter broadcasts: buckets of pieces, each from its owner.
  std::vector<Bucket> gather;
  /// NCCL: device scratch for the per-tensor totals' all-reduce (grown on demand).
  std::unique_ptr<CudaBuffer> device_table;

  /// Parameter (or gradient) `i` cut at the shard boundaries: (view, owner) per piece.
  std::vector<std::pair<Tensor, int>> pieces(const Tensor& t, std::size_t i) const {
    std::vector<std::pair<Tensor, int>> out;
    for (const Piece& p : cut[i]) out.emplace_back(detail::slice(t, p.begin, p.end), p.rank);
    return out;
  }

  // Construction, step by step (sharded_optimizer.cpp).
  /// Checks every group's params and grads (errors name the param) and takes them.
  void take_params(const std::vector<ParamGroup>& groups);
  /// What every rank must agree on: rule, options, hypers, every param (check_same).
  std::string plan_fingerprint(const Rule& rule, const std::vector<ParamGroup>& groups) const;
  /// The fused optimizer over this rank's pieces, its hook combining totals across ranks.
  void build_local(const Rule& rule, const std::vector<ParamGroup>& groups);
  /// The gradient reducer: all-reduce (ZeRO-1), or each piece to its owner (ZeRO-2).
  void build_reducer();
  /// The parameter broadcasts: buckets of pieces, each from its owner.
  void build_gather();

  /// `begin`: what backward did not mark is reduced, and every reduction finished.
  void begin(void* stream) override;
  /// `hook k`: the local optimizer's totals combined across ranks.
  void combine(const ReductionPartials& p) override;
  /// `publish`: the updated pieces broadcast from their owners (gather_params).
  void publish(void* stream) override { gather_params(stream); }
  /// A matrix stage: each whole matrix gathered on every rank (an all-reduce of the pieces
  /// over zeros), orthogonalized on its owner (matrix_owner), the results all-reduced back
  /// and each piece's part copied into it (sharded_stages.cpp).
  bool orthogonalize(const MatrixStageWork& work) override;
  /// Checks every param is a matrix (on every rank alike: the error names the param) and
  /// gives each an owner rank.
  void assign_matrix_owners(const Rule& rule);
  /// Per parameter: the rank that orthogonalizes it (balanced by the iteration's flops;
  /// empty until a rule with matrix stages needs it).
  std::vector<int> matrix_owner;
  void combine_globals(const ReductionPartials& p);
  void combine_per_tensor(const ReductionPartials& p);
  void exchange_table(const ReductionPartials& p, const std::vector<double*>& totals,
                      const std::vector<int>& columns, std::vector<double>& table, bool back) const;
  void reduce_table(const ReductionPartials& p, std::vector<double>& table, ReduceOp op);
  void gather_params(void* stream);
};

namespace detail {

/// Sums `values` (host memory) over the ranks, staged through device memory when the
/// communicator's buffers live on a CUDA device (NCCL reads device memory only).
void host_all_reduce(Communicator& comm, double* values, std::size_t n);

}  // namespace detail

}  // namespace fusedopt::comm
