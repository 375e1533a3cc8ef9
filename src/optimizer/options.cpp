// The checks of OptimizerOptions that need no param (optimizer.hpp: check_options).
#include <cfloat>
#include <cmath>

#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "support/check.hpp"

namespace fusedopt {

void check_options(const OptimizerOptions& options) {
  FUSEDOPT_CHECK_USAGE(options.max_grad_norm >= 0.0 && std::isfinite(options.max_grad_norm),
                       "OptimizerOptions: max_grad_norm is {}; it must be 0 (off) or positive "
                       "and finite",
                       options.max_grad_norm);
  // It becomes the hyper max_grad_norm, which the rule for every hyper applies to (a
  // checkpoint holding 1e39 would not load back).
  FUSEDOPT_CHECK_USAGE(options.max_grad_norm <= static_cast<double>(FLT_MAX),
                       "OptimizerOptions: max_grad_norm is {}; it becomes the hyper "
                       "'max_grad_norm', which must be within fp32's range (<= {:.8g})",
                       options.max_grad_norm, static_cast<double>(FLT_MAX));
  const DType s = options.state_dtype;
  if (s != DType::F32 && s != DType::F16 && s != DType::BF16) {
    throw UsageError(fmt::format(
        "OptimizerOptions: unsupported state_dtype {}: states are kept in fp32, fp16 or bf16 (a "
        "float64 param keeps its states in float64 whatever state_dtype says)",
        to_string(s)));
  }
  FUSEDOPT_CHECK_USAGE(!(options.stochastic_rounding && options.master_weights),
                       "OptimizerOptions: stochastic_rounding and master_weights are both set; "
                       "stochastic rounding is for 16-bit params without a master copy (with "
                       "one, the master keeps the fp32 value): choose one");
  FUSEDOPT_CHECK_USAGE(
      options.matrix_precision == DType::F32 || options.matrix_precision == DType::BF16,
      "OptimizerOptions::matrix_precision is {}: matrix stages iterate in f32 or bf16",
      to_string(options.matrix_precision));
  const int b = options.quant_block;
  FUSEDOPT_CHECK_USAGE(b == 0 || (b >= 32 && b <= 512 && (b & (b - 1)) == 0),
                       "OptimizerOptions::quant_block is {}: a power of two from 32 to 512 (or 0: "
                       "the default)",
                       b);
  FUSEDOPT_CHECK_USAGE(options.quant_min_numel >= 0,
                       "OptimizerOptions::quant_min_numel is {}: it must not be negative",
                       options.quant_min_numel);
}

}  // namespace fusedopt
