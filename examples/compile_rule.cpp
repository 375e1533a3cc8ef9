// Compiles a rule file for a target and dtype binding through the kernel cache and says
// where the binary came from. Usage: compile_rule RULE_FILE [TARGET] [DTYPES]
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "fusedopt/kernel.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0) {
    if (argc >= 2) {
      std::printf("usage: %s RULE_FILE [TARGET=sm_90] [DTYPES=bf16:bf16:fp32+master]\n", argv[0]);
      return 0;
    }
    std::fprintf(stderr, "usage: %s RULE_FILE [TARGET=sm_90] [DTYPES=bf16:bf16:fp32+master]\n",
                 argv[0]);
    return 2;
  }
  std::ifstream in(argv[1]);
  std::stringstream text;
  text << in.rdbuf();
  try {
    // docs:begin compile
    fusedopt::Rule rule = fusedopt::Rule::parse(text.str(), argv[1]);
    // CUBIN for an H100, compiled once, then served from $FUSEDOPT_CACHE_DIR (no GPU needed).
    fusedopt::CompiledKernel k = fusedopt::compile_kernel(
        rule, fusedopt::Target::parse(argc > 2 ? argv[2] : "sm_90"),
        fusedopt::DTypeBinding::parse(argc > 3 ? argv[3] : "bf16:bf16:fp32+master"));
    std::printf("%s for %s (%s): %s, %zu bytes, %s in %.3f s\n", rule.name().c_str(),
                k.target.str().c_str(), k.dtypes.str().c_str(), k.key.c_str(), k.binary->size(),
                k.origin.c_str(), k.seconds);
    // docs:end compile
    return 0;
  } catch (const fusedopt::RuleError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 2;
  } catch (const fusedopt::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
