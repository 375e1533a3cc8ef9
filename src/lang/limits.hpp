// How big a rule may be. The byte and depth limits stop the parser early; the counts below
// bound what the code generator and the compilers get, chosen so that the largest legal
// rule compiles in a few seconds with g++ -O3 and with NVRTC (measured: docs/rules.md#limits).
#pragma once

#include <cstddef>

#include "lang/ast.hpp"

namespace fusedopt::lang {

class Source;

/// Largest rule text accepted, in bytes (a clear RuleError beyond it).
inline constexpr std::size_t kMaxRuleBytes = 1 << 20;
/// Deepest expression tree accepted (parentheses, unary chains and operator chains all
/// count); deeper input is a RuleError, never a stack overflow.
inline constexpr int kMaxExprDepth = 256;

/// Statements (assignments), including the two a clipped rule gains.
inline constexpr int kMaxStatements = 1024;
/// Distinct temporary names.
inline constexpr int kMaxTemporaries = 512;
/// State and output tensors together: each is one more pointer per tensor in the kernel.
inline constexpr int kMaxStateTensors = 32;
/// Hypers (the clipping hyper `max_grad_norm` counts too; the built-in `step` does not).
inline constexpr int kMaxHypers = 256;
/// Operators and function calls in all statements and initial values.
inline constexpr int kMaxOperations = 2048;
/// Of those, operations on hypers, `step` and constants only: they are hoisted out of the
/// element loop into one per-launch table, which the GPU keeps in shared memory.
inline constexpr int kMaxUniformOperations = 1024;

/// Throws the RuleError for the first thing in `rule` (checked) past a limit above, at its
/// position in the text.
void check_limits(const Source& source, const Rule& rule);

}  // namespace fusedopt::lang
