// The README's C++ example: a rule read from a file (examples/my_momentum.rule) runs over two
// host tensors, one fused launch per step, and saves its state. The gradients are those of
// 0.5 * |x - 1|^2 for every element x, so the parameters must end near 1. Then the presets
// adamw (with clipping) and lamb take a step each over the same tensors.
// Usage: quickstart [RULE_FILE=my_momentum.rule] [CHECKPOINT=optimizer.safetensors]
// Exit code: 0 when the loss fell 100-fold, 1 otherwise or on an error.
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "fusedopt/optimizer.hpp"

namespace {

// The user's backward pass: here the gradient of 0.5 * (x - 1)^2, and the loss.
double compute_grads(const std::vector<float>& x, std::vector<float>& dx) {
  double loss = 0;
  for (std::size_t i = 0; i < x.size(); ++i) {
    dx[i] = x[i] - 1.0f;
    loss += 0.5 * dx[i] * dx[i];
  }
  return loss;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::printf(
        "usage: quickstart [RULE_FILE=my_momentum.rule] "
        "[CHECKPOINT=optimizer.safetensors]\n");
    return 0;
  }
  const char* rule_file = argc > 1 ? argv[1] : "my_momentum.rule";
  const char* checkpoint = argc > 2 ? argv[2] : "optimizer.safetensors";
  try {
    std::ifstream in(rule_file);
    std::stringstream text;
    text << in.rdbuf();
    // docs:begin quickstart
    using fusedopt::Device;
    using fusedopt::DType;
    fusedopt::Rule rule = fusedopt::Rule::parse(text.str(), rule_file);  // or Rule::preset("adamw")

    std::vector<float> w(64 * 32), b(32);  // the parameters (yours: any host or CUDA memory)
    std::vector<float> dw(w.size()), db(b.size());  // their gradients
    fusedopt::ParamGroup group;  // the shape {64, 32} is optional (rules may read rows, cols)
    group.params = {{w.data(), 64 * 32, DType::F32, Device::host(), "w", {64, 32}},
                    {b.data(), 32, DType::F32, Device::host(), "b"}};
    group.grads = {{dw.data(), 64 * 32, DType::F32, Device::host(), "dw"},
                   {db.data(), 32, DType::F32, Device::host(), "db"}};
    group.hypers = {{"lr", 0.05}};  // overrides the rule's default
    fusedopt::Optimizer opt(rule, {group});
    std::printf("%s\n", opt.stats().fusion_report.c_str());

    double first = 0, loss = 0;
    for (int step = 0; step < 100; ++step) {
      loss = compute_grads(w, dw) + compute_grads(b, db);  // your backward pass
      if (step == 0) first = loss;
      opt.step();  // one launch for both tensors
    }
    opt.save(checkpoint);  // safetensors: one tensor per (param, state), atomic
    // docs:end quickstart
    std::printf("loss %.6f -> %.6f; checkpoint %s\n", first, loss, checkpoint);

    // Presets, clipping and a rule with reductions over the same tensors.
    // docs:begin presets
    fusedopt::OptimizerOptions clip;
    clip.max_grad_norm = 1.0;  // torch's clip_grad_norm_, fused: one more reduction pass
    fusedopt::Optimizer adamw(fusedopt::Rule::preset("adamw"), {group}, clip);
    fusedopt::Optimizer lamb(fusedopt::Rule::preset("lamb"), {group});
    adamw.step();
    lamb.step();
    std::printf("%s\n", lamb.stats().schedule_report.c_str());  // its passes, what each moves
    // docs:end presets
    return loss < first / 100 ? 0 : 1;
  } catch (const fusedopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
