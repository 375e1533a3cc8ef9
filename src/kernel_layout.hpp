// The layout of a generated kernel: what codegen emits beside the code and the runtime reads
// to drive the kernel — its roles (pointer order), hypers, reduction passes and their slots,
// scalar, row and column states, the strategy, the scratch tensors and the bytes each pass
// moves. The contract between codegen (which writes it: codegen::KernelBody is a layout and
// its code) and the runtime (plans, bindings, the step program, the backends), as abi.h is
// the contract between the kernels and the runtime. Standard library and public types only:
// the runtime reads it without seeing the rule language or the compilers.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "fusedopt/kernel.hpp"

namespace fusedopt {

/// What a reduction spans: one total per tensor or for the step, or per row, column or
/// matrix of a factored rule (lang::Scope is this enum).
enum class ReductionScope { Tensor, Global, Row, Col, Matrix };

/// One accumulator of a reduction pass, as the runtime and the hook see it.
struct ReductionSlot {
  std::string name;  ///< the reduction's function, e.g. "tensor_norm"; "grad_check"
  ReductionScope scope = ReductionScope::Tensor;
  int slot = 0;  ///< index in the per-tensor or global totals
  int pass = 0;
  bool max = false;  ///< combined by max (maxabs, any_nonfinite); else by sum
  int line = 0;      ///< rule line of the call (0: built in)
};

/// A number of a matrix stage's iteration: a literal, or hyper `hyper` (per param group).
struct StageNumber {
  double number = 0;
  int hyper = -1;  ///< index into the hyper table, or -1: `number`
};

/// A matrix stage of a rule (orthogonalize): after pass `pass`'s finalize, each tensor's
/// matrix in fp32 scratch role `role` is replaced by the Newton-Schulz iteration's result
/// (matrix/newton_schulz.hpp), which later passes read.
struct MatrixStageLayout {
  int pass = 0;
  int role = 0;
  int line = 0;  ///< rule line of the call
  StageNumber steps;
  std::vector<std::array<StageNumber, 3>> coefficients;  ///< one per round, or one for all
  StageNumber eps;
};

struct KernelLayout {
  std::string kind;  ///< "rule" or "trusted-functor" (part of the cache key)
  std::string name;  ///< rule or functor name
  int num_roles = 0;
  int num_hypers = 0;
  int num_uniforms = 0;  ///< hoisted uniform values
  /// An fp64 binding: element math in double, and fo_uniform's hypers, step, global values
  /// and uniform values and fo_tvals's values are doubles (else floats).
  bool f64 = false;
  std::vector<std::string> roles;   ///< role names in pointer order
  std::vector<std::string> hypers;  ///< hyper names in order

  // Reductions (all zero / empty for element-wise rules).
  int reduction_passes = 0;  ///< launches before the update launch
  int num_tensor_slots = 1;  ///< per-tensor totals per tensor (at least 1)
  int num_global_slots = 1;  ///< global totals; the last one is the grad check
  int num_scalars = 0;       ///< per-tensor scalar states (doubles per tensor)
  int num_tvals = 1;         ///< fo_tvals values: per-tensor reduction results,
                             ///< scalar values, hoisted per-tensor expressions
  // Factored (row/column) values: rules with `row`/`col` states or row_mean, col_mean,
  // matrix_mean. Their element code reads a row's and a column's values (fo_element_rc).
  bool factored = false;
  int num_row_states = 0;
  int num_col_states = 0;
  int num_row_slots = 0;     ///< row_mean results per row
  int num_col_slots = 0;     ///< col_mean results per column
  int num_matrix_slots = 0;  ///< matrix_mean results per matrix
  /// Column values of element code (ExprEmitter::RcValue) per column: the host keeps a
  /// chunk's after its column sums (exec/plan.cpp sizes them).
  int num_col_values = 0;
  /// Whether a step ends with the call that writes each tensor's scalar, row and column
  /// states (fusedopt_scalars[_host]), which also writes their initial values.
  bool writes_after_update() const { return num_scalars > 0 || factored; }
  /// Elements per absmax block of the quantized states (0: none quantized): chunks begin
  /// on blocks (factored rules' whole-row chunks too).
  int quant_block = 0;
  int max_acc = 1;                   ///< accumulators per chunk in the widest pass
  std::vector<ReductionSlot> slots;  ///< every accumulator of every pass (grad check too)
  ReductionStrategy strategy = ReductionStrategy::Recompute;
  int store_pass = -1;                    ///< Store: the pass that writes states early
  std::vector<std::string> scratch;       ///< fp32 scratch tensors (role order, after the
                                          ///< master): the Store strategy's, then the stages'
  std::vector<MatrixStageLayout> stages;  ///< matrix stages (their scratch roles are last)
  std::int64_t bits_recompute = 0;        ///< bits per element and step, under each strategy
  std::int64_t bits_store = 0;
  std::vector<int> role_bits;                 ///< bits per element of each role (codes: 8, 4)
  std::vector<std::vector<int>> pass_reads;   ///< roles each pass reads (update last)
  std::vector<std::vector<int>> pass_writes;  ///< roles each pass writes
};

/// What a loaded kernel keeps of how it was made: its cache key, where the binary came from
/// and how long that took, and its layout (no binary, no source).
struct KernelInfo {
  std::string key;  ///< 32 hex digits
  KernelOrigin origin = KernelOrigin::Compiled;
  double seconds = 0;  ///< time to get the binary
  KernelLayout layout;
};

}  // namespace fusedopt
