// compile_step: the step as a program of ops, for every schedule the Optimizer can have
// (reduction passes, scaled or not, the grad check folded into pass 0 or separate).
#include <doctest/doctest.h>

#include "exec/step_program.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::runtime::compile_step;
using fusedopt::runtime::describe;

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("a plain step is the reduction passes, then the update and the count") {
    CHECK(describe(compile_step(0, false, true)) == "update, end");
    CHECK(describe(compile_step(2, false, true)) ==
          "reduce 0, finalize 0, hook 0, reduce 1, finalize 1, hook 1, update, end");
    // Whether the check may be folded does not matter without a check.
    CHECK(compile_step(2, false, false) == compile_step(2, false, true));
  }

  TEST_CASE("a step extension's ops open and close the program") {
    // ShardedOptimizer's: begin (the gradients' reduction finished), hook k (each pass's
    // totals combined across ranks), publish (the updated pieces gathered).
    CHECK(describe(compile_step(0, false, true, true)) == "begin, update, end, publish");
    CHECK(describe(compile_step(1, true, true, true)) ==
          "begin, reduce 0 (+check), finalize 0, hook 0, skip if, update, end, publish");
    CHECK(describe(compile_step(0, true, true, true)) ==
          "begin, check grads, hook check, skip if, update, end, publish");
  }

  TEST_CASE("a scaled step checks every gradient before anything is written") {
    // No reduction pass: the check is its own launch, handed to the hook, then the skip.
    CHECK(describe(compile_step(0, true, true)) == "check grads, hook check, skip if, update, end");
    // Folded into pass 0: one read of the gradients; the skip after pass 0's hook, so that
    // every rank sees the combined verdict.
    CHECK(describe(compile_step(2, true, true)) ==
          "reduce 0 (+check), finalize 0, hook 0, skip if, reduce 1, finalize 1, hook 1, "
          "update, end");
    // Pass 0 writes (the Store strategy): the check cannot ride on it.
    CHECK(describe(compile_step(1, true, false)) ==
          "check grads, hook check, skip if, reduce 0, finalize 0, hook 0, update, end");
  }

  TEST_CASE("pieces split a pass's finalize in stages around the hook calls") {
    // Column and matrix means over rows in pass 0 (three stages, two calls), column means
    // only in pass 1 (two stages), a tensor norm in pass 2 (one finalize); the grad check's
    // skip after pass 0's last stage.
    CHECK(describe(compile_step(3, true, true, false, {3, 2, 1})) ==
          "reduce 0 (+check), finalize 0 (stage 1), hook 0, finalize 0 (stage 2), hook 0 "
          "(matrices), finalize 0 (stage 3), skip if, reduce 1, finalize 1 (stage 1), hook 1, "
          "finalize 1 (stage 2), reduce 2, finalize 2, hook 2, update, end");
  }
}

}  // namespace fusedopt::testing
