// The CUDA emulator's access report in a test (FUSEDOPT_EMU_ACCESS_REPORT, src/emu/access_log.hpp):
// set to a fresh file while a Report lives, read back as one Launch per line.
#pragma once

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/temp_dir.hpp"

namespace fusedopt::testing {

/// One line of the report: a launch.
struct Launch {
  std::string kernel;
  std::map<std::string, double> v;  ///< load_requests, load_sectors, load_ideal, store_...
};

/// FUSEDOPT_EMU_ACCESS_REPORT set to a fresh file while it lives; read() parses it.
struct Report {
  fusedopt::testing::TempDir dir;
  std::string path = (dir.path() / "access.txt").string();
  Report() { setenv("FUSEDOPT_EMU_ACCESS_REPORT", path.c_str(), 1); }
  ~Report() { unsetenv("FUSEDOPT_EMU_ACCESS_REPORT"); }
  std::vector<Launch> read() const {
    std::vector<Launch> out;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      Launch l;
      std::istringstream words(line);
      for (std::string w; words >> w;) {
        const auto eq = w.find('=');
        if (w.compare(0, eq, "kernel") == 0) {
          l.kernel = w.substr(eq + 1);
        } else {
          l.v[w.substr(0, eq)] = std::stod(w.substr(eq + 1));
        }
      }
      out.push_back(l);
    }
    return out;
  }
};

/// Every launch of `launches` within `bound` x the ideal sectors, loads and stores.
inline void check_coalesced(const std::vector<Launch>& launches, double bound) {
  for (const Launch& l : launches) {
    CAPTURE(l.kernel);
    for (const char* kind : {"load", "store"}) {
      CAPTURE(kind);
      const double sectors = l.v.at(std::string(kind) + "_sectors");
      const double ideal = l.v.at(std::string(kind) + "_ideal");
      CHECK(sectors <= bound * ideal);
    }
    CHECK(l.v.at("dropped") == 0);
  }
}

}  // namespace fusedopt::testing
