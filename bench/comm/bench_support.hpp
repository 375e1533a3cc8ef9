// What the companion benchmarks under mpirun share (fusedopt-comm-bench,
// fusedopt-zero-bench): their options, the machine description, JSON strings, page faults
// and the median/min/max of a run.
#pragma once

#include <fmt/format.h>
#include <pthread.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace fusedopt_bench {

struct Args {
  int iters = 5;
  int warmup = 1;
  double scale = 1.0;
  std::string json;
  std::string transport = "both";  ///< fusedopt-comm-bench: both, mpi or shm
  double bucket_mib = 25;          ///< fusedopt-comm-bench: GradBucketer's bucket cap (DDP's)
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
    } else if (arg == "--bucket-mib") {
      a.bucket_mib = std::strtod(value.c_str(), &end);
      if (*end != '\0' || !(a.bucket_mib >= 1) || a.bucket_mib > 1024) {
        std::fprintf(stderr, "%s: --bucket-mib takes a number of MiB in [1, 1024], not '%s'\n",
                     program, value.c_str());
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

/// How fast data written by one core reaches another (CPU 0 and CPU 1): a thread on CPU 1
/// writes 256 KiB, a thread on CPU 0 copies it out, in turns, 2000 times; bytes written +
/// read per second. What a shared-memory transport's staging costs: fast where the two cores
/// share a cache, several times slower across chiplets (a VM's vCPUs move between them).
/// 0 with fewer than 2 CPUs.
inline double handoff_bandwidth() {
  if (std::thread::hardware_concurrency() < 2) return 0;
  auto pin = [](int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  };
  constexpr int kReps = 2000;
  std::vector<float> shared(1 << 16), local(shared.size());
  std::atomic<int> turn{0};
  std::thread writer([&] {
    pin(1);
    for (int r = 0; r < kReps; ++r) {
      while (turn.load(std::memory_order_acquire) != 2 * r) std::this_thread::yield();
      std::fill(shared.begin(), shared.end(), static_cast<float>(r));
      turn.store(2 * r + 1, std::memory_order_release);
    }
  });
  std::thread reader([&] {
    pin(0);
    for (int r = 0; r < kReps; ++r) {
      while (turn.load(std::memory_order_acquire) != 2 * r + 1) std::this_thread::yield();
      std::memcpy(local.data(), shared.data(), shared.size() * sizeof(float));
      turn.store(2 * r + 2, std::memory_order_release);
    }
  });
  const auto t0 = std::chrono::steady_clock::now();
  writer.join();
  reader.join();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return 2.0 * kReps * static_cast<double>(shared.size() * sizeof(float)) / s;
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
