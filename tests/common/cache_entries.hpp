// Helpers shared by the cache tests: a private temp folder per test, raw file access for
// corrupting entries by hand, and scoped environment variables.
#pragma once

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <stdexcept>
#include <string>

#include "cache/kernel_cache.hpp"
#include "common/scoped_env.hpp"
#include "common/temp_dir.hpp"

namespace fusedopt::testing {

/// A record shaped like the ones codegen builds.
inline cache::KeyRecord make_record(const std::string& source,
                                    const std::string& target = "sm_90") {
  cache::KeyRecord record;
  record.add("source", source).add("target", target).add("format_version", "1");
  return record;
}

/// A payload with every byte value, zeros included, so that no string truncation hides.
inline std::string binary_payload(std::size_t n, unsigned seed = 1) {
  std::string out(n, '\0');
  std::uint32_t x = seed * 2654435761u + 1;
  for (std::size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

/// Sets a file's mtime to `seconds_ago` before now.
inline void set_age(const std::filesystem::path& path, long seconds_ago) {
  struct timespec times[2];
  ::clock_gettime(CLOCK_REALTIME, &times[0]);
  times[0].tv_sec -= seconds_ago;
  times[1] = times[0];
  ::utimensat(AT_FDCWD, path.c_str(), times, 0);
}

}  // namespace fusedopt::testing
