// Loading quantized states: the one check of a loaded state (fusedopt/state_check.hpp) on
// its own, and Optimizer::load of checkpoints whose absmax or codes were changed and their
// checksum recomputed: refused, naming the state, param and block, the optimizer unchanged.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "codegen/quant.hpp"
#include "common/host_tensors.hpp"
#include "common/quant_reference.hpp"
#include "common/temp_dir.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/safetensors.hpp"
#include "fusedopt/state_check.hpp"

TEST_SUITE_BEGIN("runtime");

using fusedopt::DType;
using fusedopt::KeptState;
using fusedopt::LoadedState;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::ParamGroup;
using fusedopt::Quant;
using fusedopt::Rule;
using fusedopt::UsageError;
using fusedopt::testing::fresh_seed;
using fusedopt::testing::HostTensor;
using fusedopt::testing::nearest_f64;
using fusedopt::testing::use_private_cache;

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

/// `in` rewritten to `out` (its checksum recomputed by the writer) after `edit` changed the
/// bytes of tensor `name`.
template <class Edit>
void rewrite(const std::filesystem::path& in, const std::filesystem::path& out,
             const std::string& name, Edit edit) {
  const fusedopt::SafetensorsReader reader(in);
  std::vector<std::vector<unsigned char>> bytes;
  std::vector<fusedopt::SafetensorsTensor> tensors;
  for (const std::string& n : reader.names()) {
    const auto e = reader.entry(n);
    bytes.emplace_back(e.bytes);
    if (e.bytes > 0) reader.read(n, 0, e.bytes, bytes.back().data());
    if (n == name) edit(bytes.back().data());
    const DType dtype = *fusedopt::dtype_of_safetensors_name(e.dtype);
    tensors.push_back({n, dtype, e.shape.empty() ? 1 : e.shape[0], bytes.back().data()});
  }
  fusedopt::write_safetensors(out, tensors, reader.metadata());
}

void set_float(unsigned char* data, std::int64_t i, float x) { std::memcpy(data + 4 * i, &x, 4); }

/// Every byte of b's states (codes, absmax), to tell that a refused load changed nothing.
std::vector<unsigned char> state_bytes(const Optimizer& b) {
  std::vector<unsigned char> out;
  for (const char* name : {"m", "v", "m.absmax", "v.absmax"}) {
    for (int p = 0; p < 2; ++p) {
      const fusedopt::Tensor t = b.state(name, p);
      const auto* c = static_cast<const unsigned char*>(t.data);
      out.insert(out.end(), c, c + t.numel * static_cast<std::int64_t>(dtype_size(t.dtype)));
    }
  }
  return out;
}

/// Two AdamW optimizers with m and v at 8 bits (q8s and q8u) over the same
/// params, a of them stepped three times on gradients whose block `zero_block` of w0 is 0.
struct Pair {
  std::vector<HostTensor> pa, pb, g;
  std::unique_ptr<Optimizer> a, b;
  std::mt19937 rng;
  explicit Pair(int zero_block) : rng(fresh_seed()) {
    for (std::int64_t n : {5000, 300}) {
      pa.emplace_back(n, DType::F32);
      pb.emplace_back(n, DType::F32);
      g.emplace_back(n, DType::F32);
      fusedopt::testing::fill_normal(pa.back(), rng);
      for (std::int64_t i = 0; i < n; ++i) pb.back().set(i, pa.back().get(i));
    }
    OptimizerOptions o;
    o.state_storage = {{"m", "q8s"}, {"v", "q8u"}};
    a = std::make_unique<Optimizer>(Rule::preset("adamw"), std::vector<ParamGroup>{group(pa)}, o);
    b = std::make_unique<Optimizer>(Rule::preset("adamw"), std::vector<ParamGroup>{group(pb)}, o);
    for (int t = 0; t < 3; ++t) {
      grads(zero_block);
      a->step();
    }
  }
  ParamGroup group(std::vector<HostTensor>& p) {
    ParamGroup gr;
    for (std::size_t k = 0; k < p.size(); ++k) {
      gr.params.push_back(p[k].tensor("w" + std::to_string(k)));
      gr.grads.push_back(g[k].tensor());
    }
    return gr;
  }
  /// b's params set to a's (a checkpoint holds states, not params).
  void copy_params() {
    for (std::size_t k = 0; k < pa.size(); ++k) {
      for (std::int64_t i = 0; i < pa[k].numel(); ++i) pb[k].set(i, pa[k].get(i));
    }
  }
  void grads(int zero_block) {
    for (HostTensor& t : g) fusedopt::testing::fill_normal(t, rng);
    for (std::int64_t i = zero_block * 256; zero_block >= 0 && i < (zero_block + 1) * 256; ++i) {
      g[0].set(i, 0.0);
    }
  }
};

}  // namespace

TEST_CASE(
    "a checkpoint whose absmax is negative, NaN or infinite is refused with its checksum "
    "recomputed, naming the state, param and block, and changes nothing") {
  use_private_cache();
  const fusedopt::testing::TempDir dir;
  Pair s(-1);
  const auto good = dir.path() / "good.safetensors", bad = dir.path() / "bad.safetensors";
  s.a->save(good);
  const std::vector<unsigned char> before = state_bytes(*s.b);
  for (const char* state : {"m", "v"}) {
    for (float x : {-1.0f, kNaN, kInf, -kInf, -1e-30f}) {
      rewrite(good, bad, std::string("w0/") + state + ".absmax",
              [&](unsigned char* d) { set_float(d, 7, x); });
      const std::string shown = std::isnan(x) ? "nan"
                                : x == kInf   ? "inf"
                                : x == -kInf  ? "-inf"
                                : x == -1.0f  ? "-1"
                                              : "-1e-30";
      CHECK_THROWS_WITH_AS(s.b->load(bad),
                           doctest::Contains((std::string("state '") + state +
                                              "' of param 'w0': the absmax of block 7 (elements "
                                              "1792 to 2047) is " +
                                              shown)
                                                 .c_str()),
                           UsageError);
      CHECK(state_bytes(*s.b) == before);
    }
  }
  // The file as saved loads, and b steps as a does from there.
  s.b->load(good);
  s.copy_params();
  s.grads(-1);
  s.a->step();
  s.b->step();
  for (std::size_t k = 0; k < s.pa.size(); ++k) {
    CHECK(std::memcmp(s.pa[k].data(), s.pb[k].data(),
                      static_cast<std::size_t>(s.pa[k].numel()) * 4) == 0);
  }
}

TEST_CASE("a block of absmax 0 loads with the codes of an all-zero block, and with no other") {
  use_private_cache();
  const fusedopt::testing::TempDir dir;
  Pair s(2);  // block 2 of w0 never sees a gradient: m and v stay 0 there
  const auto good = dir.path() / "good.safetensors", bad = dir.path() / "bad.safetensors";
  s.a->save(good);
  // The code of 0 in each map, found here from the map's values.
  for (const char* state : {"m", "v"}) {
    const Quant q = state[0] == 'm' ? Quant::Q8S : Quant::Q8U;
    const int zero = nearest_f64(fusedopt::codegen::quant_map(q), 0.0, false, false);
    const fusedopt::Tensor codes = s.a->state(state, 0),
                           absmax = s.a->state(std::string(state) + ".absmax", 0);
    float a2 = 1;
    std::memcpy(&a2, static_cast<const float*>(absmax.data) + 2, 4);
    REQUIRE(a2 == 0.0f);
    for (std::int64_t i = 512; i < 768; ++i) {
      REQUIRE(static_cast<const unsigned char*>(codes.data)[i] == zero);
    }
  }
  s.b->load(good);  // an all-zero block is a state like any other
  s.copy_params();
  s.grads(2);
  s.a->step();
  s.b->step();
  CHECK(std::memcmp(s.pa[0].data(), s.pb[0].data(), 5000 * 4) == 0);

  s.a->save(good);
  const std::vector<unsigned char> before = state_bytes(*s.b);
  // Block 5's absmax set to 0 under codes of other values; a code changed in block 2.
  rewrite(good, bad, "w0/v.absmax", [](unsigned char* d) { set_float(d, 5, 0.0f); });
  CHECK_THROWS_WITH_AS(s.b->load(bad),
                       doctest::Contains("state 'v' of param 'w0': block 5 has absmax 0 (all its "
                                         "values 0) but element"),
                       UsageError);
  const int zero = nearest_f64(fusedopt::codegen::quant_map(Quant::Q8S), 0.0, false, false);
  rewrite(good, bad, "w0/m",
          [&](unsigned char* d) { d[600] = static_cast<unsigned char>(zero + 9); });
  CHECK_THROWS_WITH_AS(s.b->load(bad),
                       doctest::Contains(("state 'm' of param 'w0': block 2 has absmax 0 (all "
                                          "its values 0) but element 600 has code " +
                                          std::to_string(zero + 9))
                                             .c_str()),
                       UsageError);
  CHECK(state_bytes(*s.b) == before);
}

TEST_CASE("check_loaded_state refuses another storage, block, code dtype or count, by name") {
  std::vector<unsigned char> codes(1000, 0);
  std::vector<float> absmax(4, 0.5f);
  auto loaded = [&](const std::string& storage, std::int64_t block) {
    return LoadedState{storage, block, "U8", 1000, codes.data(), "F32", 4, absmax.data()};
  };
  const KeptState q8u{Quant::Q8U, 256, 1000};
  fusedopt::check_loaded_state("s", q8u, loaded("q8u", 256));
  fusedopt::check_loaded_state("s", q8u, loaded("", 0));  // not recorded: taken as kept
  CHECK_THROWS_WITH_AS(fusedopt::check_loaded_state("state 'v'", q8u, loaded("q8s", 256)),
                       "state 'v': it was saved as q8s codes (blocks of 256), this optimizer "
                       "keeps it as q8u codes (blocks of 256) (codes of another map are other "
                       "values)",
                       UsageError);
  CHECK_THROWS_WITH_AS(fusedopt::check_loaded_state("s", q8u, loaded("q8u", 128)),
                       doctest::Contains("saved as q8u codes (blocks of 128)"), UsageError);
  CHECK_THROWS_WITH_AS(
      fusedopt::check_loaded_state("s", KeptState{Quant::None, 0, 1000}, loaded("q8u", 256)),
      doctest::Contains("this optimizer keeps it as values (unquantized)"), UsageError);
  CHECK_THROWS_WITH_AS(fusedopt::check_loaded_state("s", q8u, loaded("-", 0)),
                       doctest::Contains("saved as values (unquantized), this optimizer keeps "
                                         "it as q8u codes"),
                       UsageError);
  CHECK_THROWS_WITH_AS(fusedopt::check_loaded_state("s", q8u, loaded("q5", 256)),
                       doctest::Contains("recorded storage 'q5' is none fusedopt writes"),
                       UsageError);
  LoadedState wide = loaded("q8u", 256);
  wide.codes_dtype = "I64";
  CHECK_THROWS_WITH_AS(fusedopt::check_loaded_state("s", q8u, wide),
                       doctest::Contains("its codes are 1000 I64; q8u codes of 1000 elements are "
                                         "1000 U8"),
                       UsageError);
  // 4-bit: two codes a byte; 1000 codes are too many.
  CHECK_THROWS_WITH_AS(
      fusedopt::check_loaded_state("s", KeptState{Quant::Q4U, 256, 1000}, loaded("q4u+sr", 256)),
      doctest::Contains("q4u codes of 1000 elements are 500 U8"), UsageError);
  LoadedState few = loaded("q8u", 256);
  few.absmax_numel = 3;
  CHECK_THROWS_WITH_AS(fusedopt::check_loaded_state("s", q8u, few),
                       doctest::Contains("its absmax is 3 F32; 1000 elements in blocks of 256 "
                                         "keep 4 F32"),
                       UsageError);
}
