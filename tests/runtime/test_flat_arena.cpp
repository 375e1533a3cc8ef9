// FlatArena: one 64-byte aligned buffer per dtype for params and one for grads, views in
// add() order, usable directly as an Optimizer's tensors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <iterator>
#include <vector>

#include "common/host_tensors.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::testing {

TEST_SUITE("runtime") {
  TEST_CASE("FlatArena lays each dtype's params out contiguously, 64-byte aligned, zeroed") {
    using fusedopt::DType;
    fusedopt::FlatArena arena;
    arena.add("a", 10, DType::F32);
    arena.add("b", 0, DType::F32);
    arena.add("c", 33, DType::BF16);
    arena.add("d", 16, DType::F32);
    arena.add("e", 5, DType::BF16);
    CHECK_THROWS_WITH_AS(arena.param(0), "FlatArena: call finalize() before taking views",
                         fusedopt::Error);
    arena.finalize();
    REQUIRE(arena.size() == 5);
    CHECK_THROWS_WITH_AS(arena.add("f", 1, DType::F32), "FlatArena: add('f') after finalize()",
                         fusedopt::Error);
    auto addr = [](const fusedopt::Tensor& t) { return reinterpret_cast<std::uintptr_t>(t.data); };
    for (std::size_t i : {0, 2, 3, 4}) {
      CHECK(addr(arena.param(i)) % 64 == 0);
      CHECK(addr(arena.grad(i)) % 64 == 0);
    }
    CHECK(arena.param(1).data == nullptr);
    CHECK(arena.param(1).numel == 0);
    // Same dtype: adjacent views, each rounded up to 64 bytes.
    CHECK(addr(arena.param(3)) - addr(arena.param(0)) == 64);
    CHECK(addr(arena.param(4)) - addr(arena.param(2)) == 128);
    CHECK(addr(arena.grad(3)) - addr(arena.grad(0)) == 64);
    CHECK(arena.param(2).dtype == DType::BF16);
    CHECK(arena.param(2).name == "c");
    CHECK(arena.grad(2).name == "c.grad");
    for (std::int64_t i = 0; i < 33; ++i) CHECK(at(arena.param(2), i) == 0.0);
    CHECK_THROWS_WITH_AS(arena.param(5), "FlatArena: no tensor 5 (the arena holds 5)",
                         fusedopt::Error);
  }

  TEST_CASE("FlatArena takes gradient and param memory from the caller, zeroes it, checks it") {
    using fusedopt::DType;
    auto make = [] {
      fusedopt::FlatArena a;
      a.add("w", 10, DType::F32);
      a.add("h", 3, DType::BF16);
      return a;
    };
    // Lent memory: one block per dtype and kind, gradients first, each zeroed by the arena.
    alignas(64) static unsigned char pool[4][256];
    for (auto& block : pool) std::fill(std::begin(block), std::end(block), 0xAB);
    std::vector<std::size_t> asked;
    int next = 0;
    auto lend = [&](std::size_t bytes) {
      asked.push_back(bytes);
      return static_cast<void*>(pool[next++]);
    };
    fusedopt::FlatArena a = make();
    a.finalize(lend, lend);
    CHECK(asked == std::vector<std::size_t>{64, 64, 64, 64});  // grads f32, bf16; params alike
    CHECK(a.grad(0).data == pool[0]);
    CHECK(a.grad(1).data == pool[1]);
    CHECK(a.param(0).data == pool[2]);
    CHECK(a.param(1).data == pool[3]);
    for (std::int64_t i = 0; i < 10; ++i) CHECK(at(a.grad(0), i) == 0.0);
    for (std::int64_t i = 0; i < 3; ++i) CHECK(at(a.param(1), i) == 0.0);
    // Only the gradients lent: the params are the arena's own.
    fusedopt::FlatArena b = make();
    next = 0;
    b.finalize(lend);
    CHECK(b.grad(0).data == pool[0]);
    CHECK(b.param(0).data != pool[2]);
    // Null or misaligned memory: which tensor kind and dtype, and why.
    fusedopt::FlatArena c = make();
    CHECK_THROWS_WITH_AS(c.finalize([](std::size_t) -> void* { return nullptr; }),
                         "FlatArena::finalize: the gradient memory for fp32 (64 bytes) is null",
                         fusedopt::UsageError);
    fusedopt::FlatArena d = make();
    CHECK_THROWS_WITH_AS(
        d.finalize(nullptr, [](std::size_t) -> void* { return pool[0] + 4; }),
        "FlatArena::finalize: the param memory for fp32 (64 bytes) is not 64-byte aligned",
        fusedopt::UsageError);
  }

  TEST_CASE("FlatArena refuses a size whose bytes overflow, and keeps what it had") {
    using fusedopt::DType;
    fusedopt::FlatArena arena;
    arena.add("w", 16, DType::F32);
    // 2^62 + 16 fp32 elements: 2^64 + 64 bytes, which wrapped to 64 and was taken.
    const std::int64_t huge = (std::int64_t{1} << 62) + 16;
    CHECK_THROWS_WITH_AS(arena.add("huge", huge, DType::F32),
                         doctest::Contains("'huge' of 4611686018427387920 fp32 elements does "
                                           "not fit in memory"),
                         fusedopt::UsageError);
    // Each fits alone, not after the views before it.
    const std::int64_t half = std::int64_t{1} << 60;  // 2^62 bytes of fp32
    arena.add("big", half, DType::F32);
    CHECK_THROWS_WITH_AS(arena.add("more", half, DType::F32), doctest::Contains("'more'"),
                         fusedopt::UsageError);
    CHECK_THROWS_WITH_AS(arena.add("max", INT64_MAX, DType::BF16), doctest::Contains("'max'"),
                         fusedopt::UsageError);
  }

  TEST_CASE("an Optimizer runs over FlatArena views and matches the reference") {
    use_private_cache();
    fusedopt::FlatArena arena;
    const std::vector<std::int64_t> sizes = {100, 0, 4099, 3};
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      arena.add("w" + std::to_string(k), sizes[k], fusedopt::DType::F32);
    }
    arena.finalize();
    std::mt19937 rng(fresh_seed());
    std::normal_distribution<double> normal(0.0, 1.0);
    fusedopt::ParamGroup group;
    group.hypers = {{"lr", 0.1}};
    std::vector<double> ref;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      group.params.push_back(arena.param(k));
      group.grads.push_back(arena.grad(k));
    }
    fusedopt::Optimizer opt(fusedopt::Rule::preset("sgd"), {group});
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      auto* p = static_cast<float*>(arena.param(k).data);
      auto* g = static_cast<float*>(arena.grad(k).data);
      for (std::int64_t i = 0; i < sizes[k]; ++i) {
        p[i] = static_cast<float>(normal(rng));
        g[i] = static_cast<float>(normal(rng));
        ref.push_back(p[i] - static_cast<double>(0.1f) * g[i]);
      }
    }
    opt.step();
    std::size_t j = 0;
    for (std::size_t k = 0; k < sizes.size(); ++k) {
      const auto* p = static_cast<const float*>(arena.param(k).data);
      for (std::int64_t i = 0; i < sizes[k]; ++i, ++j) {
        REQUIRE(std::abs(p[i] - ref[j]) <= 1e-6 * (1 + std::abs(ref[j])));
      }
    }
  }

  TEST_CASE("FlatArena refuses an invalid dtype at add() and asks for no memory of 0 bytes") {
    using fusedopt::DType;
    fusedopt::FlatArena arena;
    CHECK_THROWS_WITH_AS(arena.add("x", 4, static_cast<DType>(77)),
                         "FlatArena: 'x' has an invalid dtype (value 77, not a DType)",
                         fusedopt::UsageError);
    CHECK(arena.size() == 0);
    // fp32's tensors are all empty: its memory is not asked for (an allocator may return
    // null for 0 bytes, as malloc may), and its views hold null.
    arena.add("e", 0, DType::F32);
    arena.add("h", 3, DType::BF16);
    alignas(64) static unsigned char pool[2][64];
    std::vector<std::size_t> asked;
    auto lend = [&](std::size_t bytes) -> void* {
      asked.push_back(bytes);
      return bytes == 0 ? nullptr : static_cast<void*>(pool[asked.size() - 1]);
    };
    arena.finalize(lend);
    CHECK(asked == std::vector<std::size_t>{64});  // bf16's gradients only
    CHECK(arena.grad(0).data == nullptr);
    CHECK(arena.param(0).data == nullptr);
    CHECK(arena.grad(1).data == pool[0]);
  }
}

}  // namespace fusedopt::testing
