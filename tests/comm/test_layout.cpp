// GradBucketer's layout without communication (single process): buckets against a layout
// worked out by hand in each case (caps, reverse order, the small first bucket, dtype
// split, the tensor cap, empty gradients), refusal of gradients that are not one flat
// buffer, the fp16/bf16 conversions the host reductions use, against every fp16 value, and
// the shard cut on the blocks of quantized states.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "comm/shard_layout.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/error.hpp"
#include "support/half.hpp"

namespace fusedopt::testing {

using fusedopt::DType;
using fusedopt::Tensor;
using fusedopt::comm::Bucket;
using fusedopt::comm::BucketOptions;
using fusedopt::comm::GradBucketer;

namespace {

/// Gradients laid out one after another in `memory`, each start aligned to 64 bytes (as
/// FlatArena does), in parameter order.
struct Flat {
  std::vector<std::max_align_t> memory = std::vector<std::max_align_t>(1 << 16);
  std::vector<Tensor> grads;
  std::size_t used = 0;
  void add(std::int64_t numel, DType d = DType::F32) {
    used = (used + 63) / 64 * 64;
    Tensor t;
    t.data = reinterpret_cast<unsigned char*>(memory.data()) + used;
    t.numel = numel;
    t.dtype = d;
    t.name = "g" + std::to_string(grads.size());
    grads.push_back(t);
    used += static_cast<std::size_t>(numel) * fusedopt::dtype_size(d);
  }
};

std::vector<std::vector<int>> members(const std::vector<Bucket>& buckets) {
  std::vector<std::vector<int>> out;
  for (const Bucket& b : buckets) out.push_back(b.grads);
  return out;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("FUSEDOPT_COMM_TIMEOUT is a finite number of seconds above 0 and at most 7 days") {
    using fusedopt::comm::Communicator;
    for (const char* bad : {"1e10", "inf", "nan", "1e400", "0", "-1", "604800.5", "5s", ""}) {
      CAPTURE(bad);
      ::setenv("FUSEDOPT_COMM_TIMEOUT", bad, 1);
      CHECK_THROWS_WITH_AS(Communicator::default_timeout(),
                           doctest::Contains("FUSEDOPT_COMM_TIMEOUT"), fusedopt::UsageError);
    }
    ::setenv("FUSEDOPT_COMM_TIMEOUT", "604800", 1);
    CHECK(Communicator::default_timeout() == Communicator::kMaxTimeout);
    ::setenv("FUSEDOPT_COMM_TIMEOUT", "2.5", 1);
    CHECK(Communicator::default_timeout() == std::chrono::milliseconds(2500));
    ::setenv("FUSEDOPT_COMM_TIMEOUT", "0.0001", 1);  // rounds to 0 ms: at least 1
    CHECK(Communicator::default_timeout() == std::chrono::milliseconds(1));
    ::unsetenv("FUSEDOPT_COMM_TIMEOUT");
    CHECK(Communicator::default_timeout() == std::chrono::minutes(5));
  }

  TEST_CASE("buckets: reverse order, a small first bucket, the byte cap") {
    Flat f;
    // fp32 sizes in bytes: 400, 4000, 400, 800, 2000, 400.
    for (std::int64_t n : {100, 1000, 100, 200, 500, 100}) f.add(n);
    BucketOptions o;
    o.first_bucket_bytes = 1000;
    o.bucket_bytes = 3000;
    const std::vector<Bucket> b = GradBucketer::layout(f.grads, o);
    // Reverse: g5 (400) + g4 (2000) would pass 1000: the first bucket is {g5}; then
    // g4 (2000) + g3 (800) = 2800, + g2 would be 3200 > 3000: {g4, g3}; g2 (400) + g1
    // (4000) > 3000: {g2}; g1 alone exceeds the cap: {g1}; then {g0}.
    CHECK(members(b) == std::vector<std::vector<int>>{{5}, {4, 3}, {2}, {1}, {0}});
    CHECK(b[1].bytes == 2800);
    // A bucket is the range from its lowest gradient to the end of its highest one,
    // padding included.
    CHECK(b[1].data == f.grads[3].data);
    const auto start = reinterpret_cast<std::uintptr_t>(f.grads[3].data);
    const auto end = reinterpret_cast<std::uintptr_t>(f.grads[4].data) + 2000;
    CHECK(b[1].count == static_cast<std::int64_t>((end - start) / 4));
    CHECK(b[1].count > 700);  // 200 + 500 elements and the padding between them
  }

  TEST_CASE("buckets: one dtype each, a first bucket per dtype, the tensor cap, empties") {
    Flat f;
    f.add(100);               // g0 fp32 400 B
    f.add(100, DType::BF16);  // g1 bf16 200 B
    f.add(0);                 // g2 empty
    f.add(100);               // g3 fp32
    f.add(100, DType::BF16);  // g4 bf16
    f.add(100);               // g5 fp32
    f.add(100, DType::BF16);  // g6 bf16
    // Interleaved dtypes are not one buffer per dtype: put each dtype in its own buffer.
    Flat fp32, bf16;
    std::vector<Tensor> grads;
    for (const Tensor& t : f.grads) {
      Flat& target = t.dtype == DType::F32 ? fp32 : bf16;
      target.add(t.numel, t.dtype);
      grads.push_back(target.grads.back());
    }
    BucketOptions o;
    o.first_bucket_bytes = 400;
    o.bucket_bytes = 1 << 20;
    o.max_tensors = 2;
    const std::vector<Bucket> b = GradBucketer::layout(grads, o);
    // fp32: g5 fills its first bucket (400 B); {g3, g0} by the tensor cap. bf16: {g6, g4}
    // (400 B, the first cap), then {g1}. Ordered by their first gradient's reverse position.
    CHECK(members(b) == std::vector<std::vector<int>>{{6, 4}, {5}, {3, 0}, {1}});
    CHECK(b[0].dtype == DType::BF16);
    CHECK(b[1].dtype == DType::F32);
    for (const Bucket& bucket : b) {
      for (int g : bucket.grads) CHECK(g != 2);  // the empty gradient is in none
    }
  }

  TEST_CASE("gradients that are not one flat buffer are refused, naming them") {
    Flat f;
    f.add(10);
    f.add(10);
    std::vector<Tensor> swapped = {f.grads[1], f.grads[0]};
    swapped[0].name = "w1";
    swapped[1].name = "w0";
    CHECK_THROWS_WITH_AS(GradBucketer::layout(swapped, {}),
                         doctest::Contains("gradient 1 ('w0') does not follow gradient 0 ('w1')"),
                         fusedopt::UsageError);
    std::vector<float> a(10), b(10);
    std::vector<Tensor> apart = {f.grads[0], f.grads[1]};
    apart[0].data = a.data();
    apart[1].data = b.data() + 0;
    if (reinterpret_cast<std::uintptr_t>(b.data()) >
        reinterpret_cast<std::uintptr_t>(a.data()) + 296) {
      CHECK_THROWS_WITH_AS(GradBucketer::layout(apart, {}), doctest::Contains("bytes apart"),
                           fusedopt::UsageError);
    }
  }

  TEST_CASE("fp16 and bf16 conversions round to nearest even, every fp16 value round-trips") {
    namespace h = fusedopt::support;
    for (std::uint32_t u = 0; u < 0x10000; ++u) {
      const auto x = static_cast<std::uint16_t>(u);
      const float f = h::f16_to_float(x);
      if (std::isnan(f)) {
        CHECK(std::isnan(h::f16_to_float(h::float_to_f16(f))));
        continue;
      }
      REQUIRE(h::float_to_f16(f) == x);
      // Halfway to the next value rounds to the even one (fp16's 11-bit significand).
      REQUIRE(h::bf16_to_float(h::float_to_bf16(h::bf16_to_float(x))) == h::bf16_to_float(x));
    }
    CHECK(h::float_to_f16(65520.0f) == 0x7c00);                           // rounds to inf
    CHECK(h::float_to_f16(65519.0f) == 0x7bff);                           // 65504
    CHECK(h::f16_to_float(h::float_to_f16(1.0f + 1.0f / 2048)) == 1.0f);  // tie to even
    CHECK(h::f16_to_float(h::float_to_f16(1.0f + 3.0f / 2048)) == 1.0f + 2.0f / 1024);
    CHECK(h::bf16_to_float(h::float_to_bf16(1.0f + 1.0f / 256)) == 1.0f);      // tie to even
    CHECK(h::f16_to_float(h::float_to_f16(3e-8f)) == 5.9604644775390625e-8f);  // subnormal
  }

  TEST_CASE("shards cut a param with quantized states on its blocks, at the nearest boundary") {
    namespace d = fusedopt::comm::detail;
    using Cut = std::vector<std::vector<d::Piece>>;
    auto same = [](const Cut& a, const Cut& b) {
      REQUIRE(a.size() == b.size());
      for (std::size_t i = 0; i < a.size(); ++i) {
        REQUIRE(a[i].size() == b[i].size());
        for (std::size_t k = 0; k < a[i].size(); ++k) {
          CHECK(a[i][k].rank == b[i][k].rank);
          CHECK(a[i][k].begin == b[i][k].begin);
          CHECK(a[i][k].end == b[i][k].end);
        }
      }
    };
    // 100 + 1000 + 300 fp32 elements over 3 ranks: shards of 467, boundaries at 467 and 934,
    // that is 367 and 834 into the second param. Unaligned, and on blocks of 256 there
    // (367 -> 256, 834 -> 768); the fp16 param is cut on its own.
    const std::vector<std::pair<std::int64_t, DType>> sizes = {
        {100, DType::F32}, {1000, DType::F32}, {300, DType::F32}, {9, DType::F16}};
    same(d::cut_into_shards(sizes, 3), Cut{{{0, 0, 100}},
                                           {{0, 0, 367}, {1, 367, 834}, {2, 834, 1000}},
                                           {{2, 0, 300}},
                                           {{0, 0, 3}, {1, 3, 6}, {2, 6, 9}}});
    same(d::cut_into_shards(sizes, 3, {1, 256, 1, 1}),
         Cut{{{0, 0, 100}},
             {{0, 0, 256}, {1, 256, 768}, {2, 768, 1000}},
             {{2, 0, 300}},
             {{0, 0, 3}, {1, 3, 6}, {2, 6, 9}}});
    // A boundary nearer the end moves to it: the rest of the param stays with the rank before.
    same(d::cut_into_shards({{1000, DType::F32}, {100, DType::F32}}, 2, {512, 1}),
         Cut{{{0, 0, 512}, {1, 512, 1000}}, {{1, 0, 100}}});
    same(d::cut_into_shards({{1000, DType::F32}, {900, DType::F32}}, 2, {1, 512}),
         Cut{{{0, 0, 950}, {1, 950, 1000}}, {{1, 0, 900}}});
    // A cut that would leave a rank nothing is refused, saying what to change.
    CHECK_THROWS_WITH_AS(d::cut_into_shards({{600, DType::F32}}, 3, {512}),
                         doctest::Contains("leave rank 0 none of their elements: use fewer "
                                           "ranks or a smaller quant_block"),
                         fusedopt::UsageError);
    // How a saved state follows its piece's elements: values, 4-bit codes, absmax.
    CHECK(d::state_cut("m", 1000, 1000, 0)->per == 1);
    CHECK(d::state_cut("m", 500, 1000, 256)->per == 2);
    CHECK(d::state_cut("m", 501, 1001, 256)->per == 2);
    CHECK(d::state_cut("m.absmax", 4, 1000, 256)->per == 256);
    CHECK(d::state_cut("m.absmax", 8, 1000, 0)->per == 128);  // the block the count implies
    CHECK(d::state_cut("m.absmax", 1, 20, 0)->per == 32);     // one block: no cut inside
    CHECK_FALSE(d::state_cut("m.absmax", 3, 1000, 256).has_value());
    CHECK_FALSE(d::state_cut("m", 999, 1000, 0).has_value());
    const d::StateCut nibbles{2}, blocks{128};
    CHECK(nibbles.range(256, 1001) == std::pair<std::int64_t, std::int64_t>(128, 501));
    CHECK(blocks.range(256, 1001) == std::pair<std::int64_t, std::int64_t>(2, 8));
  }
}

}  // namespace fusedopt::testing
