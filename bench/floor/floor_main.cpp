// fusedopt-floor: the in-place floor of bench/floor.hpp for bench/torch_step.py, as a program of
// its own, so that the Python package carries no benchmark and the floor gets the flags the
// host kernels get (-O3 -march=native -fopenmp), not an extension's (nanobind builds modules
// with -Os, which ran this floor at 2.4-2.7x its -O3 time), and runs on its own OpenMP runtime
// rather than beside torch's threads.
//
//   fusedopt-floor [--runs N] PASS...
//
// PASS is one entry of a step's stats().traffic: ELEMENTS:READ:UPDATE:WRITE, each of the last
// three a comma-separated list of bits per element, one per role (possibly empty), e.g.
// "109514298:32:32,32,32:" for fp32 AdamW. Prints the best of N runs (default 5) after one
// untimed run, in seconds, and the bytes one run moves; the team is OpenMP's default
// (OMP_NUM_THREADS). Exit 2 for bad arguments.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "floor.hpp"

namespace {

bool parse_int(const std::string& text, long long& out) {
  if (text.empty()) return false;
  char* end = nullptr;
  out = std::strtoll(text.c_str(), &end, 10);
  return *end == '\0' && out >= 0;
}

bool parse_bits(const std::string& text, std::vector<int>& out) {
  std::size_t begin = 0;
  while (begin < text.size()) {
    std::size_t end = text.find(',', begin);
    if (end == std::string::npos) end = text.size();
    long long bits = 0;
    if (!parse_int(text.substr(begin, end - begin), bits) || bits < 1 || bits > 64) return false;
    out.push_back(static_cast<int>(bits));
    begin = end + 1;
  }
  return true;
}

bool parse_pass(const std::string& text, fusedopt::PassTraffic& p) {
  std::vector<std::string> f;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find(':', begin);
    f.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  long long elements = 0;
  if (f.size() != 4 || !parse_int(f[0], elements)) return false;
  p.elements = elements;
  return parse_bits(f[1], p.read_bits) && parse_bits(f[2], p.update_bits) &&
         parse_bits(f[3], p.write_bits);
}

int usage(const char* why) {
  std::fprintf(stderr,
               "fusedopt-floor: %s\nusage: fusedopt-floor [--runs N] "
               "ELEMENTS:READ_BITS:UPDATE_BITS:WRITE_BITS...\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  long long runs = 5;
  std::vector<fusedopt::PassTraffic> traffic;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--runs") {
      if (i + 1 >= argc || !parse_int(argv[i + 1], runs) || runs < 1) {
        return usage("--runs takes a positive integer");
      }
      ++i;
      continue;
    }
    fusedopt::PassTraffic p;
    if (!parse_pass(arg, p)) return usage(("bad pass '" + arg + "'").c_str());
    traffic.push_back(std::move(p));
  }
  if (traffic.empty()) return usage("no pass given");
  fusedopt::bench::InPlaceFloor floor(std::move(traffic));
  floor.seconds();  // first touch
  const double best = floor.best_seconds(static_cast<int>(runs));
  std::printf("%.9g %lld\n", best, static_cast<long long>(floor.bytes()));
  return 0;
}
