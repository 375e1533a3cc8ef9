// StateStore::binding_of: the dtype binding a param steps in (its dtypes, the states'
// storage and quantization, the master copy, stochastic rounding), as its dtype, the
// options and, for a piece of a bigger param, the whole param decide.
#include <algorithm>

#include "exec/plan.hpp"
#include "optimizer/pieces.hpp"
#include "optimizer/state_store.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {

DTypeBinding StateStore::binding_of(std::size_t p) const {
  const ParamSlot& s = params_[p];
  DTypeBinding b;
  b.param = s.param.dtype;
  b.grad = s.grad.dtype;
  b.state = options_.state_dtype;
  if (b.param == DType::F64) {
    // As torch keeps a float64 param's exp_avg in float64: its states are float64 whatever
    // state_dtype says; master_weights and stochastic_rounding mean nothing for it.
    b.state = DType::F64;
    const long long whole = p < origins_.size() ? origins_[p].numel : s.param.numel;
    const bool quantized =
        std::any_of(quant_.begin(), quant_.end(), [](Quant q) { return q != Quant::None; });
    FUSEDOPT_CHECK_USAGE(!(quantized && s.param.numel > 0 && whole >= options_.quant_min_numel),
                         "{}: a float64 param keeps its states in float64; quantized states "
                         "(state_storage, or the rule's `storage`) are not bound to float64 "
                         "params",
                         describe(s));
    return b;
  }
  b.master = options_.master_weights && s.param.dtype != DType::F32;
  b.stochastic = options_.stochastic_rounding && s.param.dtype != DType::F32;
  // A piece of a param (ShardedOptimizer; Tensor::whole_shape) is quantized when its whole
  // param is, and an empty piece binds as the others do (the same layouts on every rank).
  const std::int64_t whole = p < origins_.size() ? origins_[p].numel : whole_numel(s.param);
  const bool piece = !s.param.whole_shape.empty();
  if ((piece ? whole : s.param.numel) > 0 && whole >= options_.quant_min_numel) {
    b.quant = quant_;  // small params keep their states in state_dtype
    if (b.quantized()) {
      b.quant_block = options_.quant_block;
      b.quant_sr = quant_sr_;
    } else {
      b.quant.clear();
    }
  }
  // A factored rule's chunks are whole rows of one matrix, and each must begin on a block:
  // a batch of matrices that do not each start on a block keeps its states unquantized (as
  // torchao keeps a tensor whose size is not a multiple of the block).
  if (b.quantized() && factored_) {
    const MatrixShape m = piece ? matrix_shape(s.param.whole_shape, whole)
                                : matrix_shape(s.param.shape, s.param.numel);
    if (m.batch > 1 && (m.rows * m.cols) % b.block() != 0) {
      b.quant.clear();
      b.quant_block = 0;
      b.quant_sr = 0;
    }
  }
  return b;
}

}  // namespace fusedopt::runtime
