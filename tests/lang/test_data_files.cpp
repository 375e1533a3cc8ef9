// The example rule files under tests/data: every bad/*.rule fails exactly as bad/EXPECTED
// says (the CLI tests use the same files), and every good/*.rule parses.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "common/rule_errors.hpp"
#include "common/temp_dir.hpp"

#ifndef FUSEDOPT_TEST_DATA
#error "FUSEDOPT_TEST_DATA must name the tests/data folder"
#endif

namespace fusedopt::testing {

using fusedopt::RuleError;
using fusedopt::lang::parse_rule;

namespace fs = std::filesystem;

namespace {

struct Expected {
  int line = 0;
  int col = 0;
  std::string message;
};

// EXPECTED: one line per file, "FILENAME LINE:COL substring-of-message".
std::map<std::string, Expected> read_expected(const fs::path& path) {
  std::map<std::string, Expected> out;
  std::istringstream in(read_file(path));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    const auto sp1 = line.find(' ');
    const auto colon = line.find(':', sp1);
    const auto sp2 = line.find(' ', colon);
    REQUIRE_MESSAGE(sp2 != std::string::npos, "malformed EXPECTED line: ", line);
    Expected e;
    e.line = std::stoi(line.substr(sp1 + 1, colon - sp1 - 1));
    e.col = std::stoi(line.substr(colon + 1, sp2 - colon - 1));
    e.message = line.substr(sp2 + 1);
    out[line.substr(0, sp1)] = e;
  }
  return out;
}

}  // namespace

TEST_SUITE("lang") {
  TEST_CASE("every bad rule file fails at the line, column and message in EXPECTED") {
    const fs::path dir = fs::path(FUSEDOPT_TEST_DATA) / "bad";
    const auto expected = read_expected(dir / "EXPECTED");
    CHECK(expected.size() >= 15);
    int files = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".rule") continue;
      ++files;
      const std::string name = entry.path().filename().string();
      CAPTURE(name);
      auto it = expected.find(name);
      REQUIRE_MESSAGE(it != expected.end(), name, " has no line in EXPECTED");
      try {
        parse_rule(read_file(entry.path()), name);
        FAIL_CHECK(name, " parsed, but should fail");
      } catch (const RuleError& e) {
        CHECK(e.file() == name);
        CHECK(e.line() == it->second.line);
        CHECK(e.column() == it->second.col);
        CHECK_MESSAGE(e.message().find(it->second.message) != std::string::npos, e.what());
      }
    }
    CHECK(files == static_cast<int>(expected.size()));
  }

  TEST_CASE("every good rule file parses") {
    const fs::path dir = fs::path(FUSEDOPT_TEST_DATA) / "good";
    int files = 0;
    for (const auto& entry : fs::directory_iterator(dir)) {
      if (entry.path().extension() != ".rule") continue;
      ++files;
      CAPTURE(entry.path().string());
      auto rule = parse_rule(read_file(entry.path()), entry.path().string());
      CHECK(rule->name == entry.path().stem().string());
      CHECK(rule->param >= 0);
      CHECK(rule->grad >= 0);
      CHECK_FALSE(rule->stmts.empty());
    }
    CHECK(files >= 2);
  }
}

}  // namespace fusedopt::testing
