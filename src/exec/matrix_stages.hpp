// The matrix stages of one binding (a rule's orthogonalize calls): each tensor as the
// matrix the stage iterates on, the iteration's numbers of each param group, and the run
// after a pass's finalize, which hands each stage's scratch tensors to the backend batched
// by shape and numbers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "device/backend.hpp"
#include "exec/plan.hpp"
#include "fusedopt/extension.hpp"
#include "kernel_layout.hpp"
#include "matrix/newton_schulz.hpp"

namespace fusedopt::runtime {

struct BindingTensors;

class MatrixStages {
 public:
  MatrixStages() = default;
  /// The stages of `layout` over `tensors` (planned as `plan`): UsageError, naming the
  /// tensor, for one that is not a matrix (fewer than 2 dimensions); then
  /// check_hypers(plan's hypers). A tensor may be a piece of its whole param's matrix
  /// (BindingTensors::whole_shapes): its stage then needs the step extension (add_work).
  MatrixStages(const KernelLayout& layout, const BindingTensors& tensors, const Plan& plan);

  bool empty() const { return stages_.empty(); }
  /// Whether a stage runs after pass `pass`.
  bool after(int pass) const;
  /// UsageError, naming the group and the hyper, when a group's iteration numbers are out
  /// of range (`hypers[g]`: group g's values in the layout's order).
  void check_hypers(const std::vector<std::vector<double>>& hypers) const;
  /// Whether a tensor is a piece of its whole param.
  bool pieces() const { return pieces_; }
  /// The stages of pass `pass`: every tensor's matrix in its scratch view (`plan`'s
  /// pointers) replaced by the iteration's result, ordered on `stream`. UsageError when a
  /// tensor is a piece (the step extension did not gather them).
  void run(int pass, Backend& backend, const Plan& plan, void* stream) const;
  /// Appends the pieces of pass `pass`'s stages (their scratch views) to `work`.
  void add_work(int pass, const Plan& plan, MatrixStageWork& work) const;
  /// Stage `stage`'s iteration (index into the layout's stages) for group `group` of `plan`.
  matrix::NewtonSchulz iteration(int stage, int group, const Plan& plan) const;

 private:
  /// Stage `stage`'s iteration for group `group`'s hyper values.
  matrix::NewtonSchulz iteration(const MatrixStageLayout& stage, const double* hypers,
                                 int group) const;

  struct Dims {
    std::int64_t rows = 0, cols = 0;  ///< the whole param's; 0 rows: empty (nothing to do)
    bool piece = false;               ///< fewer elements than the whole param
    long long param = 0;              ///< the whole param
    std::int64_t offset = 0;          ///< first element in it
    std::int64_t numel = 0;
  };
  bool pieces_ = false;
  std::vector<MatrixStageLayout> stages_;
  std::vector<std::string> hyper_names_;
  std::vector<Dims> dims_;  ///< per tensor
  bool bf16_ = false;
};

}  // namespace fusedopt::runtime
