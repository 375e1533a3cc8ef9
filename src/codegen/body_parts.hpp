// The parts every kernel body has, a rule's (codegen.cpp) or a trusted functor's
// (functor.cpp): the prologue's defines, fo_uniform, fo_tensor and fo_bind, fo_prepare,
// fo_grad_finite, and the staging macros of the CUDA vector path.
#pragma once

#include <string>
#include <vector>

#include "codegen/writer.hpp"
#include "fusedopt/dtype.hpp"

namespace fusedopt::codegen {

struct KernelBody;

/// `#define FO_NUM_ROLES ...` and `FO_NUM_HYPERS`.
void emit_common_prologue(Writer& w, const KernelBody& body);
/// The fo_uniform struct for the body's hyper and uniform counts.
std::string uniform_struct(const KernelBody& body);
/// FO_UPDATE_STAGE/STORES, FO_INIT_STAGE/STORES and FO_REDUCE<k>_STAGE/STORES for the CUDA
/// vector path: the roles that fo_element, fo_init_element and fo_reduce_element<k> in
/// `code` load and store (see cuda_kernel.cuh).
std::string staging_macros(const std::string& code, int reduction_passes);

/// C++ storage type of a dtype in generated code ("float", "fo_f16", "fo_bf16").
const char* storage_type(DType dtype);

/// One pointer of fo_tensor: its storage type and whether the kernel writes it.
struct RoleDecl {
  std::string type;
  bool writable = false;
};
/// struct fo_tensor (typed restrict pointers, in role order) and fo_bind.
void emit_tensor_binding(Writer& w, const std::vector<RoleDecl>& roles);

/// fo_grad_finite: whether the unscaled gradient element is finite (role 1 is the grad).
void emit_grad_finite(Writer& w);

/// A hoisted value computed in fo_prepare: the rule line it comes from and its statement.
struct PrepareLine {
  int rule_line = 0;
  std::string text;
};
/// fo_prepare: copies the hypers, step and grad scale, computes the global reduction
/// values (`globals`, statements over the raw totals G), then `lines` in order, each under
/// a #line pointing at `file`.
void emit_prepare(Writer& w, const KernelBody& body, const std::vector<std::string>& globals,
                  const std::vector<PrepareLine>& lines, const std::string& file);

}  // namespace fusedopt::codegen
