// Round trips through write_safetensors/read_safetensors, metadata, escapes and atomicity.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <random>

#include "common/safetensors_files.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "io/json.hpp"
#include "io/safetensors.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;
using fusedopt::Error;
using fusedopt::io::dtype_bytes;
using fusedopt::io::read_safetensors;
using fusedopt::io::TensorView;
using fusedopt::io::write_safetensors;

namespace {

struct Owned {
  std::string name, dtype;
  std::vector<std::int64_t> shape;
  std::string bytes;
};

std::vector<Owned> sample_tensors(std::mt19937_64& rng) {
  auto make = [&](std::string name, std::string dtype, std::vector<std::int64_t> shape) {
    std::size_t n = static_cast<std::size_t>(dtype_bytes(dtype));
    for (auto d : shape) n *= static_cast<std::size_t>(d);
    return Owned{std::move(name), std::move(dtype), std::move(shape),
                 fusedopt::testing::random_bytes(n, rng)};
  };
  // Odd sizes first so that later tensors start at unaligned offsets.
  return {make("layer.0.weight", "F32", {2, 3}),
          make("bias", "F16", {5}),
          make("bf", "BF16", {3, 1, 2}),
          make("d", "F64", {4}),
          make("step", "I64", {}),
          make("empty", "F32", {0, 3}),
          make("bytes", "U8", {7}),
          make("ints", "I32", {2, 2}),
          make("flags", "BOOL", {3}),
          make("scalar", "F64", {})};
}

std::vector<TensorView> views(const std::vector<Owned>& owned) {
  std::vector<TensorView> v;
  for (const Owned& o : owned)
    v.push_back({o.name, o.dtype, o.shape, o.bytes.data(), o.bytes.size()});
  return v;
}

std::vector<std::string> files_in(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("dtype sizes follow the safetensors specification") {
    CHECK(dtype_bytes("F32") == 4);
    CHECK(dtype_bytes("F16") == 2);
    CHECK(dtype_bytes("BF16") == 2);
    CHECK(dtype_bytes("F64") == 8);
    CHECK(dtype_bytes("I64") == 8);
    CHECK(dtype_bytes("I32") == 4);
    CHECK(dtype_bytes("U8") == 1);
    CHECK(dtype_bytes("BOOL") == 1);
    CHECK(dtype_bytes("F8_E4M3") == 1);
    CHECK(dtype_bytes("f32") == 0);
    CHECK(dtype_bytes("F128") == 0);
  }

  TEST_CASE("each DType has one safetensors name, read back to the same DType") {
    using fusedopt::DType;
    const std::pair<DType, const char*> expected[] = {{DType::F32, "F32"},
                                                      {DType::F16, "F16"},
                                                      {DType::BF16, "BF16"},
                                                      {DType::F64, "F64"},
                                                      {DType::U8, "U8"}};
    for (const auto& [dtype, name] : expected) {
      CAPTURE(name);
      CHECK(std::string(fusedopt::safetensors_name(dtype)) == name);
      CHECK(fusedopt::dtype_of_safetensors_name(name) == dtype);
      CHECK(dtype_bytes(name) == fusedopt::dtype_size(dtype));
    }
    for (const char* other : {"I64", "BOOL", "F8_E4M3", "f32", "fp32", ""}) {
      CAPTURE(other);
      CHECK_FALSE(fusedopt::dtype_of_safetensors_name(other).has_value());
    }
  }

  TEST_CASE("tensors of several dtypes and shapes survive a round trip byte for byte") {
    std::mt19937_64 rng{std::random_device{}()};
    TempDir dir;
    fs::path p = dir.path() / "ckpt.safetensors";
    std::vector<Owned> owned = sample_tensors(rng);
    write_safetensors(p, views(owned), {});

    auto file = read_safetensors(p);
    CHECK(file.metadata.empty());
    REQUIRE(file.tensors.size() == owned.size());
    std::uint64_t offset = 0;
    for (const Owned& o : owned) {
      CAPTURE(o.name);
      const auto& e = file.tensors.at(o.name);
      CHECK(e.dtype == o.dtype);
      CHECK(e.shape == o.shape);
      // Written in the order given: offsets grow along the input list.
      CHECK(e.begin == offset);
      CHECK(e.end == offset + o.bytes.size());
      offset = e.end;
      CHECK(std::memcmp(file.tensor_data(o.name), o.bytes.data(), o.bytes.size()) == 0);
    }
    CHECK(file.data.size() == offset);
    CHECK(file.tensors.at("scalar").shape.empty());
    CHECK(file.tensors.at("empty").begin == file.tensors.at("empty").end);

    // The header is padded with spaces so that the data section starts 8-byte aligned.
    std::string raw = read_file(p);
    std::uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
    CHECK((8 + n) % 8 == 0);
    CHECK(raw.size() == 8 + n + offset);
    CHECK(raw[8] == '{');
  }

  TEST_CASE("an empty tensor list writes a valid file with an empty data section") {
    TempDir dir;
    fs::path p = dir.path() / "empty.safetensors";
    write_safetensors(p, {}, {});
    auto file = read_safetensors(p);
    CHECK(file.tensors.empty());
    CHECK(file.data.empty());
  }

  TEST_CASE("metadata survives a round trip including quotes, control characters and UTF-8") {
    TempDir dir;
    fs::path p = dir.path() / "meta.safetensors";
    std::map<std::string, std::string> meta = {{"format", "pt"},
                                               {"quote\"back\\slash", "line\nbreak\ttab\x01\x1f"},
                                               {"caf\xc3\xa9", "\xf0\x9f\x98\x80 \xe2\x82\xac"},
                                               {"empty", ""}};
    float x = 1.5f;
    write_safetensors(p, {{"x", "F32", {1}, &x, 4}}, meta);
    auto file = read_safetensors(p);
    CHECK(file.metadata == meta);
  }

  TEST_CASE("unicode escapes in metadata decode to UTF-8, surrogate pairs included") {
    TempDir dir;
    fs::path p = dir.path() / "esc.safetensors";
    write_file(
        p, raw_safetensors(
               R"({"__metadata__":{"k\u00e9y":"\u0041\u00e9\u20ac\ud83d\ude00\/\b\f\r\n"}})", ""));
    auto file = read_safetensors(p);
    REQUIRE(file.metadata.size() == 1);
    CHECK(file.metadata.begin()->first == "k\xc3\xa9y");
    CHECK(file.metadata.begin()->second == "A\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80/\b\f\r\n");
  }

  TEST_CASE("the JSON writer escapes what JSON requires and refuses invalid UTF-8") {
    std::string out;
    fusedopt::io::append_json_string(out, std::string("a\"\\\n\x02\xc3\xa9", 7));
    CHECK(out == "\"a\\\"\\\\\\n\\u0002\xc3\xa9\"");
    std::string bad;
    CHECK_THROWS_AS(fusedopt::io::append_json_string(bad, "\xff"), Error);
    CHECK_FALSE(fusedopt::io::is_valid_utf8("\xc0\xaf"));      // overlong '/'
    CHECK_FALSE(fusedopt::io::is_valid_utf8("\xed\xa0\x80"));  // encoded surrogate
    CHECK(fusedopt::io::is_valid_utf8("\xf4\x8f\xbf\xbf"));    // U+10FFFF
  }

  TEST_CASE("invalid tensors are refused with the tensor named and nothing written") {
    TempDir dir;
    fs::path p = dir.path() / "bad.safetensors";
    const std::string at = p.string() + ": ";
    float buf[4] = {1, 2, 3, 4};
    CHECK_THROWS_WITH_AS(
        write_safetensors(p, {{"w", "F32", {2, 3}, buf, 16}}, {}),
        (at + "tensor 'w': 16 bytes given but shape [2, 3] of F32 needs 24").c_str(), Error);
    CHECK_THROWS_WITH_AS(write_safetensors(p, {{"", "F32", {1}, buf, 4}}, {}),
                         (at + "a tensor has an empty name").c_str(), Error);
    CHECK_THROWS_WITH_AS(
        write_safetensors(p, {{"a", "F32", {1}, buf, 4}, {"a", "F32", {1}, buf, 4}}, {}),
        (at + "duplicate tensor name 'a'").c_str(), Error);
    CHECK_THROWS_WITH_AS(write_safetensors(p, {{"h", "F24", {1}, buf, 3}}, {}),
                         (at + "tensor 'h': unknown dtype \"F24\"").c_str(), Error);
    CHECK_THROWS_WITH_AS(
        write_safetensors(p, {{"n", "F32", {-1, 2}, buf, 0}}, {}),
        (at + "tensor 'n': shape [-1, 2] has a negative dimension or overflows").c_str(), Error);
    CHECK_THROWS_WITH_AS(write_safetensors(p, {{"__metadata__", "F32", {1}, buf, 4}}, {}),
                         (at + "tensor name \"__metadata__\" is reserved").c_str(), Error);
    CHECK_THROWS_WITH_AS(write_safetensors(p, {{"x", "F32", {1}, buf, 4}}, {{"k", "\xfe"}}),
                         (at + "metadata entry 'k' is not valid UTF-8").c_str(), Error);
    CHECK(files_in(dir.path()).empty());
  }

  TEST_CASE("writing into a read-only folder throws and creates no file") {
    TempDir dir;
    fs::path ro = dir.path() / "ro";
    fs::create_directory(ro);
    ::chmod(ro.c_str(), 0555);
    // Root ignores mode bits; /proc/self is a folder no one can create files in.
    if (::geteuid() == 0) ro = "/proc/self";
    fs::path p = ro / "ckpt.safetensors";
    float x = 2.0f;
    CHECK_THROWS_WITH_AS(write_safetensors(p, {{"x", "F32", {1}, &x, 4}}, {}),
                         doctest::Contains((p.string() + ": cannot write (create ").c_str()),
                         Error);
    CHECK_FALSE(fs::exists(p));
    if (ro != "/proc/self") CHECK(files_in(ro).empty());
    ::chmod((dir.path() / "ro").c_str(), 0700);
  }

  TEST_CASE("a write that fails part way leaves the existing file untouched and no temp file") {
    TempDir dir;
    fs::path p = dir.path() / "ckpt.safetensors";
    std::mt19937_64 rng{std::random_device{}()};
    std::vector<Owned> first = sample_tensors(rng);
    write_safetensors(p, views(first), {{"step", "1"}});
    const std::string before = read_file(p);

    // A validation failure happens before any file is touched.
    float x = 0;
    CHECK_THROWS_AS(write_safetensors(p, {{"x", "F32", {2}, &x, 4}}, {}), Error);
    CHECK(read_file(p) == before);

    // A file-size limit makes write() fail with EFBIG in the middle of the data; unlike a
    // read-only folder this works for root too.
    std::string big(1 << 20, '\x5a');
    struct rlimit old {};
    REQUIRE(::getrlimit(RLIMIT_FSIZE, &old) == 0);
    auto old_handler = std::signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = old;
    small.rlim_cur = 64 * 1024;
    REQUIRE(::setrlimit(RLIMIT_FSIZE, &small) == 0);
    bool threw = false;
    std::string message;
    try {
      write_safetensors(
          p, {{"big", "U8", {static_cast<std::int64_t>(big.size())}, big.data(), big.size()}}, {});
    } catch (const Error& e) {
      threw = true;
      message = e.what();
    }
    ::setrlimit(RLIMIT_FSIZE, &old);
    std::signal(SIGXFSZ, old_handler);
    CHECK(threw);
    CHECK(message.rfind(p.string() + ": cannot write (write ", 0) == 0);
    CHECK(read_file(p) == before);
    CHECK(files_in(dir.path()) == std::vector<std::string>{"ckpt.safetensors"});
    CHECK(read_safetensors(p).metadata.at("step") == "1");
  }

  TEST_CASE("rewriting a file replaces it whole") {
    TempDir dir;
    fs::path p = dir.path() / "ckpt.safetensors";
    std::int64_t a = 7, b = 9;
    write_safetensors(p, {{"a", "I64", {}, &a, 8}}, {});
    write_safetensors(p, {{"b", "I64", {1}, &b, 8}}, {{"v", "2"}});
    auto file = read_safetensors(p);
    CHECK(file.tensors.count("a") == 0);
    CHECK(*static_cast<const std::int64_t*>(file.tensor_data("b")) == 9);
    CHECK_THROWS_WITH_AS(file.tensor_data("a"), "no tensor named 'a' in the file", Error);
    CHECK(files_in(dir.path()) == std::vector<std::string>{"ckpt.safetensors"});
  }
}

}  // namespace fusedopt::testing
