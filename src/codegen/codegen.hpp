// Code generation: a checked rule (or a trusted functor) becomes the target-neutral
// per-element part of a kernel, emitted once, which is then wrapped by a target skeleton
// from templates/kernels/. User names are never pasted: every name is re-emitted from the
// checked AST with a prefix.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "codegen/schedule.hpp"
#include "fusedopt/dtype.hpp"
#include "fusedopt/kernel.hpp"
#include "fusedopt/target.hpp"
#include "kernel_layout.hpp"
#include "lang/ast.hpp"

namespace fusedopt::codegen {

using fusedopt::ReductionSlot;

/// The generated, target-neutral part of a kernel: defines FO_NUM_ROLES, FO_NUM_HYPERS,
/// the reduction constants, fo_uniform, fo_tvals, fo_tensor, fo_bind, fo_prepare,
/// fo_tensor_values, fo_reduce_element<pass>, fo_element and fo_init_element.
/// Its layout (kernel_layout.hpp: what the runtime reads) and its code.
struct KernelBody : KernelLayout {
  std::string code;
};

/// Emits the body of `rule` for the dtype binding. Pointer order: param, grad, states,
/// outputs, the fp32 master when dtypes.master, then the scratch tensors of the Store
/// strategy. `strategy` picks how the update gets values of the last reduction pass.
KernelBody generate_body(const lang::Rule& rule, const DTypeBinding& dtypes,
                         Strategy strategy = Strategy::Auto);

/// See include/fusedopt/kernel.hpp.
using fusedopt::TrustedFunctor;

/// Emits the body around a trusted functor (validates the names it is given; the code
/// itself is the caller's responsibility).
KernelBody generate_functor_body(const TrustedFunctor& functor, const DTypeBinding& dtypes);

/// The whole translation unit: prelude, ABI, body and the skeleton for `target`.
std::string generate_source(const KernelBody& body, const Target& target);

/// The file name generated code and #line directives refer to (e.g. "fusedopt_adamw.cu").
std::string source_file_name(const KernelBody& body, const Target& target);

}  // namespace fusedopt::codegen
