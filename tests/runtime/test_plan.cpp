// The runtime Plan's vector-path flags: each role needs the alignment of 4 of its own
// elements (16 bytes fp32, 8 bytes fp16/bf16), so 16-bit roles at 8 bytes keep the
// tensor on the vector path, and any role below its own width sends it to the scalar path.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "codegen/codegen.hpp"
#include "exec/plan.hpp"
#include "presets.hpp"

namespace fusedopt::testing {

using namespace fusedopt;

namespace {

/// 1 when the plan of one tensor of adamw bf16:bf16:fp32+master (p, g bf16; m, v, master
/// fp32) with its role pointers at `offsets` bytes past a 64-byte boundary takes the vector
/// path.
int vector_path(const std::vector<std::size_t>& offsets) {
  static std::vector<unsigned char> storage(4096 + 64);
  const auto base = reinterpret_cast<std::uintptr_t>(storage.data());
  unsigned char* aligned = storage.data() + (64 - base % 64) % 64;
  const DTypeBinding d = DTypeBinding::parse("bf16:bf16:fp32+master");
  const codegen::KernelBody body = codegen::generate_body(*preset_rule("adamw"), d);
  REQUIRE(body.num_roles == 5);
  REQUIRE(offsets.size() == 5);
  std::vector<std::vector<void*>> ptrs(1);
  for (std::size_t r = 0; r < offsets.size(); ++r) {
    ptrs[0].push_back(aligned + 512 * r + offsets[r]);
  }
  const std::vector<std::int64_t> numel = {64};
  const std::vector<std::vector<double>> hypers = {std::vector<double>(body.num_hypers, 0.0)};
  const std::vector<int> group;
  const runtime::Plan plan =
      runtime::Plan::build(body, runtime::PlanRequest("test", ptrs, numel, hypers, group, 1024));
  CHECK(plan.num_aligned() == plan.aligned().at(0));
  return plan.aligned().at(0);
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("a role needs the alignment of 4 of its elements for the vector path") {
    CHECK(vector_path({0, 0, 0, 0, 0}) == 1);
    CHECK(vector_path({8, 8, 0, 0, 0}) == 1);  // bf16 p and g at 8 bytes: 4 elements
    CHECK(vector_path({24, 40, 16, 32, 48}) == 1);
    CHECK(vector_path({4, 0, 0, 0, 0}) == 0);  // bf16 at 4 bytes: 2 elements
    CHECK(vector_path({0, 2, 0, 0, 0}) == 0);
    CHECK(vector_path({0, 0, 8, 0, 0}) == 0);  // fp32 m at 8 bytes: 2 elements
    CHECK(vector_path({0, 0, 0, 0, 4}) == 0);  // the fp32 master too
  }
}

}  // namespace fusedopt::testing
