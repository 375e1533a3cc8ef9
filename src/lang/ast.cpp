// The few out-of-line pieces of the AST: symbol-kind names and symbol lookup.
#include "lang/ast.hpp"

namespace fusedopt::lang {

const char* to_string(SymKind kind) {
  switch (kind) {
    case SymKind::Param:
      return "param";
    case SymKind::Grad:
      return "grad";
    case SymKind::State:
      return "state";
    case SymKind::Scalar:
      return "scalar";
    case SymKind::RowState:
      return "row state";
    case SymKind::ColState:
      return "col state";
    case SymKind::Output:
      return "output";
    case SymKind::Hyper:
      return "hyper";
    case SymKind::Step:
      return "step";
    case SymKind::Info:
      return "built-in";
    case SymKind::Temp:
      return "temporary";
  }
  return "unknown";
}

const char* to_string(ReduceKind kind) {
  switch (kind) {
    case ReduceKind::Sum:
      return "sum";
    case ReduceKind::SumSq:
      return "sumsq";
    case ReduceKind::Norm:
      return "norm";
    case ReduceKind::MaxAbs:
      return "maxabs";
    case ReduceKind::AnyNonFinite:
      return "any_nonfinite";
    case ReduceKind::Mean:
      return "mean";
  }
  return "unknown";
}

const char* to_string(Scope scope) {
  switch (scope) {
    case Scope::Tensor:
      return "tensor";
    case Scope::Global:
      return "global";
    case Scope::Row:
      return "row";
    case Scope::Col:
      return "col";
    case Scope::Matrix:
      return "matrix";
  }
  return "?";
}

int Rule::find(const std::string& wanted) const {
  // Linear: rules have a handful of symbols, and lookups happen at build time, not per step.
  for (std::size_t i = 0; i < symbols.size(); ++i) {
    if (symbols[i].name == wanted) return static_cast<int>(i);
  }
  return -1;
}

}  // namespace fusedopt::lang
