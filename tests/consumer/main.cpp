// Compiles a preset for the host through fusedopt as a user's program would, and catches a
// RuleError by its type (with a shared libfusedopt, the exception's type info crosses the
// library boundary). Prints the kernel's key.
#include <cstdio>
#include <string>

#include "fusedopt/kernel.hpp"
#include "fusedopt/version.hpp"

int main() {
  try {
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
