// Every defect a safetensors file can have is reported as fusedopt::Error with the path, and
// random corruption never crashes the reader.
#include <doctest/doctest.h>

#include <random>

#include "common/safetensors_files.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "io/safetensors.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;
using fusedopt::Error;
using fusedopt::io::read_safetensors;

namespace {

// Writes `bytes` to a fresh file and returns what reading it throws ("" if it parses).
std::string read_error(const TempDir& dir, const std::string& bytes, std::string* path_out) {
  fs::path p = dir.path() / "corrupt.safetensors";
  write_file(p, bytes);
  *path_out = p.string();
  try {
    read_safetensors(p);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// A header with one F32 tensor of shape `shape` at `offsets`.
std::string one_tensor(const std::string& shape, const std::string& offsets,
                       const std::string& dtype = "F32") {
  return R"({"t":{"dtype":")" + dtype + R"(","shape":)" + shape + R"(,"data_offsets":)" + offsets +
         "}}";
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("each kind of defect in a safetensors file is reported with the path") {
    TempDir dir;
    std::string path;
    auto check = [&](const std::string& bytes, const std::string& expected) {
      std::string got = read_error(dir, bytes, &path);
      CHECK(got == path + ": " + expected);
    };
    const std::string eight(8, 'x');
    check("abc", "file is too short (3 bytes) to hold the header length");
    check(std::string("\x10\0\0\0\0\0\0\0{}", 10),
          "header length 16 runs past the end of the file (10 bytes)");
    check(std::string("\x00\xe1\xf5\x05\0\0\0\0{}", 10),
          "header length 100000000 runs past the end of the file (10 bytes)");
    check(std::string("\x01\xe1\xf5\x05\0\0\0\0{}", 10),
          "header length 100000001 is above the limit of 100000000 bytes");
    check(std::string("\xff\xff\xff\xff\xff\xff\xff\xff", 8),
          "header length 18446744073709551615 is above the limit of 100000000 bytes");
    check(raw_safetensors(R"({"t":)", ""),
          "header: malformed JSON at byte 5: expected a value, found the end");
    check(raw_safetensors("[]", ""), "header: not a JSON object");
    check(raw_safetensors(R"({"t":{"dtype":"F32","shape":[1.0],"data_offsets":[0,4]}})", "abcd"),
          "header: malformed JSON at byte 30: only integers are allowed");
    check(
        raw_safetensors(R"({"t":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}})", "abcd"),
        "header: malformed JSON at byte 29: expected an object, an array, a string or an integer");
    check(raw_safetensors(one_tensor("[2]", "[0,8]", "F31"), eight),
          "tensor 't': unknown dtype \"F31\"");
    check(raw_safetensors(one_tensor("[3]", "[0,8]"), eight),
          "tensor 't': shape [3] of F32 needs 12 bytes but data_offsets [0, 8] hold 8");
    check(raw_safetensors(one_tensor("[2]", "[0,8]"), "1234"),
          "tensor 't': data_offsets [0, 8] run past the data section (4 bytes)");
    check(raw_safetensors(one_tensor("[2]", "[8,0]"), eight),
          "tensor 't': data_offsets [8, 0] end before they begin");
    check(raw_safetensors(one_tensor("[-2]", "[0,8]"), eight),
          "tensor 't': shape holds something other than a non-negative integer");
    check(raw_safetensors(one_tensor("[4294967296,4294967296]", "[0,8]"), eight),
          "tensor 't': shape [4294967296, 4294967296] overflows");
    check(raw_safetensors(one_tensor("[2]", "[0]"), eight),
          "tensor 't': data_offsets is not a pair of non-negative integers");
    check(raw_safetensors(one_tensor("[2]", "[0,8]"), eight + "xx"),
          "bytes [8, 10) of the data section belong to no tensor");
    check(raw_safetensors(one_tensor("[1]", "[4,8]"), eight),
          "bytes [0, 4) of the data section belong to no tensor");
    check(raw_safetensors(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          eight),
          "tensor 'b': data_offsets [4, 8] overlap another tensor");
    check(raw_safetensors(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                          R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                          eight),
          "header: malformed JSON at byte 54: duplicate key \"a\"");
    check(raw_safetensors(R"({"__metadata__":{"k":1}})", ""),
          "header: metadata value for 'k' is not a string");
    check(raw_safetensors(R"({"__metadata__":["k"]})", ""),
          "header: __metadata__ is not an object");
    check(raw_safetensors(R"({"t":{"dtype":"F32","shape":[1]}})", ""),
          "tensor 't': needs \"dtype\", \"shape\" and \"data_offsets\"");
    check(
        raw_safetensors(R"({"t":{"dtype":"F32","shape":[],"data_offsets":[0,4],"x":[]}})", "abcd"),
        "tensor 't': unexpected key \"x\"");
    check(raw_safetensors(R"({"t":[]})", ""), "tensor 't': entry is not an object");
    check(raw_safetensors(R"({"__metadata__":{"k":"\ud800"}})", ""),
          "header: malformed JSON at byte 28: high surrogate not followed by a low surrogate");
    check(raw_safetensors("{\"__metadata__\":{\"k\":\"\xff\"}}", ""),
          "header: malformed JSON at byte 22: invalid UTF-8 in a string");
    check(raw_safetensors("{} x", ""),
          "header: malformed JSON at byte 3: unexpected data after the value");
    CHECK_THROWS_WITH_AS(
        read_safetensors(dir.path() / "missing.safetensors"),
        ((dir.path() / "missing.safetensors").string() + ": cannot open: No such file or directory")
            .c_str(),
        Error);
  }

  TEST_CASE("a header padded with trailing spaces and a zero-element tensor at the end parse") {
    TempDir dir;
    fs::path p = dir.path() / "padded.safetensors";
    write_file(p, raw_safetensors(R"({"t":{"dtype":"I64","shape":[1],"data_offsets":[0,8]},)"
                                  R"("z":{"dtype":"F16","shape":[0],"data_offsets":[8,8]}}   )",
                                  std::string(8, '\x01')));
    auto file = read_safetensors(p);
    CHECK(file.tensors.size() == 2);
    CHECK(file.tensors.at("z").begin == 8);
  }

  TEST_CASE("two thousand random byte flips and truncations never crash the reader") {
    std::mt19937_64 rng{std::random_device{}()};
    TempDir dir;
    fs::path good = dir.path() / "good.safetensors";
    std::string a = fusedopt::testing::random_bytes(24, rng);
    std::string b = fusedopt::testing::random_bytes(6, rng);
    fusedopt::io::write_safetensors(good,
                                    {{"a", "F32", {2, 3}, a.data(), a.size()},
                                     {"b", "BF16", {3}, b.data(), b.size()},
                                     {"s", "I64", {}, a.data() + 8, 8}},
                                    {{"format", "pt"}, {"note", "\xc3\xa9t\xc3\xa9"}});
    const std::string valid = fusedopt::testing::read_file(good);
    int parsed = 0, rejected = 0;
    for (int i = 0; i < 2000; ++i) {
      std::string bytes = valid;
      int kind = static_cast<int>(rng() % 3);
      if (kind != 1) {  // flip a few bytes, biased towards the length field and the header
        int flips = 1 + static_cast<int>(rng() % 4);
        for (int f = 0; f < flips; ++f) {
          std::size_t at = rng() % 2 ? rng() % 16 : rng() % bytes.size();
          if (rng() % 2) {
            bytes[at] = static_cast<char>(rng() & 0xFF);
          } else {
            bytes[at] = static_cast<char>(bytes[at] ^ (1 << (rng() % 8)));
          }
        }
      }
      if (kind != 0) bytes.resize(rng() % (bytes.size() + 1));
      std::string path;
      std::string err = read_error(dir, bytes, &path);
      if (err.empty()) {
        ++parsed;
      } else {
        ++rejected;
        CHECK(err.rfind(path + ": ", 0) == 0);
      }
    }
    MESSAGE("parsed ", parsed, ", rejected ", rejected);
    CHECK(rejected > 0);
  }
}

}  // namespace fusedopt::testing
