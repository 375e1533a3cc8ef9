// The public SafetensorsReader and write_safetensors (fusedopt/safetensors.hpp): ranges of
// tensors read back exactly, out-of-range reads and absent tensors are IoErrors, a damaged
// header is refused at open, and verify() finds a damaged data section that range reads do
// not look at.
#include <doctest/doctest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <random>
#include <vector>

#include "common/safetensors_files.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/safetensors.hpp"

namespace fusedopt::testing {

namespace {

std::filesystem::path temp_file(const std::string& name) {
  return std::filesystem::temp_directory_path() /
         (name + "-" + std::to_string(std::random_device{}()) + ".safetensors");
}

}  // namespace

TEST_SUITE("io") {
  TEST_CASE("SafetensorsReader reads ranges of tensors written by write_safetensors") {
    std::mt19937_64 rng(std::random_device{}());
    std::uniform_real_distribution<float> u(-1, 1);
    std::vector<float> a(1000), b(37);
    for (float& x : a) x = u(rng);
    for (float& x : b) x = u(rng);
    std::vector<std::uint16_t> h(5);
    for (auto& x : h) x = static_cast<std::uint16_t>(rng());
    const auto path = temp_file("reader");
    fusedopt::write_safetensors(path,
                                {{"w/m", fusedopt::DType::F32, 1000, a.data()},
                                 {"w/v", fusedopt::DType::F32, 37, b.data()},
                                 {"h", fusedopt::DType::BF16, 5, h.data()}},
                                {{"step", "7"}});
    const fusedopt::SafetensorsReader r(path);
    CHECK(r.metadata().at("step") == "7");
    CHECK(r.metadata().count("fusedopt_xxh3_64") == 0);
    CHECK(r.checksum().size() == 16);
    CHECK(r.names() == std::vector<std::string>{"h", "w/m", "w/v"});
    CHECK(r.entry("w/m").bytes == 4000);
    CHECK(r.entry("h").dtype == "BF16");
    std::uniform_int_distribution<int> pick(0, 999);
    for (int t = 0; t < 20; ++t) {
      int lo = pick(rng), hi = pick(rng);
      if (lo > hi) std::swap(lo, hi);
      std::vector<float> got(static_cast<std::size_t>(hi - lo));
      r.read("w/m", 4 * static_cast<std::uint64_t>(lo), 4 * got.size(), got.data());
      CHECK(got == std::vector<float>(a.begin() + lo, a.begin() + hi));
    }
    std::vector<std::uint16_t> h2(5);
    r.read("h", 0, 10, h2.data());
    CHECK(h2 == h);
    float x = 0;
    CHECK_THROWS_AS(r.read("w/v", 145, 4, &x), fusedopt::IoError);  // past its 148 bytes
    CHECK_THROWS_AS(r.read("nope", 0, 4, &x), fusedopt::IoError);
    CHECK(r.verify());
    // Damage one data byte: range reads do not notice, verify() does.
    {
      std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
      f.seekp(-3, std::ios::end);
      f.put('\x55');
    }
    const fusedopt::SafetensorsReader damaged(path);
    CHECK_THROWS_WITH_AS(damaged.verify(), doctest::Contains("does not match its checksum"),
                         fusedopt::IoError);
    std::filesystem::remove(path);
  }

  TEST_CASE("a streamed write holds one tensor at a time and equals a whole write") {
    std::mt19937_64 rng(std::random_device{}());
    std::vector<std::vector<float>> data(4);
    std::vector<fusedopt::SafetensorsTensor> tensors;
    for (std::size_t i = 0; i < data.size(); ++i) {
      data[i].resize(100 * i + 3);
      for (float& x : data[i]) x = static_cast<float>(rng() % 1000) / 7.0f;
      tensors.push_back({"t" + std::to_string(i), fusedopt::DType::F32,
                         static_cast<std::int64_t>(data[i].size()), data[i].data()});
    }
    const auto whole = temp_file("whole"), streamed = temp_file("streamed");
    fusedopt::write_safetensors(whole, tensors, {{"k", "v"}});
    std::vector<std::size_t> order;
    fusedopt::write_safetensors(streamed, tensors, {{"k", "v"}}, [&](std::size_t i, void* out) {
      order.push_back(i);
      std::memcpy(out, data[i].data(), data[i].size() * 4);
    });
    CHECK(order == std::vector<std::size_t>{0, 1, 2, 3});
    auto bytes = [](const std::filesystem::path& p) {
      std::ifstream f(p, std::ios::binary);
      return std::string(std::istreambuf_iterator<char>(f), {});
    };
    CHECK(bytes(whole) == bytes(streamed));  // the checksum patched in is the same
    CHECK(fusedopt::SafetensorsReader(streamed).verify());
    // A source that fails leaves nothing behind.
    const auto failed = temp_file("failed");
    CHECK_THROWS_WITH_AS(fusedopt::write_safetensors(failed, tensors, {},
                                                     [&](std::size_t i, void*) {
                                                       if (i == 2) throw fusedopt::IoError("gone");
                                                     }),
                         doctest::Contains("not written: gone"), fusedopt::IoError);
    CHECK_FALSE(std::filesystem::exists(failed));
    std::filesystem::remove(whole);
    std::filesystem::remove(streamed);
  }

  TEST_CASE("SafetensorsReader refuses a damaged header at open, naming the file") {
    const auto path = temp_file("bad-header");
    std::ofstream(path, std::ios::binary) << fusedopt::testing::raw_safetensors(
        R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,12]}})", std::string(12, '\0'));
    CHECK_THROWS_WITH_AS(
        fusedopt::SafetensorsReader{path},
        doctest::Contains(
            (path.string() + ": tensor 'a': shape [4] of F32 needs 16 bytes").c_str()),
        fusedopt::IoError);
    std::filesystem::remove(path);
  }
}

}  // namespace fusedopt::testing
