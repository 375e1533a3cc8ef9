// Size arithmetic that says when it overflows, instead of wrapping: one helper for every
// product and sum of element counts, byte sizes and offsets.
#pragma once

#include <optional>
#include <type_traits>

namespace fusedopt::support {

/// a * b, or nothing when the product does not fit in T.
template <typename T>
std::optional<T> checked_mul(T a, T b) {
  static_assert(std::is_integral_v<T>, "checked_mul: integers only");
  T out{};
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// a + b, or nothing when the sum does not fit in T.
template <typename T>
std::optional<T> checked_add(T a, T b) {
  static_assert(std::is_integral_v<T>, "checked_add: integers only");
  T out{};
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

/// `value` rounded up to a multiple of `align` (> 0), or nothing when that does not fit.
template <typename T>
std::optional<T> checked_round_up(T value, T align) {
  const std::optional<T> bumped = checked_add(value, static_cast<T>(align - 1));
  if (!bumped) return std::nullopt;
  return *bumped / align * align;
}

}  // namespace fusedopt::support
