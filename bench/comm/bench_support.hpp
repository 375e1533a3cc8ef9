// What the companion benchmarks under mpirun share (fusedopt-comm-bench,
// fusedopt-zero-bench): their options, the machine description, JSON strings, page faults
// and the median/min/max of a run.
#pragma once

#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <fstream>
#include <string>
#include <vector>

namespace fusedopt_bench {

struct Args {
  int iters = 5;
  int warmup = 1;
  double scale = 1.0;
  std::string json;
  std::string transport = "both";  ///< fusedopt-comm-bench: both, mpi or shm
};

/// The arguments, or exit code 2 with a message (every rank parses the same ones).
inline bool parse_args(int argc, char** argv, const char* program, const char* usage, Args& a) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::puts(usage);
      std::exit(0);
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "%s: %s needs a value\n%s\n", program, arg.c_str(), usage);
      return false;
    }
    const std::string value = argv[++i];
    char* end = nullptr;
    if (arg == "--iters" || arg == "--warmup") {
      const long v = std::strtol(value.c_str(), &end, 10);
      const long lowest = arg == "--iters" ? 1 : 0;
      if (*end != '\0' || v < lowest || v > 100000) {
        std::fprintf(stderr, "%s: %s takes a count >= %ld, not '%s'\n", program, arg.c_str(),
                     lowest, value.c_str());
        return false;
      }
      (arg == "--iters" ? a.iters : a.warmup) = static_cast<int>(v);
    } else if (arg == "--scale") {
      a.scale = std::strtod(value.c_str(), &end);
      if (*end != '\0' || !(a.scale > 0) || a.scale > 1) {
        std::fprintf(stderr, "%s: --scale takes a number in (0, 1], not '%s'\n", program,
                     value.c_str());
        return false;
      }
    } else if (arg == "--json") {
      a.json = value;
    } else if (arg == "--transport") {
      if (value != "both" && value != "mpi" && value != "shm") {
        std::fprintf(stderr, "%s: --transport takes both, mpi or shm, not '%s'\n", program,
                     value.c_str());
        return false;
      }
      a.transport = value;
    } else {
      std::fprintf(stderr, "%s: unknown option %s\n%s\n", program, arg.c_str(), usage);
      return false;
    }
  }
  return true;
}

/// The first line of /proc/cpuinfo or /proc/meminfo that starts with `key`, after the colon.
inline std::string proc_field(const char* file, const std::string& key) {
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, key.size(), key) != 0) continue;
    std::string v = line.substr(line.find(':') + 1);
    v.erase(0, v.find_first_not_of(" \t"));
    return v;
  }
  return "unknown";
}

inline std::string json_string(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      out += fmt::format("\\u{:04x}", c);
      continue;
    }
    out += c;
  }
  return out + "\"";
}

/// This process's minor page faults so far (first touches of fresh memory).
inline double minor_faults() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_minflt);
}

struct Summary {
  double median = 0, min = 0, max = 0;
};

inline Summary summarize(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  const std::size_t n = t.size();
  return {n % 2 ? t[n / 2] : 0.5 * (t[n / 2 - 1] + t[n / 2]), t.front(), t.back()};
}

/// Writes `text` to `path` whole, then renames it into place (never a half-written file);
/// false, with a message naming `program`, when it cannot.
inline bool write_whole(const char* program, const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  bool ok = f != nullptr && std::fwrite(text.data(), 1, text.size(), f) == text.size();
  if (f != nullptr) ok = std::fclose(f) == 0 && ok;
  ok = ok && std::rename(tmp.c_str(), path.c_str()) == 0;
  if (!ok) {
    std::remove(tmp.c_str());
    std::fprintf(stderr, "%s: cannot write %s\n", program, path.c_str());
  }
  return ok;
}

/// A benchmark's main: its options (exit 2 when bad), then `run`, whose exceptions are exit 1.
template <typename Run>
int bench_main(int argc, char** argv, const char* program, const char* usage, Run run) {
  Args args;
  if (!parse_args(argc, argv, program, usage, args)) return 2;
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace fusedopt_bench
