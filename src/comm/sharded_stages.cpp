// ShardedOptimizer's matrix stages (a rule's orthogonalize over ZeRO pieces): every rank
// holds a range of each param, the iteration needs the whole matrix. Each matrix gets an
// owner rank, the one with the least work so far when the matrices are taken by decreasing
// flops (the same on every rank); the pieces are summed into zeroed whole matrices by one
// all-reduce, each owner orthogonalizes its matrices, a second all-reduce (zeros where a
// rank owns nothing) brings every result to every rank, and each piece takes its part.
// The element-wise passes around the stage stay sharded.
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "fusedopt/error.hpp"
#include "sharded_impl.hpp"
#include "support/check.hpp"

namespace fusedopt::comm {

namespace {

double iteration_flops(std::int64_t rows, std::int64_t cols) {
  const double m = static_cast<double>(std::min(rows, cols));
  const double n = static_cast<double>(std::max(rows, cols));
  return m * m * n + m * m * m + m * n * m;  // per round, in multiply-adds
}

}  // namespace

void ShardedOptimizer::Impl::assign_matrix_owners(const Rule& rule) {
  FUSEDOPT_CHECK_AVAILABLE(
      comm.device().kind != Device::Kind::Cuda,
      "ShardedOptimizer: rule '{}' has matrix stages (orthogonalize), which a sharded "
      "optimizer gathers on the host; over NCCL (device memory) that is not supported yet: "
      "use an MPI communicator, or an Optimizer per rank",
      rule.name());
  std::vector<double> cost(params.size(), 0.0);
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    FUSEDOPT_CHECK_USAGE(
        p.shape.size() >= 2,
        "ShardedOptimizer: param {} ('{}') is {}: rule '{}' orthogonalizes every param, and "
        "orthogonalize() takes a matrix (give the param its shape, or 1-D params another rule)",
        i, p.name, p.shape.empty() ? std::string("1-D (no shape given)") : std::string("1-D"),
        rule.name());
    if (p.numel > 0) cost[i] = iteration_flops(p.shape[0], p.numel / p.shape[0]);
  }
  std::vector<std::size_t> order(params.size());
  std::iota(order.begin(), order.end(), std::size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](std::size_t a, std::size_t b) { return cost[a] > cost[b]; });
  std::vector<double> load(static_cast<std::size_t>(ranks), 0.0);
  matrix_owner.assign(params.size(), 0);
  for (std::size_t i : order) {
    const auto r =
        static_cast<std::size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    matrix_owner[i] = static_cast<int>(r);
    load[r] += cost[i];
  }
}

bool ShardedOptimizer::Impl::orthogonalize(const MatrixStageWork& work) {
  FUSEDOPT_CHECK_INTERNAL(work.device.kind != Device::Kind::Cuda,
                          "a sharded matrix stage on a device");
  FUSEDOPT_CHECK_INTERNAL(!matrix_owner.empty(), "matrix stages without owners");
  std::vector<std::int64_t> at(params.size() + 1, 0);  // each param's offset in `whole`
  for (std::size_t i = 0; i < params.size(); ++i) at[i + 1] = at[i] + params[i].numel;
  std::vector<float> whole(static_cast<std::size_t>(at.back()));
  // The stages of this pass are the rule's (the same on every rank, pieces or none).
  for (int stage : work.stages) {
    std::fill(whole.begin(), whole.end(), 0.0f);
    for (const MatrixStageWork::Piece& p : work.pieces) {
      if (p.stage != stage) continue;
      std::memcpy(whole.data() + at[static_cast<std::size_t>(p.param)] + p.offset, p.data,
                  static_cast<std::size_t>(p.numel) * sizeof(float));
    }
    comm.all_reduce(whole.data(), static_cast<std::int64_t>(whole.size()), DType::F32,
                    ReduceOp::Sum)
        .wait();
    for (std::size_t i = 0; i < params.size(); ++i) {
      float* m = whole.data() + at[i];
      const Tensor& p = params[i];
      if (matrix_owner[i] != rank) {
        std::fill(m, m + p.numel, 0.0f);
      } else if (p.numel > 0) {
        work.orthogonalize(stage, param_group[i], m, p.shape[0], p.numel / p.shape[0]);
      }
    }
    comm.all_reduce(whole.data(), static_cast<std::int64_t>(whole.size()), DType::F32,
                    ReduceOp::Sum)
        .wait();
    for (const MatrixStageWork::Piece& p : work.pieces) {
      if (p.stage != stage) continue;
      std::memcpy(p.data, whole.data() + at[static_cast<std::size_t>(p.param)] + p.offset,
                  static_cast<std::size_t>(p.numel) * sizeof(float));
    }
  }
  return true;
}

}  // namespace fusedopt::comm
