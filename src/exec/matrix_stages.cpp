// MatrixStages (matrix_stages.hpp).
#include "exec/matrix_stages.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <tuple>

#include "exec/binding.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::runtime {

MatrixStages::MatrixStages(const KernelLayout& layout, const BindingTensors& tensors,
                           const Plan& plan)
    : stages_(layout.stages), hyper_names_(layout.hypers), bf16_(tensors.stage_bf16) {
  if (stages_.empty()) return;
  const std::size_t n = tensors.numel.size();
  dims_.resize(n);
  for (std::size_t t = 0; t < n; ++t) {
    const std::string name = t < tensors.names.size() && !tensors.names[t].empty()
                                 ? tensors.names[t]
                                 : fmt::format("tensor {}", t);
    const std::int64_t numel = tensors.numel[t];
    const std::vector<std::int64_t> shape =
        t < tensors.whole_shapes.size() ? tensors.whole_shapes[t]
        : t < tensors.shapes.size()     ? tensors.shapes[t]
                                        : std::vector<std::int64_t>{};
    if (shape.size() < 2) {
      throw UsageError(fmt::format(
          "{}: orthogonalize() at line {} takes a matrix, and this param is 1-D ({} elements); "
          "give 1-D params (biases, norms' weights) a rule without orthogonalize(), e.g. a "
          "param group with the rule 'adamw'",
          name, stages_.front().line, numel));
    }
    std::int64_t whole = 1;
    for (std::int64_t d : shape) whole *= d;
    Dims& d = dims_[t];
    d.numel = numel;
    d.piece = numel != whole;
    d.param = 2 * t + 1 < tensors.ids.size() ? tensors.ids[2 * t] : static_cast<long long>(t);
    d.offset = 2 * t + 1 < tensors.ids.size() ? tensors.ids[2 * t + 1] : 0;
    pieces_ = pieces_ || d.piece;
    if (numel == 0 || whole == 0) continue;
    // The matrix of a param of more dimensions: its first dimension by the rest, as the
    // reference Muon flattens a convolution's filters.
    d.rows = shape[0];
    d.cols = whole / shape[0];
  }
  const int groups = plan.num_groups();
  const int h = plan.num_hypers();
  for (int g = 0; g < groups; ++g) {
    for (const MatrixStageLayout& st : stages_) {
      iteration(st, plan.hypers().data() + static_cast<std::ptrdiff_t>(g) * h, g);
    }
  }
}

bool MatrixStages::after(int pass) const {
  for (const MatrixStageLayout& st : stages_) {
    if (st.pass == pass) return true;
  }
  return false;
}

void MatrixStages::check_hypers(const std::vector<std::vector<double>>& hypers) const {
  for (std::size_t g = 0; g < hypers.size(); ++g) {
    for (const MatrixStageLayout& st : stages_) {
      iteration(st, hypers[g].data(), static_cast<int>(g));
    }
  }
}

matrix::NewtonSchulz MatrixStages::iteration(const MatrixStageLayout& st, const double* hypers,
                                             int group) const {
  auto value = [&](const StageNumber& v) { return v.hyper >= 0 ? hypers[v.hyper] : v.number; };
  auto fail = [&](const StageNumber& v, double x, const char* what) {
    const std::string who =
        v.hyper >= 0 ? fmt::format("hyper '{}'", hyper_names_.at(static_cast<std::size_t>(v.hyper)))
                     : std::string("the literal");
    throw UsageError(fmt::format("param group {}: orthogonalize() at line {}: {} is {}; {}", group,
                                 st.line, who, x, what));
  };
  matrix::NewtonSchulz ns;
  const double steps = value(st.steps);
  if (!(steps >= 1 && steps <= 100) || std::floor(steps) != steps) {
    fail(st.steps, steps, "the steps are a whole number from 1 to 100");
  }
  ns.steps = static_cast<int>(steps);
  ns.coefficients.clear();
  for (const auto& triple : st.coefficients) {
    std::array<float, 3> k{};
    for (std::size_t j = 0; j < 3; ++j) {
      const double x = value(triple[j]);
      if (!std::isfinite(x) || std::abs(x) > 1e6) {
        fail(triple[j], x, "a coefficient is finite and at most 1e6 in magnitude");
      }
      k[j] = static_cast<float>(x);
    }
    ns.coefficients.push_back(k);
  }
  if (ns.coefficients.size() > 1 && ns.coefficients.size() < static_cast<std::size_t>(ns.steps)) {
    fail(st.steps, steps,
         fmt::format("there are {} coefficient triples: one for all steps, or one for each",
                     ns.coefficients.size())
             .c_str());
  }
  // Fewer steps than a schedule's triples: its first rounds.
  if (ns.coefficients.size() > static_cast<std::size_t>(ns.steps)) {
    ns.coefficients.resize(static_cast<std::size_t>(ns.steps));
  }
  const double eps = value(st.eps);
  if (!(eps > 0) || !std::isfinite(eps) || static_cast<float>(eps) <= 0) {
    fail(st.eps, eps, "eps is a positive number (at least float's smallest)");
  }
  ns.eps = static_cast<float>(eps);
  ns.bf16 = bf16_;
  return ns;
}

matrix::NewtonSchulz MatrixStages::iteration(int stage, int group, const Plan& plan) const {
  return iteration(stages_.at(static_cast<std::size_t>(stage)),
                   plan.hypers().data() + static_cast<std::ptrdiff_t>(group) * plan.num_hypers(),
                   group);
}

void MatrixStages::add_work(int pass, const Plan& plan, MatrixStageWork& work) const {
  const int roles = plan.num_roles();
  const std::vector<int>& groups = plan.tensor_groups();
  for (std::size_t j = 0; j < stages_.size(); ++j) {
    if (stages_[j].pass != pass) continue;
    if (std::find(work.stages.begin(), work.stages.end(), static_cast<int>(j)) ==
        work.stages.end()) {
      work.stages.push_back(static_cast<int>(j));
    }
    for (std::size_t t = 0; t < dims_.size(); ++t) {
      const Dims& d = dims_[t];
      if (d.rows == 0 || d.numel == 0) continue;
      MatrixStageWork::Piece p;
      p.data = static_cast<float*>(plan.ptrs()[t * static_cast<std::size_t>(roles) +
                                               static_cast<std::size_t>(stages_[j].role)]);
      p.numel = d.numel;
      p.param = d.param;
      p.offset = d.offset;
      p.rows = d.rows;
      p.cols = d.cols;
      p.stage = static_cast<int>(j);
      p.group = t < groups.size() ? groups[t] : 0;
      work.pieces.push_back(p);
    }
  }
}

void MatrixStages::run(int pass, Backend& backend, const Plan& plan, void* stream) const {
  if (pieces_ && after(pass)) {
    throw UsageError(
        "orthogonalize() needs each matrix whole, and this optimizer's params are pieces of "
        "theirs: step them through a ShardedOptimizer (which gathers each matrix to one rank "
        "for its stage), not a plain Optimizer over pieces");
  }
  const int h = plan.num_hypers();
  const int roles = plan.num_roles();
  const std::vector<int>& groups = plan.tensor_groups();
  for (const MatrixStageLayout& st : stages_) {
    if (st.pass != pass) continue;
    // Batched: the same-shape matrices of one iteration together.
    std::map<std::tuple<std::int64_t, std::int64_t, int>, std::vector<float*>> batches;
    for (std::size_t t = 0; t < dims_.size(); ++t) {
      if (dims_[t].rows == 0) continue;
      const int g = t < groups.size() ? groups[t] : 0;
      batches[{dims_[t].rows, dims_[t].cols, g}].push_back(static_cast<float*>(
          plan.ptrs()[t * static_cast<std::size_t>(roles) + static_cast<std::size_t>(st.role)]));
    }
    for (const auto& [key, matrices] : batches) {
      const int g = std::get<2>(key);
      backend.orthogonalize(
          matrices, std::get<0>(key), std::get<1>(key),
          iteration(st, plan.hypers().data() + static_cast<std::ptrdiff_t>(g) * h, g), stream);
    }
  }
}

}  // namespace fusedopt::runtime
