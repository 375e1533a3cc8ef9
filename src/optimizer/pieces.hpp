// Params that are dim-0 pieces of bigger tensors (Tensor::whole_shape, PyTorch FSDP2): their
// checks, and what the optimizer derives from a piece for its kernels (the whole tensor's
// built-ins, the random numbers' offset, whether its factored sums span pieces).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "fusedopt/optimizer.hpp"

namespace fusedopt::runtime {

/// A piece of a tensor of 2 or more dimensions given without a shape takes the whole's, its
/// dim 0 numel / the product of the others (when that divides; else it is left for
/// validate_piece to refuse).
void infer_piece_shape(Tensor& t);
/// Checks `t`'s whole_shape and whole_offset (UsageError prefixed with `who`): a piece has
/// the whole's shape but in dim 0 (a 1-D one: an element range), its rows within the
/// whole's; without whole_shape, whole_offset must be 0.
void validate_piece(const Tensor& t, const std::string& who);
/// The elements of the tensor `t` is a piece of, or its own (after validate_piece).
std::int64_t whole_numel(const Tensor& t);
/// The index of a piece's first element in its whole tensor (0 for a whole tensor): what
/// keys its random numbers, as the whole tensor's elements.
long long piece_offset(const Tensor& t);
/// Appends the whole tensor's numel, dims, rows, cols (the rule's built-ins; a whole
/// tensor's own) to `info`.
void append_whole_info(const Tensor& t, std::vector<double>& info);
/// Whether a factored rule's column sums and matrix sums over rows of `t` span pieces: a
/// piece of a 1-D or 2-D tensor (one of 3 or more dimensions holds whole matrices).
bool spans_pieces(const Tensor& t);

}  // namespace fusedopt::runtime
