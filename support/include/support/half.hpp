// fp16 and bf16 to and from fp32 (round to nearest even) on the host: the comm module's
// reductions of 16-bit gradients (each element widened, combined in fp32 and rounded once,
// as NCCL does for half types) and the runtime's reads of 16-bit state values.
#pragma once

#include <cstdint>
#include <cstring>

namespace fusedopt::support {

inline float bits_to_float(std::uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline std::uint32_t float_to_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

inline float bf16_to_float(std::uint16_t h) { return bits_to_float(std::uint32_t{h} << 16); }
inline std::uint16_t float_to_bf16(float f) {
  const std::uint32_t u = float_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((u >> 16) | 0x40);  // NaN
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

inline float f16_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1fu;
  const std::uint32_t man = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_float(sign | 0x7f800000u | (man << 13));  // inf, NaN
  if (exp != 0) return bits_to_float(sign | ((exp + 112) << 23) | (man << 13));
  // Subnormal (or zero): man × 2^-24, exact in fp32.
  const float magnitude = static_cast<float>(man) * 5.9604644775390625e-8f;
  return sign ? -magnitude : magnitude;
}
inline std::uint16_t float_to_f16(float f) {
  const std::uint32_t u = float_to_bits(f);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<std::uint16_t>(sign | 0x7e00u);   // NaN
  if (a >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (a < 0x38800000u) {
    // Below the smallest normal (2^-14): a multiple of 2^-24, rounded to nearest even by
    // the fp32 addition of 0.5 (the magic number keeps the result's low bits).
    const float magic = bits_to_float(0x3f000000u);  // 0.5
    const float shifted = bits_to_float(a) + magic;
    return static_cast<std::uint16_t>(sign | (float_to_bits(shifted) - 0x3f000000u));
  }
  const std::uint32_t rounded = a + 0xfffu + ((a >> 13) & 1u);
  return static_cast<std::uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
}

}  // namespace fusedopt::support
