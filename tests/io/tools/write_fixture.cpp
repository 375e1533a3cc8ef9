// The C++ side of the Python interoperability test (tests/io/check_with_safetensors.py):
// writes a safetensors file of known pseudo-random values, or reads one that Python wrote and
// prints what it holds, so that each side checks the other with the reference library.
//
//   st_write_fixture SEED FILE [--no-bf16]   write F32/F16/BF16/I64 tensors and metadata
//   st_write_fixture --read FILE             print metadata and tensors, one per line
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include "fusedopt/error.hpp"
#include "io/safetensors.hpp"

namespace {

// splitmix64: a few lines that Python reproduces exactly with integer masking.
struct SplitMix64 {
  std::uint64_t state;
  std::uint64_t next() {
    state += 0x9E3779B97F4A7C15ull;
    std::uint64_t z = state;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
};

// The value grids below are chosen so that every value is exact in its storage type, which
// lets both sides compare bit for bit without any rounding rule to agree on.
float f32_value(std::uint64_t x) { return static_cast<float>((x >> 40) * 0x1p-22 - 2.0); }
float f16_value(std::uint64_t x) { return static_cast<float>((double((x >> 53)) - 1024) / 256); }
float bf16_value(std::uint64_t x) { return static_cast<float>((double((x >> 56)) - 128) / 16); }

std::uint32_t float_bits(float f) {
  std::uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Exact for zero and normal halves, which is all f16_value produces.
std::uint16_t to_half(float f) {
  std::uint32_t b = float_bits(f);
  std::uint16_t sign = static_cast<std::uint16_t>((b >> 16) & 0x8000);
  if ((b & 0x7FFFFFFF) == 0) return sign;
  int exponent = static_cast<int>((b >> 23) & 0xFF) - 127 + 15;
  return static_cast<std::uint16_t>(sign | (exponent << 10) | ((b >> 13) & 0x3FF));
}

std::uint64_t fnv1a64(const void* data, std::size_t n) {
  std::uint64_t h = 0xCBF29CE484222325ull;
  for (std::size_t i = 0; i < n; ++i) {
    h ^= static_cast<const unsigned char*>(data)[i];
    h *= 0x100000001B3ull;
  }
  return h;
}

int write_fixture(std::uint64_t seed, const std::string& path, bool with_bf16) {
  SplitMix64 rng{seed};
  std::vector<float> f32(3 * 4), scalar(1);
  std::vector<std::uint16_t> f16(5 * 2), bf16(2 * 3 * 2);
  std::vector<std::int64_t> i64(7);
  for (float& v : f32) v = f32_value(rng.next());
  for (std::uint16_t& v : f16) v = to_half(f16_value(rng.next()));
  for (std::uint16_t& v : bf16)
    v = static_cast<std::uint16_t>(float_bits(bf16_value(rng.next())) >> 16);
  for (std::int64_t& v : i64) v = static_cast<std::int64_t>(rng.next());
  scalar[0] = f32_value(rng.next());

  using fusedopt::io::TensorView;
  std::vector<TensorView> tensors = {{"f32", "F32", {3, 4}, f32.data(), f32.size() * 4},
                                     {"f16", "F16", {5, 2}, f16.data(), f16.size() * 2},
                                     {"bf16", "BF16", {2, 3, 2}, bf16.data(), bf16.size() * 2},
                                     {"i64", "I64", {7}, i64.data(), i64.size() * 8},
                                     {"scalar", "F32", {}, scalar.data(), 4},
                                     {"empty", "I64", {0, 4}, nullptr, 0}};
  if (!with_bf16) tensors.erase(tensors.begin() + 2);
  fusedopt::io::write_safetensors(
      path, tensors,
      {{"seed", std::to_string(seed)},
       {"generator", "splitmix64"},
       {"note", "caf\xc3\xa9 \xe2\x82\xac \"quoted\" back\\slash \xf0\x9f\x98\x80"}});
  return 0;
}

int read_fixture(const std::string& path) {
  fusedopt::io::SafetensorsFile file = fusedopt::io::read_safetensors(path);
  for (const auto& [key, value] : file.metadata)
    std::printf("meta %s %s\n", key.c_str(), value.c_str());
  for (const auto& [name, entry] : file.tensors) {
    std::string shape = "[";
    for (std::size_t i = 0; i < entry.shape.size(); ++i) {
      shape += (i ? "," : "") + std::to_string(entry.shape[i]);
    }
    shape += "]";
    std::printf(
        "tensor %s %s %s %016llx\n", name.c_str(), entry.dtype.c_str(), shape.c_str(),
        static_cast<unsigned long long>(fnv1a64(file.tensor_data(name), entry.end - entry.begin)));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::string(argv[1]) == "--read") return read_fixture(argv[2]);
    if (argc == 3 || (argc == 4 && std::string(argv[3]) == "--no-bf16")) {
      return write_fixture(std::stoull(argv[1]), argv[2], argc == 3);
    }
    std::fprintf(stderr, "usage: %s SEED FILE [--no-bf16] | --read FILE\n", argv[0]);
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "st_write_fixture: error: %s\n", e.what());
    return 1;
  }
}
