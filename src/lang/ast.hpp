// The checked form of a rule: symbols (declared tensors, hypers, built-ins, temporaries),
// expressions and statements, plus what the checker derives (uniformity, phases).
// Knows nothing of CUDA or C++ code generation.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kernel_layout.hpp"

namespace fusedopt::lang {

/// A position in the rule text: 1-based line and column (in bytes), and the token length.
struct Loc {
  int line = 0;
  int col = 0;
  int len = 1;
};

enum class SymKind {
  Param,     ///< the parameter tensor (exactly one); read-write
  Grad,      ///< the gradient tensor (exactly one); read-only
  State,     ///< optimizer state tensor with an initial value; read-write
  Scalar,    ///< per-tensor scalar state (double), with an initial value; read-write
  RowState,  ///< one fp32 value per row of the tensor's matrices (factored state); read-write
  ColState,  ///< one fp32 value per column of the tensor's matrices; read-write
  Output,    ///< extra output tensor; write (then readable as a local)
  Hyper,     ///< scalar hyper-parameter with a default; read-only
  Step,      ///< built-in 1-based step count; read-only
  Info,      ///< built-in per-tensor value (Symbol::index: kInfoNames); read-only
  Temp,      ///< temporary; must be assigned before use
};

const char* to_string(SymKind kind);

/// The built-in per-tensor values, by Symbol::index of their SymKind::Info symbols: the
/// tensor's element count, its number of dimensions (1 when no shape was given), and the
/// rows and columns of its last two dimensions (a tensor of fewer than 2 dimensions is
/// numel rows of 1 column).
inline constexpr const char* kInfoNames[] = {"numel", "dims", "rows", "cols"};
inline constexpr int kNumInfos = 4;

/// What a reduction computes over its argument x.
enum class ReduceKind {
  Sum,           ///< sum of x
  SumSq,         ///< sum of x * x
  Norm,          ///< sqrt of the sum of x * x (the L2 norm)
  MaxAbs,        ///< max of |x| (NaN wins)
  AnyNonFinite,  ///< 1 if some x is inf or NaN, else 0 (a truth value)
  Mean,          ///< the mean of x (row_mean, col_mean, matrix_mean)
};

/// Over what a reduction runs: each parameter tensor on its own, every tensor of the step,
/// each row or each column of a tensor's matrices (its last two dimensions), or a row or
/// column value over the rows or columns of its matrix.
using Scope = ReductionScope;  // kernel_layout.hpp: the runtime reads it in a kernel's slots

/// How finely a value varies: one for the step (uniform), per tensor, per matrix (leading
/// dimensions), per row, per column, per element. A row value combined with a column value
/// varies per element.
enum class Level { Uniform, Tensor, Matrix, Row, Col, Element };

/// The level of a value computed from values of levels a and b.
inline Level join(Level a, Level b) {
  if ((a == Level::Row && b == Level::Col) || (a == Level::Col && b == Level::Row)) {
    return Level::Element;
  }
  return a < b ? b : a;
}

const char* to_string(ReduceKind kind);
const char* to_string(Scope scope);

/// Operators, element-wise functions and reductions.
enum class Op {
  Number,  ///< literal; Expr::number
  Ref,     ///< reads a symbol; Expr::sym (and Expr::def for temporaries)
  // unary
  Neg,
  Not,
  // binary
  Add,
  Sub,
  Mul,
  Div,
  Pow,
  Lt,
  Le,
  Gt,
  Ge,
  Eq,
  Ne,
  And,
  Or,
  // functions (Expr::args holds the arguments)
  Where,  ///< where(cond, a, b)
  Sqrt,
  Rsqrt,
  Exp,
  Log,
  Abs,
  Sign,
  Min,
  Max,
  Clamp,  ///< clamp(x, lo, hi)
  IsFinite,
  PowFn,  ///< pow(a, b), same as a ^ b
  Tanh,
  Log1p,
  Expm1,
  Floor,
  Mod,     ///< mod(a, b), same as a % b: a - b * floor(a / b) (the sign of b, as torch.remainder)
  Lerp,    ///< lerp(a, b, w), torch's two-branch formula
  Fma,     ///< fma(a, b, c): a * b + c rounded once
  Rand,    ///< rand(): a uniform value in [0, 1) per element and step (counter-based)
  Reduce,  ///< a reduction (Expr::reduction indexes Rule::reductions); args[0] is reduced
  /// orthogonalize(x[, steps, a, b, c, ..., eps]): a matrix stage (Expr::stage indexes
  /// Rule::stages); args[0] is the matrix's value, the rest the iteration's numbers or hypers
  Orthogonalize,
};

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  Op op = Op::Number;
  Loc loc;
  double number = 0;          ///< Op::Number
  int sym = -1;               ///< Op::Ref: index into Rule::symbols
  int def = -1;               ///< Op::Ref to a Temp: index of the statement that defined it
                              ///< (also set for a read of an Output; -1 for other kinds)
  std::vector<ExprPtr> args;  ///< operands (unary: 1, binary: 2, functions: their arity)

  // Filled by the checker.
  bool uniform = false;          ///< depends only on hypers, `step` and constants
                                 ///< (a Temp read is uniform when its reaching definition is)
  bool boolean = false;          ///< a truth value (comparison, and/or/not, isfinite; a read of a
                                 ///< boolean definition; where() of two booleans)
  bool elementwise = false;      ///< varies from element to element (reads a tensor element,
                                 ///< directly or through temporaries)
  int phase = 0;                 ///< the first pass in which the value is known: one more than the
                                 ///< latest pass of a reduction it depends on (0: none)
  Level level = Level::Uniform;  ///< how finely it varies (uniform: `uniform`; element:
                                 ///< `elementwise`)
  int reduction = -1;            ///< Op::Reduce: index into Rule::reductions
  ReduceKind reduce_kind = ReduceKind::Sum;  ///< Op::Reduce: set by the parser
  Scope reduce_scope = Scope::Tensor;        ///< Op::Reduce: set by the parser
  int stage = -1;                            ///< Op::Orthogonalize: index into Rule::stages
  bool staged = false;  ///< depends on a matrix stage's result (directly or through
                        ///< temporaries, outputs and states)
};

struct Symbol {
  std::string name;
  SymKind kind = SymKind::Temp;
  Loc loc;                   ///< where it was declared (or first assigned, for temporaries);
                             ///< line 0 for the built-in step
  int index = 0;             ///< position among the symbols of the same kind
  double default_value = 0;  ///< Hyper: the default
  ExprPtr init;              ///< State: the initial value (constants, hypers and the param only);
                             ///< Scalar: constants and hypers
  bool written = false;      ///< Param/State/Output/Temp: some statement assigns it
  /// State: never negative (NaN aside), whatever the hypers and the data, NaN and infinities
  /// included (lang/storage.cpp proves it from what the generated code computes),
  /// so a quantized storage "q8"/"q4" takes the unsigned map.
  bool nonnegative = false;
};

struct Stmt {
  int target = -1;  ///< index into Rule::symbols
  ExprPtr value;
  Loc loc;        ///< of the target name
  int phase = 0;  ///< the first pass in which its value is known (Expr::phase)
};

/// One reduction call of the rule. Its argument is computed element by element in pass
/// `pass`; the result is known from pass `pass + 1` on.
struct Reduction {
  ReduceKind kind = ReduceKind::Sum;
  Scope scope = Scope::Tensor;
  int pass = 0;
  int slot = 0;               ///< index among the reductions of the same scope
  Loc loc;                    ///< of the function name
  const Expr* arg = nullptr;  ///< the reduced expression (owned by the statement)
  std::string name;           ///< e.g. "tensor_norm"
};

/// A number of a matrix stage's iteration: a literal, or a hyper (index into Rule::hypers).
using StageValue = StageNumber;  // kernel_layout.hpp: the runtime reads it

/// One matrix stage: `orthogonalize(x)`. Its argument is computed element by element in
/// pass `pass` into an fp32 scratch tensor; after that pass's finalize every tensor's
/// matrix there is replaced by the Newton-Schulz iteration's result, which the element code
/// reads from pass `pass + 1` on.
struct MatrixStage {
  int pass = 0;
  Loc loc;                    ///< of the function name
  const Expr* arg = nullptr;  ///< the matrix's value (owned by the statement)
  StageValue steps;           ///< rounds of the iteration
  /// One (a, b, c) for every round, or one for all of them.
  std::vector<std::array<StageValue, 3>> coefficients;
  StageValue eps;  ///< the normalization's floor: X / max(||X||_F, eps)
};

/// Most reduction passes a rule may need (each is a read over the data).
inline constexpr int kMaxReductionPasses = 4;

/// A parsed and checked rule.
struct Rule {
  std::string name;  ///< file name without folder and extension (e.g. "adamw")
  std::string file;  ///< as given to parse (used in diagnostics)
  std::string text;  ///< the original text
  std::vector<Symbol> symbols;
  std::vector<Stmt> stmts;
  std::vector<Reduction> reductions;  ///< in text order
  std::vector<MatrixStage> stages;    ///< matrix stages, in text order
  int reduction_passes = 0;           ///< passes before the update pass (0: element-wise rule);
                                      ///< the update runs in pass `reduction_passes`
  int num_tensor_reductions = 0;
  int num_global_reductions = 0;
  int num_row_reductions = 0;     ///< row_mean slots (per row)
  int num_col_reductions = 0;     ///< col_mean slots (per column)
  int num_matrix_reductions = 0;  ///< matrix_mean slots (per matrix)

  int param = -1;               ///< symbol index of the param
  int grad = -1;                ///< symbol index of the grad
  int step = -1;                ///< symbol index of the built-in step
  std::vector<int> states;      ///< symbol indices, in declaration order
  std::vector<int> scalars;     ///< per-tensor scalar states: symbol indices, in declaration order
  std::vector<int> row_states;  ///< `row` states: symbol indices, in declaration order
  std::vector<int> col_states;  ///< `col` states: symbol indices, in declaration order
  std::vector<int> outputs;     ///< symbol indices, in declaration order
  std::vector<int> hypers;      ///< symbol indices, in declaration order
  /// `storage NAME = KIND` declarations: the state's symbol index and its kind ("q8", "q4",
  /// "q8s", "q8u", "q4s", "q4u", each possibly with "+sr"), the default of
  /// OptimizerOptions::state_storage.
  std::vector<std::pair<int, std::string>> storage;

  /// Index of the symbol called `name`, or -1.
  int find(const std::string& name) const;
  /// Whether the rule has row/column values (row or col states, row_mean, col_mean,
  /// matrix_mean): its kernels walk whole rows and write row/column states.
  bool factored() const {
    return !row_states.empty() || !col_states.empty() ||
           num_row_reductions + num_col_reductions + num_matrix_reductions > 0;
  }
};

}  // namespace fusedopt::lang
