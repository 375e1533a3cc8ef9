// The one check of a state before it is loaded into an optimizer: Optimizer::load and
// OptimizerExtension::load_tensors (so the sharded checkpoints), the Python front end's
// load_state_dict and its edits of opt.state all hand each state here, so a quantized state
// that would step to wrong values (codes of another map or block, codes of another dtype,
// an absmax that is negative or not finite) is refused the same way wherever it comes from.
#pragma once

#include <cstdint>
#include <string>

#include "fusedopt/dtype.hpp"
#include "fusedopt/export.hpp"

namespace fusedopt {

/// How an optimizer keeps one state of one parameter: its storage (Quant::None: values in
/// the state dtype; a param below quant_min_numel keeps its states so), the elements per
/// absmax block of a quantized one, and the parameter's elements.
struct KeptState {
  Quant storage = Quant::None;
  int block = 0;
  std::int64_t numel = 0;
};

/// One state of one parameter as a checkpoint, a state dict or an edit hands it over.
struct LoadedState {
  /// The storage it was saved with, as recorded: "-" (values), "q8s", "q8u", "q4s", "q4u"
  /// (codes rounded stochastically, "q4u+sr", are their kind's). Empty: not recorded (the
  /// checkpoints written before 2026-11-27), taken as what the optimizer keeps.
  std::string storage;
  /// The elements per absmax block, as recorded (0: not recorded, taken as the optimizer's).
  std::int64_t block = 0;
  /// A quantized state's codes and absmax, in host memory: their safetensors dtype names
  /// ("U8", "F32"; any other, "I64", "F16", ..., is refused), element counts and data.
  std::string codes_dtype;
  std::int64_t codes_numel = 0;
  const void* codes = nullptr;
  std::string absmax_dtype;
  std::int64_t absmax_numel = 0;
  const void* absmax = nullptr;
};

/// Checks that `loaded` can be loaded as `kept` (nothing is copied): the same storage (a
/// quantized state is not loaded as values nor values as codes, codes of one map are not
/// codes of another, e.g. q8s and q8u), the same block; for a quantized state its codes
/// (dtype U8, one byte per element at 8 bits, one per two at 4) and absmax (F32, one per
/// block, each finite and >= 0: a block's largest |value|), and a block of absmax 0 holds
/// only the codes the kernels store for an all-zero block (the code nearest 0; for q8s also
/// the one below it, a -0's). Values (Quant::None) are the caller's to check. Throws
/// UsageError "WHO: ..." saying what was found and what was expected.
FUSEDOPT_API void check_loaded_state(const std::string& who, const KeptState& kept,
                                     const LoadedState& loaded);

}  // namespace fusedopt
