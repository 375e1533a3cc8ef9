// Compiles a preset for the host through fusedopt as a user's program would, and catches a
// RuleError by its type (with a shared libfusedopt, the exception's type info crosses the
// library boundary). Prints the kernel's key. Then steps LAMB with a reduction hook through
// the installed extension API (fusedopt/extension.hpp), as a library built on fusedopt would.
#include <cstdio>
#include <string>
#include <vector>

#include "fusedopt/extension.hpp"
#include "fusedopt/kernel.hpp"
#include "fusedopt/version.hpp"

namespace {

/// LAMB over one tensor with a reduction hook: the hook must see each of its passes once.
bool hook_sees_lamb_passes() {
  std::vector<float> p(64, 1.0f), g(64, 0.5f);
  fusedopt::ParamGroup group;
  group.params.push_back(fusedopt::Tensor(p.data(), 64));
  group.grads.push_back(fusedopt::Tensor(g.data(), 64));
  const fusedopt::Rule lamb = fusedopt::Rule::preset("lamb");
  std::unique_ptr<fusedopt::Optimizer> opt =
      fusedopt::OptimizerExtension::make(lamb, {group}, {}, {});
  std::vector<int> passes;
  fusedopt::OptimizerExtension::set_reduction_hook(
      *opt, [&passes](const fusedopt::ReductionPartials& t) { passes.push_back(t.pass); });
  opt->step();
  if (static_cast<int>(passes.size()) != lamb.reduction_passes() || p[0] == 1.0f) {
    std::fprintf(stderr, "consumer: the reduction hook saw %zu calls of LAMB's %d passes\n",
                 passes.size(), lamb.reduction_passes());
    return false;
  }
  return true;
}

}  // namespace

int main() {
  try {
    if (!hook_sees_lamb_passes()) return 1;
    try {
      fusedopt::Rule::parse("this is not a rule", "bad.rule");
      std::fprintf(stderr, "consumer: a malformed rule was accepted\n");
      return 1;
    } catch (const fusedopt::RuleError& e) {
      if (e.file() != "bad.rule") {
        std::fprintf(stderr, "consumer: RuleError names %s\n", e.file().c_str());
        return 1;
      }
    }
    fusedopt::CompiledKernel k =
        fusedopt::compile_kernel(fusedopt::Rule::preset("adamw"), fusedopt::Target::host());
    std::printf("consumer: fusedopt %s: adamw for %s: %s (%s, %zu bytes)\n",
                FUSEDOPT_VERSION_STRING, k.target.str().c_str(), k.key.c_str(), k.origin.c_str(),
                k.binary->size());
    return k.binary->empty() ? 1 : 0;
  } catch (const fusedopt::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
