// The kernel-body report: what a KernelBody tells the runtime and reports besides its code
// (the roles in pointer order, the counts, the schedule and its bytes, the reduction slots).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "codegen/body_emitter.hpp"
#include "codegen/body_parts.hpp"
#include "codegen/codegen.hpp"
#include "codegen/schedule.hpp"
#include "fusedopt/dtype.hpp"
#include "lang/ast.hpp"

namespace fusedopt::codegen {

/// The roles of `rule` for `dtypes` in pointer order: names for reports, declarations for
/// fo_tensor; the Store strategy's scratch tensors are described in body.scratch.
void lay_out_roles(const lang::Rule& rule, const DTypeBinding& dtypes, const Schedule& schedule,
                   KernelBody& body, std::vector<std::string>& role_names,
                   std::vector<RoleDecl>& decls);

/// What the runtime and reports need to know: counts, the schedule, bytes and the slots.
void describe(const lang::Rule& rule, const Schedule& schedule, const BodyEmitter& be,
              const std::vector<std::string>& role_names, std::size_t num_roles, KernelBody& body);

}  // namespace fusedopt::codegen
