// The checksum fusedopt adds to every file it writes (safetensors has none), over the whole
// file: a flipped bit anywhere, length field, header or data, is refused; files of other
// writers still load; files of older fusedopt (a checksum of the data alone) are still checked.
#include <doctest/doctest.h>
#include <xxhash.h>

#include <cstring>
#include <random>

#include "common/safetensors_files.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "io/safetensors.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;
using fusedopt::Error;
using fusedopt::io::kChecksumKey;
using fusedopt::io::kDataChecksumKey;
using fusedopt::io::read_safetensors;
using fusedopt::io::TensorView;
using fusedopt::io::write_safetensors;

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
  TEST_CASE("a written file carries the XXH3-64 of the whole file, checked on read") {
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
    REQUIRE(bytes.substr(8 + n) == a + b);
    // Computed here, independently of the writer: the file's bytes with the recorded value
    // read as 16 '0's.
    const std::string key = std::string("\"") + kChecksumKey + "\":\"";
    const std::size_t at = bytes.find(key);
    REQUIRE(at != std::string::npos);
    REQUIRE(at < 8 + n);
    const std::string recorded = bytes.substr(at + key.size(), 16);
    std::string zeroed = bytes;
    zeroed.replace(at + key.size(), 16, std::string(16, '0'));
    char want[17];
    std::snprintf(want, sizeof want, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(zeroed.data(), zeroed.size())));
    CHECK(recorded == want);
    auto file = read_safetensors(p);
    CHECK(file.data_checked);
    CHECK(file.checksum == want);
    CHECK(file.metadata == std::map<std::string, std::string>{{"note", "hi"}});
  }

  TEST_CASE("every single-bit flip anywhere in the file is refused, but in the checksum's name") {
    TempDir dir;
    std::mt19937_64 rng(std::random_device{}());
    const std::string a = random_bytes(4 * 16, rng);
    const fs::path p = dir.path() / "x.safetensors";
    write_safetensors(p, {TensorView{"a", "F32", {16}, a.data(), a.size()}},
                      {{"lr", "0.001"}, {"step", "12"}});
    const std::string good = read_file(p);
    const std::size_t data_at = 8 + header_length(good);
    // The checksum entry's own name: a flip there that still spells a JSON string leaves a
    // file without a checksum (another writer's, to this reader), which loads unchecked with
    // the entry under its new name.
    // Optimizer checkpoints require the entry, so there such a flip is refused too.
    const std::size_t key_at = good.find(std::string("\"") + kChecksumKey + "\":\"") + 1;
    const std::size_t key_end = key_at + std::strlen(kChecksumKey);
    for (std::size_t i = 0; i < good.size(); ++i) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string bad = good;
        bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
        write_file(p, bad);
        INFO("byte ", i, " bit ", bit);
        if (i >= key_at && i < key_end && read_error(p).empty()) {
          const auto file = read_safetensors(p);
          CHECK_FALSE(file.data_checked);
          CHECK(file.data == a);
          CHECK(file.metadata.size() == 3);
          CHECK(file.metadata.at("lr") == "0.001");
          continue;
        }
        const std::string what = read_error(p);
        REQUIRE(!what.empty());
        CHECK(what.find(p.string() + ": ") == 0);
        if (i >= data_at) {
          CHECK(what.find(p.string() + ": the file does not match its checksum") == 0);
          CHECK(what.find("changed or damaged after it was written") != std::string::npos);
        }
      }
    }
  }

  TEST_CASE("a file of an older fusedopt (checksum of the data section) is still checked") {
    TempDir dir;
    std::mt19937_64 rng(std::random_device{}());
    const std::string data = random_bytes(8, rng);
    char sum[17];
    std::snprintf(sum, sizeof sum, "%016llx",
                  static_cast<unsigned long long>(XXH3_64bits(data.data(), data.size())));
    const std::string header = std::string(R"({"__metadata__":{")") + kDataChecksumKey + R"(":")" +
                               sum + R"("},"t":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
    const fs::path p = dir.path() / "old.safetensors";
    write_file(p, raw_safetensors(header, data));
    auto file = read_safetensors(p);
    CHECK(file.data_checked);
    CHECK(file.metadata.empty());
    std::string bad = data;
    bad[3] = static_cast<char>(bad[3] ^ 0x10);
    write_file(p, raw_safetensors(header, bad));
    CHECK(read_error(p).find(p.string() + ": the data section does not match its checksum") == 0);
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

  TEST_CASE("the checksums' metadata names are reserved for the writer") {
    TempDir dir;
    const float x = 1;
    for (const char* key : {kChecksumKey, kDataChecksumKey}) {
      CHECK_THROWS_WITH_AS(write_safetensors(dir.path() / "r.safetensors",
                                             {TensorView{"t", "F32", {1}, &x, 4}}, {{key, "0"}}),
                           ((dir.path() / "r.safetensors").string() + ": metadata entry '" + key +
                            "' is reserved: the writer computes it")
                               .c_str(),
                           Error);
      CHECK_FALSE(fs::exists(dir.path() / "r.safetensors"));
    }
  }

  TEST_CASE("a metadata key that spells the checksum's key after a quote does not move it") {
    TempDir dir;
    const float x = 3;
    const fs::path p = dir.path() / "q.safetensors";
    // Written as "a\"fusedopt_xxh3_64":"..." in the header: the quote before the key name
    // is escaped, so this is not where the checksum lives.
    write_safetensors(p, {TensorView{"t", "F32", {1}, &x, 4}},
                      {{std::string("a\"") + kChecksumKey, "0000000000000000"}});
    auto file = read_safetensors(p);
    CHECK(file.data_checked);
    CHECK(file.metadata.count(std::string("a\"") + kChecksumKey) == 1);
  }
}

}  // namespace fusedopt::testing
