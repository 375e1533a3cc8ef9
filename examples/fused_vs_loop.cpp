// The AdamW preset over 300 tensors three ways: fused (one launch per step), one launch
// per tensor, and a plain per-tensor C++ loop written here in torch's formulation. The two
// fusedopt runs must agree bit for bit; the plain loop within fp32 rounding.
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "fusedopt/optimizer.hpp"

using namespace fusedopt;

int main(int argc, char** argv) {
  if (argc > 1) {
    const bool help = std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0;
    std::fprintf(help ? stdout : stderr,
                 "usage: fused_vs_loop\n"
                 "AdamW over 300 tensors fused, one launch per tensor, and a plain C++ loop; the "
                 "fused runs must agree bit for bit. No options.\n");
    return help ? 0 : 2;
  }
  try {
    std::mt19937 rng(11);
    std::uniform_int_distribution<int> size(1, 5000);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const int n = 300, steps = 10;
    const float lr = 1e-2f, b1 = 0.9f, b2 = 0.999f, eps = 1e-8f, wd = 1e-2f;
    std::vector<std::vector<float>> p(n), q(n), r(n), g(n), m(n), v(n);
    for (int i = 0; i < n; ++i) {
      p[i].resize(size(rng));
      for (auto& x : p[i]) x = normal(rng);
      q[i] = r[i] = p[i];
      g[i].resize(p[i].size());
      m[i].assign(p[i].size(), 0.0f);
      v[i].assign(p[i].size(), 0.0f);
    }
    auto group = [&](std::vector<std::vector<float>>& params, int first, int last) {
      ParamGroup pg;
      for (int i = first; i < last; ++i) {
        pg.params.push_back({params[i].data(), (std::int64_t)params[i].size(), DType::F32,
                             Device::host(), "p" + std::to_string(i)});
        pg.grads.push_back({g[i].data(), (std::int64_t)g[i].size(), DType::F32, Device::host(),
                            "g" + std::to_string(i)});
      }
      pg.hypers = {{"lr", lr}};
      return pg;
    };
    Optimizer fused(Rule::preset("adamw"), {group(p, 0, n)});
    std::vector<Optimizer> loop;
    for (int i = 0; i < n; ++i)
      loop.emplace_back(Rule::preset("adamw"), std::vector<ParamGroup>{group(q, i, i + 1)});
    for (int t = 1; t <= steps; ++t) {
      for (auto& gi : g) {
        for (auto& x : gi) x = normal(rng);
      }
      fused.step();
      for (auto& o : loop) o.step();
      // The plain loop: torch.optim.AdamW's single-tensor formulation, in fp32.
      const float bc1 = 1 - std::pow(b1, (float)t), bc2 = 1 - std::pow(b2, (float)t);
      for (int i = 0; i < n; ++i) {
        for (std::size_t k = 0; k < r[i].size(); ++k) {
          r[i][k] *= 1 - lr * wd;
          m[i][k] += (1 - b1) * (g[i][k] - m[i][k]);
          v[i][k] = b2 * v[i][k] + (1 - b2) * g[i][k] * g[i][k];
          r[i][k] -= lr / bc1 * m[i][k] / (std::sqrt(v[i][k]) / std::sqrt(bc2) + eps);
        }
      }
    }
    std::size_t bit_differences = 0;
    double worst = 0;
    for (int i = 0; i < n; ++i) {
      bit_differences += std::memcmp(p[i].data(), q[i].data(), p[i].size() * 4) != 0;
      for (std::size_t k = 0; k < p[i].size(); ++k)
        worst = std::max(worst, (double)std::fabs(p[i][k] - r[i][k]));
    }
    std::printf("%s\n", fused.stats().fusion_report.c_str());
    std::printf("fused vs one launch per tensor: %zu tensors differ in any bit\n", bit_differences);
    std::printf("fused vs a plain C++ loop: largest difference %.3g after %d steps\n", worst,
                steps);
    return bit_differences == 0 && worst < 1e-5 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
