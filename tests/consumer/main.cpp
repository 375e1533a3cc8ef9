// Compiles a preset for the host through an installed fusedopt and prints the key.
#include <cstdio>

#include "fusedopt/kernel.hpp"

int main() {
  try {
    fusedopt::CompiledKernel k =
        fusedopt::compile_kernel(fusedopt::Rule::preset("adamw"), fusedopt::Target::host());
    std::printf("consumer: adamw for %s: %s (%s, %zu bytes)\n", k.target.str().c_str(),
                k.key.c_str(), k.origin.c_str(), k.binary->size());
    return k.binary->empty() ? 1 : 0;
  } catch (const fusedopt::Error& e) {
    std::fprintf(stderr, "consumer: %s\n", e.what());
    return 1;
  }
}
