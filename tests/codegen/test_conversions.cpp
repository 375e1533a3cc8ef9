// The prelude's software fp16/bf16 conversions (used on the host) against exact references.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <ios>
#include <random>

#include "prelude.h"

namespace fusedopt::testing {

namespace {

float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Reference: the value of an fp16 bit pattern, computed in double from its fields.
double f16_value(std::uint16_t h) {
  int sign = h >> 15, e = (h >> 10) & 31, m = h & 1023;
  double v;
  if (e == 0)
    v = std::ldexp(m, -24);
  else if (e == 31)
    v = m ? NAN : INFINITY;
  else
    v = std::ldexp(1024 + m, e - 25);
  return sign ? -v : v;
}

// Reference RNE to fp16 by searching the two neighbours in double.
std::uint16_t f32_to_f16_reference(float f) {
  if (std::isnan(f)) return 0x7e00;
  std::uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  std::uint16_t best = 0;
  for (std::uint16_t h = 0; h < 0x7c00; ++h) {  // positive finite patterns, ascending
    if (f16_value(h) <= a)
      best = h;
    else
      break;
  }
  double lo = f16_value(best), hi = f16_value(static_cast<std::uint16_t>(best + 1));
  std::uint16_t r = best;
  if (a - lo > hi - a || (a - lo == hi - a && (best & 1))) r = static_cast<std::uint16_t>(best + 1);
  return sign | r;
}

}  // namespace

TEST_SUITE("codegen") {
  TEST_CASE("fp16 to fp32 is exact for every one of the 65536 bit patterns") {
    for (std::uint32_t h = 0; h < 65536; ++h) {
      float got = fo_f16_to_f32(static_cast<unsigned short>(h));
      double want = f16_value(static_cast<std::uint16_t>(h));
      if (std::isnan(want)) {
        CHECK(std::isnan(got));
      } else {
        INFO("pattern " << h);
        REQUIRE(static_cast<double>(got) == want);
      }
    }
  }

  TEST_CASE("fp32 to fp16 rounds to nearest even, with overflow to inf and subnormals") {
    std::mt19937 rng(std::random_device{}());
    std::uniform_int_distribution<std::uint32_t> exponent(100, 145), mantissa(0, (1u << 23) - 1);
    for (int i = 0; i < 2000; ++i) {
      std::uint32_t u = (rng() & 0x80000000u) | (exponent(rng) << 23) | mantissa(rng);
      if (i % 4 == 0) u = (u & ~0x1fffu) | 0x1000u;  // exact ties
      float f = bits_to_float(u);
      INFO("input bits 0x" << std::hex << u);
      REQUIRE(fo_f32_to_f16(f) == f32_to_f16_reference(f));
    }
    CHECK(fo_f32_to_f16(65504.0f) == 0x7bff);
    CHECK(fo_f32_to_f16(65520.0f) == 0x7c00);
    CHECK(fo_f32_to_f16(-INFINITY) == 0xfc00);
    CHECK((fo_f32_to_f16(NAN) & 0x7c00) == 0x7c00);
  }

  TEST_CASE("fp32 to bf16 rounds to nearest even and keeps NaN a NaN") {
    std::mt19937 rng(std::random_device{}());
    for (int i = 0; i < 100000; ++i) {
      std::uint32_t u = rng();
      float f = bits_to_float(u);
      if (std::isnan(f)) {
        CHECK(std::isnan(fo_bf16_to_f32(fo_f32_to_bf16(f))));
        continue;
      }
      // Reference in double: the nearest of the two bf16 neighbours, ties to even.
      std::uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
      double a = std::fabs(static_cast<double>(f));
      double dlo = std::fabs(static_cast<double>(bits_to_float(lo)));
      double dhi = std::fabs(static_cast<double>(bits_to_float(hi)));
      if ((hi & 0x7fffffffu) == 0x7f800000u) dhi = std::ldexp(1.0, 128);  // one ulp past the max
      std::uint32_t want =
          (a - dlo > dhi - a || (a - dlo == dhi - a && ((lo >> 16) & 1))) ? hi : lo;
      INFO("input bits 0x" << std::hex << u);
      REQUIRE(fo_f32_to_bf16(f) == static_cast<unsigned short>(want >> 16));
    }
  }
}

}  // namespace fusedopt::testing
