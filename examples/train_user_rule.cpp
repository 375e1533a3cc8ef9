// Trains a small model on the host with a user-written rule (not a preset): linear
// regression y = X w + b on synthetic data, gradients by hand, the update by fusedopt.
// Prints the loss as it goes down; exits 1 if it did not drop 100-fold. With a path
// argument, saves the optimizer's checkpoint there at the end (a safetensors file).
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "fusedopt/optimizer.hpp"

using namespace fusedopt;

// Momentum SGD with a decoupled weight decay and an EMA of the weights, written here.
constexpr const char* kRule = R"(# heavy-ball momentum with decoupled decay and a weight average
param  w
grad   dw
state  velocity = 0, average = w
hyper  lr = 0.05, mu = 0.9, decay = 1e-4, ema = 0.99

w = w * (1 - lr * decay)
velocity = mu * velocity + dw
w = w - lr * velocity
average = ema * average + (1 - ema) * w
)";

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf(
        "usage: train_user_rule [CHECKPOINT]\n"
        "Linear regression trained with a user-written rule; with CHECKPOINT, saves the "
        "optimizer's state there.\n");
    return 0;
  }
  try {
    const int features = 32, samples = 512;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(samples * features), y(samples), w_true(features);
    for (auto& v : w_true) v = normal(rng);
    for (int i = 0; i < samples; ++i) {
      float dot = 0.3f;
      for (int j = 0; j < features; ++j) dot += (x[i * features + j] = normal(rng)) * w_true[j];
      y[i] = dot + 0.01f * normal(rng);
    }
    std::vector<float> w(features, 0.0f), b(1, 0.0f), dw(features), db(1);
    ParamGroup group;
    group.params = {{w.data(), features, DType::F32, Device::host(), "w"},
                    {b.data(), 1, DType::F32, Device::host(), "b"}};
    group.grads = {{dw.data(), features, DType::F32, Device::host(), "dw"},
                   {db.data(), 1, DType::F32, Device::host(), "db"}};
    Optimizer opt(Rule::parse(kRule, "momentum_ema.rule"), {group});
    std::printf("%s\n", opt.stats().fusion_report.c_str());
    double first = 0, loss = 0;
    for (int step = 0; step <= 200; ++step) {
      loss = 0;
      std::fill(dw.begin(), dw.end(), 0.0f);
      db[0] = 0;
      for (int i = 0; i < samples; ++i) {
        float pred = b[0];
        for (int j = 0; j < features; ++j) pred += x[i * features + j] * w[j];
        const float err = pred - y[i];
        loss += 0.5 * err * err / samples;
        for (int j = 0; j < features; ++j) dw[j] += err * x[i * features + j] / samples;
        db[0] += err / samples;
      }
      if (step == 0) first = loss;
      if (step % 40 == 0) std::printf("step %3d  loss %.6f\n", step, loss);
      opt.step();
    }
    std::printf("loss %.6f -> %.6f\n", first, loss);
    if (argc > 1) {
      opt.save(argv[1]);
      std::printf("checkpoint: %s (w = %.6f %.6f ...)\n", argv[1], w[0], w[1]);
    }
    return loss < first / 100 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
