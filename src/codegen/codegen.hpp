// Code generation: a checked rule (or a trusted functor) becomes the target-neutral
// per-element part of a kernel, emitted once, which is then wrapped by a target skeleton
// from templates/kernels/. User names are never pasted: every name is re-emitted from the
// checked AST with a prefix.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/kernel.hpp"
#include "fusedopt/target.hpp"
#include "lang/ast.hpp"

namespace fusedopt::codegen {

/// The generated, target-neutral part of a kernel: defines FO_NUM_ROLES, FO_NUM_HYPERS,
/// fo_uniform, fo_tensor, fo_bind, fo_prepare, fo_element and fo_init_element.
struct KernelBody {
  std::string kind;  ///< "rule" or "trusted-functor" (part of the cache key)
  std::string name;  ///< rule or functor name
  int num_roles = 0;
  int num_hypers = 0;
  int num_uniforms = 0;  ///< hoisted uniform values
  std::vector<std::string> roles;   ///< role names in pointer order
  std::vector<std::string> hypers;  ///< hyper names in order
  std::string code;
};

/// Emits the body of `rule` for the dtype binding. Pointer order: param, grad, states,
/// outputs, then the fp32 master when dtypes.master.
KernelBody generate_body(const lang::Rule& rule, const DTypeBinding& dtypes);

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
