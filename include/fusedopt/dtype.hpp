// Storage dtypes and how a kernel binds them to the roles of a rule. Math is always fp32;
// the binding decides loads and stores, and each binding is its own kernel (and cache key).
#pragma once

#include <string>
#include <string_view>

#include "fusedopt/export.hpp"

namespace fusedopt {

/// Storage type of a tensor. F64 holds per-tensor scalar states (a rule's `scalar`
/// declarations: Optimizer::state() views and checkpoints); parameters, gradients and
/// state tensors are F32, F16 or BF16.
enum class DType { F32, F16, BF16, F64 };

/// "fp32", "fp16", "bf16", "fp64".
FUSEDOPT_API const char* to_string(DType dtype);
/// Bytes per element.
FUSEDOPT_API int dtype_size(DType dtype);

/// Storage dtype of each role of a rule.
struct FUSEDOPT_API DTypeBinding {
  DType param = DType::F32;  ///< the parameter as the model sees it
  DType grad = DType::F32;
  DType state = DType::F32;  ///< every state tensor and extra output
  /// The kernel reads and writes an fp32 master copy of the param and stores a rounded copy
  /// into the param (only meaningful when param is fp16 or bf16).
  bool master = false;

  /// Canonical text: "PARAM:GRAD:STATE" plus "+master", e.g. "bf16:bf16:fp32+master".
  std::string str() const;
  /// Parses str()'s form, or a single dtype "X" meaning "X:X:X". Throws fusedopt::Error.
  static DTypeBinding parse(std::string_view text);

  bool operator==(const DTypeBinding& o) const {
    return param == o.param && grad == o.grad && state == o.state && master == o.master;
  }
};

}  // namespace fusedopt
