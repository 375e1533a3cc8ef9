// Helpers shared by the safetensors tests: hand-built raw files (for corrupt-file cases) and
// fresh random bytes.
#pragma once

#include <cstdint>
#include <random>
#include <string>

namespace fusedopt::testing {

/// The bytes of a safetensors file with the given header text and data section, written by
/// hand so that tests can state exactly what is wrong with it.
inline std::string raw_safetensors(const std::string& header, const std::string& data) {
  std::string out;
  std::uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) out += static_cast<char>((n >> (8 * i)) & 0xFF);
  return out + header + data;
}

/// Fresh random bytes (a new seed every run, per the house rule against fixed test data).
inline std::string random_bytes(std::size_t n, std::mt19937_64& rng) {
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng() & 0xFF);
  return out;
}

}  // namespace fusedopt::testing
