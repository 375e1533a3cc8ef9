// Factored rules with block-quantized element states: came and adam_mini with m at 8 and 4
// bits, each step against the float64 step of their sources taken from the optimizer's own
// states (dequantized m, fp32 row and column states): params and row/column states to fp32
// accuracy, m's codes the nearest of the float64 values. A batch of matrices that do not each
// start on a block keeps its m unquantized.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "common/close.hpp"
#include "common/factored_reference.hpp"
#include "common/host_tensors.hpp"
#include "common/quant_reference.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::Optimizer;
using fusedopt::OptimizerOptions;
using fusedopt::Quant;
using fusedopt::Rule;

// A matrix longer than a chunk (rows of 53: chunks of whole rows on whole blocks), a batch
// whose matrices start on blocks (4 x 64 x 32), one whose matrices do not (2 x 5 x 300: kept
// unquantized), a 1-D param with a block's tail, a matrix of odd columns.
const std::vector<std::vector<std::int64_t>> kShapes = {
    {37, 53}, {4, 64, 32}, {2, 5, 300}, {1031}, {521, 263}};

/// The values of state `name` of param k as float64 (dequantized when quantized).
std::vector<double> values_of(const Optimizer& opt, const char* name, int k) {
  const std::vector<float> v = opt.state_values(name, k);
  return std::vector<double>(v.begin(), v.end());
}

/// A row or column state's values (fp32) as float64.
std::vector<double> fp32_of(const fusedopt::Tensor& t) {
  std::vector<double> out;
  for (std::int64_t i = 0; i < t.numel; ++i) out.push_back(at(t, i));
  return out;
}

/// Counts m's codes that differ from the nearest codes of the float64 values `want`
/// (block `block`), and checks the absmax to fp32 accuracy.
void count_codes(const Optimizer& opt, int k, const std::vector<double>& want, Quant q, int block,
                 std::int64_t& differ, std::int64_t& total) {
  const RefQuant rq = quantize_f64(want, q, block);
  const std::vector<int> got =
      codes_of(opt.state("m", k), static_cast<std::int64_t>(want.size()), q);
  const std::vector<float> absmax = absmax_of(opt.state("m.absmax", k));
  REQUIRE(absmax.size() == rq.absmax.size());
  for (std::size_t b = 0; b < absmax.size(); ++b) {
    REQUIRE(std::abs(absmax[b] - rq.absmax[b]) <= 1e-5 * rq.absmax[b]);
  }
  for (std::size_t i = 0; i < got.size(); ++i) differ += got[i] != rq.codes[i] ? 1 : 0;
  total += static_cast<std::int64_t>(got.size());
}

}  // namespace

TEST_SUITE("runtime") {
  TEST_CASE("came and adam_mini with quantized m follow their float64 step from their own states") {
    use_private_cache();
    const std::uint32_t seed = fresh_seed();
    INFO("seed " << seed << " (FUSEDOPT_TEST_SEED=" << seed << " replays it)");
    std::mt19937 rng(seed);
    std::normal_distribution<double> normal(0.0, 1.0);
    for (const char* preset : {"came", "adam_mini"}) {
      for (const char* storage : {"q8", "q4"}) {
        CAPTURE(std::string(preset));
        CAPTURE(std::string(storage));
        const bool came = preset == std::string("came");
        ShapedModel model(kShapes, rng, {{"lr", 1e-2}, {"weight_decay", 0.1}});
        OptimizerOptions o;
        o.state_storage = {{"m", storage}};
        o.quant_min_numel = 0;
        Optimizer opt(Rule::preset(preset), {model.group}, o);
        const Quant q = storage == std::string("q8") ? Quant::Q8S : Quant::Q4S;
        const int block = fusedopt::quant_bits(q) == 8 ? 256 : 128;
        for (int k = 0; k < static_cast<int>(kShapes.size()); ++k) {
          CHECK(opt.state("m", k).dtype == (k == 2 ? DType::F32 : DType::U8));
        }
        std::int64_t differ = 0, total = 0;
        for (int t = 1; t <= 20; ++t) {
          for (std::size_t k = 0; k < kShapes.size(); ++k) {
            const std::int64_t cols = kShapes[k].size() >= 2 ? kShapes[k].back() : 1;
            for (std::int64_t i = 0; i < model.g[k].numel(); ++i)
              model.g[k].set(i, normal(rng) * (1 + static_cast<double>((i / cols) % 5)));
          }
          // Each param's float64 step from the optimizer's states before the step.
          std::vector<CameRef> cref(kShapes.size());
          std::vector<MiniRef> mref(kShapes.size());
          for (std::size_t k = 0; k < kShapes.size(); ++k) {
            const int ki = static_cast<int>(k);
            std::vector<double> g;
            for (std::int64_t i = 0; i < model.g[k].numel(); ++i) g.push_back(model.g[k].get(i));
            const std::int64_t n = model.p[k].numel();
            const bool matrix = kShapes[k].size() >= 2;
            const std::int64_t C = matrix ? kShapes[k].back() : 1;
            const std::int64_t R = matrix ? kShapes[k][kShapes[k].size() - 2] : n;
            if (came) {
              CameRef& x = cref[k];
              x.p = model.values(k);
              x.factored = matrix;
              x.C = C;
              x.R = R;
              x.B = n / (R * C);
              x.m = values_of(opt, "m", ki);
              x.r = fp32_of(opt.state("r", ki));
              x.c = matrix ? fp32_of(opt.state("c", ki)) : std::vector<double>();
              x.rr = matrix ? fp32_of(opt.state("rr", ki)) : std::vector<double>();
              x.cc = matrix ? fp32_of(opt.state("cc", ki)) : std::vector<double>();
              x.step(g);
            } else {
              MiniRef& x = mref[k];
              x.p = model.values(k);
              x.cols = C;
              x.rows = n / C;
              x.m = values_of(opt, "m", ki);
              x.v = fp32_of(opt.state("v", ki));
              x.step(t, g);
            }
          }
          opt.step();
          for (std::size_t k = 0; k < kShapes.size(); ++k) {
            const int ki = static_cast<int>(k);
            INFO("step " << t << ", param " << k);
            const std::vector<double>& m = came ? cref[k].m : mref[k].m;
            check_close("param", model.values(k), came ? cref[k].p : mref[k].p, 1e-5);
            if (came) {
              check_close("r", fp32_of(opt.state("r", ki)), cref[k].r, 1e-5);
              if (cref[k].factored) {
                check_close("c", fp32_of(opt.state("c", ki)), cref[k].c, 1e-5);
                check_close("rr", fp32_of(opt.state("rr", ki)), cref[k].rr, 1e-5);
                check_close("cc", fp32_of(opt.state("cc", ki)), cref[k].cc, 1e-5);
              }
            } else {
              check_close("v", fp32_of(opt.state("v", ki)), mref[k].v, 1e-5);
            }
            if (k == 2) {
              check_close("m (unquantized)", values_of(opt, "m", ki), m, 1e-5);
            } else {
              count_codes(opt, ki, m, q, block, differ, total);
            }
          }
        }
        MESSAGE((std::string(preset) + " " + storage + ": "), differ, " of ", total,
                " codes of m differ from float64's nearest");
        CHECK(differ * 1000 <= total);
      }
    }
  }
}

}  // namespace fusedopt::testing
