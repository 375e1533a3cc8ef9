// Storage dtypes and how a kernel binds them to the roles of a rule. Math is fp32 (double for
// an fp64 binding); the binding decides loads and stores, and each binding is its own kernel
// (and cache key).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "fusedopt/export.hpp"

namespace fusedopt {

/// Storage type of a tensor. F64 holds per-tensor scalar states (a rule's `scalar`
/// declarations: Optimizer::state() views and checkpoints) and float64 params, with their
/// grads and states (a binding "fp64:fp64:fp64", whose element math is double); U8 the codes
/// of block-quantized states (Quant); other parameters, gradients and state tensors are F32,
/// F16 or BF16.
enum class DType { F32, F16, BF16, F64, U8 };

/// "fp32", "fp16", "bf16", "fp64", "uint8".
FUSEDOPT_API const char* to_string(DType dtype);
/// Bytes per element.
FUSEDOPT_API int dtype_size(DType dtype);
/// The dtype's name in safetensors files: "F32", "F16", "BF16", "F64", "U8" (what
/// SafetensorsReader::Entry::dtype says of a tensor fusedopt wrote).
FUSEDOPT_API const char* safetensors_name(DType dtype);
/// The DType of a safetensors dtype name (safetensors_name's names, exactly), or nullopt for
/// any other ("I64", "F8_E4M3", "f32", ...): a dtype fusedopt does not store.
FUSEDOPT_API std::optional<DType> dtype_of_safetensors_name(std::string_view name);

/// Block-quantized storage of one state tensor (DTypeBinding::quant): each element is a
/// code of a quantization map (a sorted table of values in [-1, 1]), and each block of
/// `quant_block` elements keeps one fp32 absmax; an element's value is map[code] * absmax.
/// A step dequantizes, computes in fp32, and stores the codes nearest to the new values
/// divided by the new absmax of their block (docs/rules.md, "Quantized states"), or, for a
/// state in DTypeBinding::quant_sr, one of the two codes around each value, drawn with the
/// probabilities that keep its expected value.
enum class Quant : unsigned char {
  None,  ///< not quantized: the binding's `state` dtype
  Q8S,   ///< 8-bit codes of bitsandbytes' signed dynamic map (any sign)
  Q8U,   ///< 8-bit codes of bitsandbytes' unsigned dynamic map (values >= 0; below: 0)
  Q4S,   ///< 4-bit codes, two per byte, of torchao's signed 4-bit dynamic map
  Q4U,   ///< 4-bit codes of torchao's linear map without zero, 1/16 ... 1 (values >= 0)
};
/// "-", "q8s", "q8u", "q4s", "q4u".
FUSEDOPT_API const char* to_string(Quant quant);
/// Bits per element of a quantized state's codes (8 or 4; 0 for Quant::None).
FUSEDOPT_API int quant_bits(Quant quant);

/// Storage dtype of each role of a rule. fp64 binds all three together ("fp64:fp64:fp64", or
/// "fp64"): float64 params step with float64 grads and states, and the kernel's element math
/// is double (locals, literals, built-in functions, hypers, uniform and per-tensor values);
/// such a binding takes no master copy, stochastic rounding or quantized states, and rules
/// with reduction passes or row/column states do not compile for it (UsageError).
struct FUSEDOPT_API DTypeBinding {
  DType param = DType::F32;  ///< the parameter as the model sees it
  DType grad = DType::F32;
  DType state = DType::F32;  ///< every state tensor and extra output
  /// The kernel reads and writes an fp32 master copy of the param and stores a rounded copy
  /// into the param (only meaningful when param is fp16 or bf16).
  bool master = false;
  /// Per state of the rule (declaration order; outputs are never quantized): its block-
  /// quantized storage. Empty, or all Quant::None: no state is quantized.
  std::vector<Quant> quant;
  /// Elements per absmax block of the quantized states: a power of two from 32 to 512
  /// (0: the default, 256, or 128 when a state is 4-bit).
  int quant_block = 0;
  /// Bit k: state k's codes are rounded stochastically (storage "q4u+sr" and so on): between
  /// the two map values around v / absmax, up with probability (v / absmax - lower) / (upper -
  /// lower), from the counter-based generator of `stochastic` under a key of its own per
  /// state (docs/rules.md, "Stochastically rounded codes"), so a state that moves by less than half
  /// a code per step still moves on average. The codes' layout and map are the storage's; only the
  /// kernel's rounding differs.
  std::uint64_t quant_sr = 0;
  /// 16-bit params (without a master copy) are stored rounded stochastically: up or down with
  /// the probabilities that keep the expected value, from a counter-based generator keyed
  /// on (seed, step, param, element) (OptimizerOptions::stochastic_rounding).
  bool stochastic = false;

  /// Whether any state is quantized.
  bool quantized() const;
  /// quant_block with the default applied (0 when nothing is quantized).
  int block() const;
  /// Canonical text: "PARAM:GRAD:STATE" plus "+master" or "+sr" (stochastic), plus
  /// "+q=Q/Q/...@B" when states are quantized (one entry per state: -, q8s, q8u, q4s, q4u,
  /// with "+sr" where quant_sr has its bit), e.g. "bf16:bf16:fp32+master", "bf16:bf16:bf16+sr",
  /// "fp32:fp32:fp32+q=q8s/q8u@256", "fp32:fp32:fp32+q=q4s/q4u+sr@128".
  std::string str() const;
  /// Parses str()'s form, or a single dtype "X" meaning "X:X:X" (with the same suffixes).
  /// Throws fusedopt::Error.
  static DTypeBinding parse(std::string_view text);

  /// The same kernel: the same dtypes and options, and the same quantized storage (an
  /// all-"-" list, or none, alike; the block as block() resolves it; the same quant_sr).
  bool operator==(const DTypeBinding& o) const;
};

}  // namespace fusedopt
