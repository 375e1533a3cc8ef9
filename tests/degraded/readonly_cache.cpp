// A cache folder the user owns but cannot write to (mode 0500) still trains: kernels are
// kept in memory, one warning says so, and the folder stays empty. Root ignores modes, so
// as root the training runs in a child as another uid that owns the folder; the parent
// keeps root to clean up. Exits 0 when the steps match a float64 reference; the caller
// (one_warning.cmake) counts the warnings.
#include <grp.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <random>
#include <vector>

#include "fusedopt/optimizer.hpp"

namespace {

constexpr uid_t kOwnerWhenRoot = 12345;

constexpr const char* kRule = R"(param p
grad g
state m = 0
hyper lr = 0.1, mu = 0.9
m = mu * m + g
p = p - lr * m
)";

// Three steps of the rule on fresh random data against the same steps in float64.
int train_and_check() {
  const int n = 1000;
  std::mt19937 rng(std::random_device{}());
  std::normal_distribution<float> normal;
  std::vector<float> p(n), g(n);
  for (float& x : p) x = normal(rng);
  std::vector<double> p64(p.begin(), p.end()), m64(n, 0.0);
  fusedopt::ParamGroup group;
  group.params = {{p.data(), n, fusedopt::DType::F32, fusedopt::Device::host(), "w"}};
  group.grads = {{g.data(), n, fusedopt::DType::F32, fusedopt::Device::host(), "dw"}};
  fusedopt::Optimizer opt(fusedopt::Rule::parse(kRule, "momentum.rule"), {group});
  double worst = 0;
  for (int step = 0; step < 3; ++step) {
    for (float& x : g) x = normal(rng);
    opt.step();
    for (int i = 0; i < n; ++i) {
      m64[i] = 0.9 * m64[i] + g[i];
      p64[i] = p64[i] - 0.1 * m64[i];
      worst = std::fmax(worst, std::fabs(p[i] - p64[i]) / (1 + std::fabs(p64[i])));
    }
  }
  std::printf("3 steps with a read-only cache folder, largest relative error %.3g\n", worst);
  return worst < 1e-5 ? 0 : 1;
}

}  // namespace

int main() {
  namespace fs = std::filesystem;
  std::string tmpl = (fs::temp_directory_path() / "fusedopt-readonly-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) return 2;
  const fs::path root = tmpl;
  const fs::path cache = root / "cache";
  fs::create_directory(cache);
  const bool as_root = ::geteuid() == 0;
  if (as_root) {
    ::chmod(root.c_str(), 0711);
    if (::chown(cache.c_str(), kOwnerWhenRoot, kOwnerWhenRoot) != 0) return 2;
  }
  ::chmod(cache.c_str(), 0500);
  ::setenv("FUSEDOPT_CACHE_DIR", cache.c_str(), 1);
  ::setenv("FUSEDOPT_CACHE", "on", 1);
  const pid_t child = ::fork();
  if (child == 0) {
    if (as_root && (::setgroups(0, nullptr) != 0 || ::setgid(kOwnerWhenRoot) != 0 ||
                    ::setuid(kOwnerWhenRoot) != 0)) {
      _exit(2);
    }
    if (::chdir("/") != 0) _exit(2);
    int rc = 1;
    try {
      rc = train_and_check();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "training with a read-only cache folder failed: %s\n", e.what());
    }
    std::fflush(stdout);
    _exit(rc);
  }
  int status = 0;
  ::waitpid(child, &status, 0);
  int rc = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
  if (rc == 0 && !fs::is_empty(cache)) {
    std::fprintf(stderr, "the read-only cache folder was written to\n");
    rc = 1;
  }
  ::chmod(cache.c_str(), 0700);
  std::error_code ec;
  fs::remove_all(root, ec);
  return rc;
}
