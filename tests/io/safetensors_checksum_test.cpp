// The data checksum fusedopt adds to every file it writes (safetensors has none): a flipped
// byte anywhere in the data section is refused, files of other writers still load.
#include <doctest/doctest.h>
#include <xxhash.h>

#include <cstring>
#include <random>

#include "fusedopt/error.hpp"
#include "io/safetensors.hpp"
#include "io/st_test_support.hpp"
#include "support/temp_dir.hpp"

namespace fs = std::filesystem;
using fusedopt::Error;
using fusedopt::io::kDataChecksumKey;
using fusedopt::io::read_safetensors;
using fusedopt::io::TensorView;
using fusedopt::io::write_safetensors;
using fusedopt::testing::random_bytes;
using fusedopt::testing::raw_safetensors;
using fusedopt::testing::read_file;
using fusedopt::testing::TempDir;
using fusedopt::testing::write_file;

namespace {

std::uint64_t header_length(const std::string& file) {
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(file[i]);
  return n;
}

std::string read_error(const fs::path& p) {
  try {
    read_safetensors(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("a written file carries the XXH3-64 of its data section, checked on read") {
    TempDir dir;
    std::mt19937_64 rng(std::random_device{}());
    const std::string a = random_bytes(4 * 33, rng), b = random_bytes(2 * 7, rng);
    const fs::path p = dir.path() / "x.safetensors";
    write_safetensors(p,
                      {TensorView{"a", "F32", {33}, a.data(), a.size()},
                       TensorView{"b", "BF16", {7}, b.data(), b.size()}},
                      {{"note", "hi"}});
    const std::string bytes = read_file(p);
    const std::uint64_t n = header_length(bytes);
    const std::string data = bytes.substr(8 + n);
    REQUIRE(data == a + b);
    // Computed here from the data bytes, independently of the writer.
    char want[17];
    std::snprintf(want, sizeof want, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(data.data(), data.size())));
    CHECK(bytes.substr(8, n).find(std::string("\"") + kDataChecksumKey + "\":\"" + want + "\"") !=
          std::string::npos);
    auto file = read_safetensors(p);
    CHECK(file.data_checked);
    CHECK(file.metadata == std::map<std::string, std::string>{{"note", "hi"}});
  }

  TEST_CASE("every single-bit flip in the data section is refused, naming the checksum") {
    TempDir dir;
    std::mt19937_64 rng(std::random_device{}());
    const std::string a = random_bytes(4 * 16, rng);
    const fs::path p = dir.path() / "x.safetensors";
    write_safetensors(p, {TensorView{"a", "F32", {16}, a.data(), a.size()}}, {});
    const std::string good = read_file(p);
    const std::size_t data_at = 8 + header_length(good);
    for (std::size_t i = data_at; i < good.size(); ++i) {
      std::string bad = good;
      bad[i] = static_cast<char>(bad[i] ^ (1 << (rng() % 8)));
      write_file(p, bad);
      const std::string what = read_error(p);
      INFO("byte ", i - data_at);
      CHECK(what.find(p.string() + ": the data section does not match its checksum") == 0);
      CHECK(what.find("changed or damaged after it was written") != std::string::npos);
    }
  }

  TEST_CASE("a file without the checksum (another writer's) loads, unchecked") {
    TempDir dir;
    std::mt19937_64 rng(std::random_device{}());
    const std::string data = random_bytes(8, rng);
    const fs::path p = dir.path() / "other.safetensors";
    write_file(p,
               raw_safetensors(R"({"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", data));
    auto file = read_safetensors(p);
    CHECK_FALSE(file.data_checked);
    CHECK(std::memcmp(file.tensor_data("t"), data.data(), 8) == 0);
  }

  TEST_CASE("the checksum's metadata name is reserved for the writer") {
    TempDir dir;
    const float x = 1;
    CHECK_THROWS_WITH_AS(
        write_safetensors(dir.path() / "r.safetensors", {TensorView{"t", "F32", {1}, &x, 4}},
                          {{kDataChecksumKey, "0"}}),
        ((dir.path() / "r.safetensors").string() + ": metadata entry '" + kDataChecksumKey +
         "' is reserved: the writer computes it")
            .c_str(),
        Error);
    CHECK_FALSE(fs::exists(dir.path() / "r.safetensors"));
  }
}
