// fusedopt-cache end to end: warmup, verify, repair, concurrency, check, help, bad input.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/requirements.hpp"
#include "common/run.hpp"
#include "fusedopt/kernel.hpp"
#include "support/build_dirs.hpp"

namespace fusedopt::testing {

namespace fs = std::filesystem;

namespace {

std::vector<fs::path> entries(const fs::path& dir, const std::string& ext) {
  std::vector<fs::path> out;
  if (!fs::exists(dir)) return out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().extension() == ext) out.push_back(e.path());
  }
  return out;
}

int json_int(const std::string& json, const std::string& field) {
  std::smatch m;
  std::regex re("\"" + field + "\": ([0-9]+)");
  REQUIRE(std::regex_search(json, m, re));
  return std::stoi(m[1]);
}

/// For the case that runs only where NVRTC is missing.
const Availability& nvrtc_absence() {
  static const Availability a = [] {
    Availability out;
    out.present = !nvrtc_availability().present;
    if (!out.present) out.why = "NVRTC is installed";
    return out;
  }();
  return a;
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE("warmup for a CUDA target where NVRTC is missing says it could not be loaded" *
            Requires(nvrtc_absence())) {
    TempDir d;
    CliResult r = run_cli({"warmup", "--preset", "sgd", "--target", "sm_80", "--cache-dir",
                           (d.path() / "c").string()});
    INFO(r.out << r.err);
    CHECK(r.code != 0);
    CHECK(r.err.find("NVRTC could not be loaded") != std::string::npos);
  }

  TEST_CASE("warmup writes a CUBIN without a GPU; again it compiles and rewrites nothing" *
            needs_nvrtc()) {
    TempDir d;
    std::string dir = (d.path() / "cache").string();
    CliResult first =
        run_cli({"warmup", "--preset", "adamw", "--target", "sm_90", "--cache-dir", dir, "--json"});
    INFO(first.out << first.err);
    REQUIRE(first.code == 0);
    CHECK(json_int(first.out, "compiled") == 1);
    auto cubins = entries(dir, ".cubin");
    REQUIRE(cubins.size() == 1);
    struct stat before {};
    REQUIRE(stat(cubins[0].c_str(), &before) == 0);
    std::string bytes = read_file(cubins[0]);

    CliResult again =
        run_cli({"warmup", "--preset", "adamw", "--target", "sm_90", "--cache-dir", dir, "--json"});
    REQUIRE(again.code == 0);
    CHECK(json_int(again.out, "compiled") == 0);
    CHECK(json_int(again.out, "cached") == 1);
    struct stat after {};
    REQUIRE(stat(cubins[0].c_str(), &after) == 0);
    CHECK(after.st_ino == before.st_ino);  // not replaced by a rename
    CHECK(read_file(cubins[0]) == bytes);
    CHECK(entries(dir, ".cubin").size() == 1);
    CHECK(entries(dir, ".tmp").empty());
  }

  TEST_CASE("verify, prune and clear report as JSON with --json, as warmup and list do") {
    TempDir d;
    std::string dir = (d.path() / "cache").string();
    REQUIRE(run_cli({"warmup", "--preset", "adamw", "--preset", "sgd", "--cache-dir", dir}).code ==
            0);
    auto sos = entries(dir, ".so");
    REQUIRE(sos.size() == 2);
    CliResult good = run_cli({"verify", "--json", "--cache-dir", dir});
    INFO(good.out << good.err);
    CHECK(good.code == 0);
    CHECK(json_int(good.out, "entries") == 2);
    CHECK(good.out.find("\"bad\": []") != std::string::npos);
    fs::resize_file(sos[0], fs::file_size(sos[0]) / 2);
    CliResult bad = run_cli({"verify", "--json", "--cache-dir", dir});
    INFO(bad.out << bad.err);
    CHECK(bad.code == 1);
    CHECK(bad.out.find("\"path\": \"" + sos[0].string() + "\"") != std::string::npos);
    CHECK(bad.out.find("\"removed\": false") != std::string::npos);
    CliResult prune = run_cli({"prune", "--max-bytes", "1", "--json", "--cache-dir", dir});
    INFO(prune.out << prune.err);
    CHECK(prune.code == 0);
    CHECK(json_int(prune.out, "entries") == 0);
    CHECK(json_int(prune.out, "total_bytes") == 0);
    CHECK(json_int(prune.out, "removed_bytes") > 0);
    CHECK(prune.out.find("\"leftovers\": []") != std::string::npos);
    REQUIRE(run_cli({"warmup", "--preset", "sgd", "--cache-dir", dir}).code == 0);
    CliResult clear = run_cli({"clear", "--json", "--cache-dir", dir});
    INFO(clear.out << clear.err);
    CHECK(clear.code == 0);
    CHECK(json_int(clear.out, "removed_bytes") > 0);
    CHECK(entries(dir, ".so").empty());
  }

  TEST_CASE("check and presets report as JSON with --json, as every other command does") {
    TempDir d;
    const std::string good = (d.path() / "good.rule").string();
    const std::string bad = (d.path() / "bad.rule").string();
    write_file(good, fusedopt::Rule::preset("sgd").text());
    write_file(bad, "param p\ngrad g\nstate m = 0\nm = g > 0\np = p - m\n");
    CliResult both = run_cli({"check", good, bad, "--target", "host", "--json"});
    INFO(both.out << both.err);
    CHECK(both.code == 2);  // as the text form: a bad file
    CHECK(both.err.empty());
    CHECK(both.out.rfind("{\"files\": [{\"path\": \"" + good + "\", \"ok\": true", 0) == 0);
    CHECK(both.out.find("\"target\": \"host\", \"dtypes\": \"fp32:fp32:fp32\", "
                        "\"bytes_per_element\": 20") != std::string::npos);
    CHECK(both.out.find("\"path\": \"" + bad + "\", \"ok\": false, \"error\": {\"file\": \"" + bad +
                        "\", \"line\": 4, \"column\": 1") != std::string::npos);
    CHECK(both.out.find("\"hint\": \"assign 1 or 0: 'm = where(g > 0, 1, 0)'\"") !=
          std::string::npos);
    CliResult none = run_cli({"check", "--json"});
    CHECK(none.code == 2);
    CHECK(none.out == "{\"error\": \"check needs at least one rule file\"}\n");
    CliResult presets = run_cli({"presets", "--json"});
    INFO(presets.out << presets.err);
    CHECK(presets.code == 0);
    CHECK(presets.out.find("{\"name\": \"adamw\", \"description\": \"AdamW: ") !=
          std::string::npos);
    CHECK(presets.out.find("\"options\": [\"amsgrad\", \"exact\"], \"hypers\": {\"lr\": 0.001, "
                           "\"beta1\": 0.9") != std::string::npos);
    CHECK(presets.out.find("\"states\": [\"m\", \"v\"]") != std::string::npos);
  }

  TEST_CASE("verify passes, then names a truncated entry with exit 1, and warmup repairs it") {
    TempDir d;
    std::string dir = (d.path() / "cache").string();
    std::vector<std::string> warm = {"warmup",   "--preset", "adamw",       "--preset", "sgd",
                                     "--target", "host",     "--cache-dir", dir};
    REQUIRE(run_cli(warm).code == 0);
    CliResult ok = run_cli({"verify", "--cache-dir", dir});
    CHECK(ok.code == 0);
    auto sos = entries(dir, ".so");
    REQUIRE(sos.size() == 2);
    fs::resize_file(sos[0], fs::file_size(sos[0]) / 2);
    CliResult bad = run_cli({"verify", "--cache-dir", dir});
    CHECK(bad.code == 1);
    CHECK(bad.out.find(sos[0].string()) != std::string::npos);
    CHECK(bad.out.find(sos[1].string()) == std::string::npos);
    CliResult repair = run_cli({"warmup", "--preset", "adamw", "--preset", "sgd", "--target",
                                "host", "--cache-dir", dir, "--json"});
    REQUIRE(repair.code == 0);
    CHECK(json_int(repair.out, "compiled") == 1);
    CHECK(json_int(repair.out, "cached") == 1);
    CHECK(run_cli({"verify", "--cache-dir", dir}).code == 0);
  }

  TEST_CASE("verify names an open sub-folder and an entry others can write, with exit 1") {
    TempDir d;
    std::string dir = (d.path() / "cache").string();
    REQUIRE(run_cli({"warmup", "--preset", "adamw", "--preset", "sgd", "--target", "host",
                     "--cache-dir", dir})
                .code == 0);
    auto sos = entries(dir, ".so");
    REQUIRE(sos.size() == 2);
    REQUIRE(sos[0].parent_path() != sos[1].parent_path());
    fs::permissions(sos[0].parent_path(), fs::perms::all);  // 0777: anyone could plant here
    fs::permissions(sos[1], fs::perms::others_write, fs::perm_options::add);
    CliResult bad = run_cli({"verify", "--cache-dir", dir});
    CHECK(bad.code == 1);
    CHECK(bad.out.find("bad: " + sos[0].parent_path().string() + ": cache sub-folder " +
                       sos[0].parent_path().string() +
                       " is writable by group or others (mode 0777)") != std::string::npos);
    CHECK(bad.out.find("rm -rf " + sos[0].parent_path().string()) != std::string::npos);
    CHECK(bad.out.find("bad: " + sos[1].string() + ": writable by group or others (mode 0602)") !=
          std::string::npos);
    CHECK(bad.out.find("all good") == std::string::npos);
  }

  TEST_CASE("8 processes warming the same rule into an empty cache compile each kernel once") {
    TempDir d;
    std::string dir = (d.path() / "cache").string();
    std::vector<std::string> targets = {"host"};
    // The CUDA half runs where NVRTC is installed (the case above covers where it is not).
    if (nvrtc_availability().present) targets.push_back("sm_90");
    std::string target_list;
    for (auto& t : targets) target_list += (target_list.empty() ? "" : ",") + t;
    // All children block on a pipe and start together when the parent closes it.
    int gate[2];
    REQUIRE(pipe(gate) == 0);
    std::vector<pid_t> children;
    for (int c = 0; c < 8; ++c) {
      pid_t pid = fork();
      if (pid == 0) {
        close(gate[1]);
        char byte;
        while (read(gate[0], &byte, 1) > 0) {
        }
        std::string out = (d.path() / ("out" + std::to_string(c))).string();
        int fd = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
        dup2(fd, 1);
        std::string cli = FUSEDOPT_CACHE_CLI;
        execl(cli.c_str(), cli.c_str(), "warmup", "--preset", "adamw", "--target",
              target_list.c_str(), "--dtypes", "fp32,bf16:bf16:fp32+master", "--cache-dir",
              dir.c_str(), "--json", "--jobs", "1", static_cast<char*>(nullptr));
        _exit(127);
      }
      children.push_back(pid);
    }
    close(gate[0]);
    close(gate[1]);
    int compiled = 0;
    for (std::size_t c = 0; c < children.size(); ++c) {
      int status = 0;
      waitpid(children[c], &status, 0);
      CHECK(WIFEXITED(status));
      CHECK(WEXITSTATUS(status) == 0);
      std::string out = read_file(d.path() / ("out" + std::to_string(c)));
      compiled += json_int(out, "compiled");
      CHECK(json_int(out, "failed") == 0);
    }
    const int kernels = static_cast<int>(targets.size()) * 2;
    CHECK(compiled == kernels);
    CHECK(entries(dir, ".so").size() + entries(dir, ".cubin").size() ==
          static_cast<std::size_t>(kernels));
    CHECK(run_cli({"verify", "--cache-dir", dir}).code == 0);
  }

  TEST_CASE("check reports each malformed example as FILE:LINE:COL: error: with exit 2") {
    std::ifstream expected(std::string(FUSEDOPT_TEST_DATA) + "/bad/EXPECTED");
    REQUIRE(expected);
    int checked = 0;
    for (std::string line; std::getline(expected, line);) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream ss(line);
      std::string file, where;
      ss >> file >> where;
      std::string path = std::string(FUSEDOPT_TEST_DATA) + "/bad/" + file;
      CliResult r = run_cli({"check", path});
      INFO(file << ": " << r.err);
      CHECK(r.code == 2);
      CHECK(r.err.rfind(path + ":" + where + ": error: ", 0) == 0);
      CHECK(r.err.find("^") != std::string::npos);
      ++checked;
    }
    CHECK(checked >= 15);
  }

  TEST_CASE("check accepts a good rule and warmup builds a rule file") {
    TempDir d;
    fs::path rule = d.path() / "mine.rule";
    write_file(rule,
               "param p\ngrad g\nstate m = 0\nhyper lr = 0.1\nm = 0.9 * m + g\np = p - lr * m\n");
    CliResult r = run_cli({"check", rule.string()});
    CHECK(r.code == 0);
    CHECK(r.out.find("ok: rule 'mine'") != std::string::npos);
    CliResult w = run_cli({"warmup", rule.string(), "--cache-dir", (d.path() / "c").string()});
    CHECK(w.code == 0);
    CHECK(w.out.find("1 compiled") != std::string::npos);
  }

  TEST_CASE("a cache warmed by one path to a rule serves it opened by others, elsewhere") {
    // What a kernel is, not how the program named its file: warmed by an absolute path, the
    // same rule opened as "./x.rule" from its own folder, as "x.rule" and as "sub/x.rule"
    // from the folder above, by the CLI and by a program, compiles nothing.
    TempDir d;
    const fs::path sub = d.path() / "sub";
    fs::create_directories(sub);
    const std::string text =
        "param p\ngrad g\nstate m = 0\nhyper lr = 0.1\nm = 0.9 * m + g\np = p - lr * m\n";
    write_file(sub / "x.rule", text);
    const std::string cache = (d.path() / "cache").string();
    CliResult warm = run_cli({"warmup", (sub / "x.rule").string(), "--cache-dir", cache, "--json"});
    INFO(warm.out << warm.err);
    REQUIRE(warm.code == 0);
    CHECK(json_int(warm.out, "compiled") == 1);
    const fs::path before = fs::current_path();
    fs::current_path(sub);
    CliResult again = run_cli({"warmup", "./x.rule", "--cache-dir", cache, "--json"});
    fusedopt::CompileOptions options;
    options.cache_dir = cache;
    const std::string origin = fusedopt::compile_kernel(fusedopt::Rule::parse(text, "./x.rule"),
                                                        fusedopt::Target::host(), {}, options)
                                   .origin;
    fs::current_path(d.path());
    const std::string above = fusedopt::compile_kernel(fusedopt::Rule::parse(text, "sub/x.rule"),
                                                       fusedopt::Target::host(), {}, options)
                                  .origin;
    fs::current_path(before);
    INFO(again.out << again.err);
    CHECK(again.code == 0);
    CHECK(json_int(again.out, "compiled") == 0);
    CHECK(json_int(again.out, "cached") == 1);
    CHECK(origin == "disk");
    CHECK(above != "compiled");
    CHECK(entries(cache, ".so").size() == 1);
  }

  TEST_CASE("warmup fails when the cache cannot keep a kernel it compiled") {
    TempDir d;
    std::string dir = (d.path() / "cache").string();
    REQUIRE(run_cli({"warmup", "--preset", "sgd", "--cache-dir", dir}).code == 0);
    auto so = entries(dir, ".so");
    REQUIRE(so.size() == 1);
    const fs::path shard = so[0].parent_path();
    REQUIRE(run_cli({"clear", "--cache-dir", dir}).code == 0);
    fs::remove_all(shard);
    write_file(shard, "not a folder");  // the entry's shard folder cannot be created
    CliResult r = run_cli({"warmup", "--preset", "sgd", "--cache-dir", dir});
    CHECK(r.code == 1);
    CHECK(r.err.find("compiled but not stored in the cache") != std::string::npos);
  }

  TEST_CASE("every command answers --help") {
    for (const char* cmd : {"warmup", "list", "verify", "prune", "clear", "check", "presets"}) {
      INFO(cmd);
      CliResult r = run_cli({cmd, "--help"});
      CHECK(r.code == 0);
      CHECK(r.out.rfind("usage: fusedopt-cache ", 0) == 0);
    }
    CHECK(run_cli({"--help"}).code == 0);
  }

  TEST_CASE("bad command lines exit 2 with a message") {
    TempDir d;
    std::string dir = (d.path() / "c").string();
    std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
        {{"frobnicate"}, "unknown command 'frobnicate'"},
        {{"warmup", "--cache-dir", dir}, "nothing to warm"},
        {{"warmup", "--preset", "adamm", "--cache-dir", dir}, "unknown preset 'adamm'"},
        {{"warmup", "--preset", "adamw", "--target", "sm_9", "--cache-dir", dir}, "bad target"},
        {{"warmup", "--preset", "adamw", "--dtypes", "fp8", "--cache-dir", dir}, "bad dtype"},
        {{"warmup", "--preset", "adamw", "--target", "", "--cache-dir", dir},
         "--target needs a value"},
        {{"warmup", "--preset", "adamw", "--dtypes", ",", "--cache-dir", dir},
         "--dtypes needs a value"},
        {{"warmup", "--preset", "adamw", "--target", "sm_99999999999", "--cache-dir", dir},
         "bad target 'sm_99999999999'"},
        {{"warmup", "--preset", "adamw", "--jobs", "zero", "--cache-dir", dir}, "--jobs"},
        {{"warmup", "--bogus"}, "unknown option '--bogus'"},
        {{"prune", "--cache-dir", dir}, "--max-bytes"},
        {{"prune", "--max-bytes", "12Q", "--cache-dir", dir}, "unknown unit"},
        {{"check"}, "at least one rule file"},
        {{"check", "/nonexistent/x.rule"}, "cannot read"},
        {{"list", "extra"}, "unexpected argument 'extra'"},
    };
    for (const auto& [args, message] : cases) {
      CliResult r = run_cli(args);
      INFO(args[0] << " -> " << r.err);
      CHECK(r.code == 2);
      CHECK(r.err.find(message) != std::string::npos);
    }
  }

  TEST_CASE("prune --max-bytes takes the sizes FUSEDOPT_CACHE_MAX_BYTES takes") {
    TempDir d;
    std::string dir = (d.path() / "c").string();
    fs::create_directory(dir);  // prune never creates it
    fs::permissions(dir, fs::perms::owner_all);
    for (const char* size : {"1048576", "512m", "512M", "512MB", "2GiB", "64k"}) {
      CliResult r = run_cli({"prune", "--max-bytes", size, "--cache-dir", dir});
      INFO(size << " -> " << r.err);
      CHECK(r.code == 0);
    }
    CliResult r = run_cli({"prune", "--max-bytes", "99999999999999999999", "--cache-dir", dir});
    CHECK(r.code == 2);
    CHECK(r.err.find("--max-bytes '99999999999999999999' is too large") != std::string::npos);
  }

  TEST_CASE("a cache folder other users can write to is refused") {
    TempDir d;
    fs::path dir = d.path() / "shared";
    fs::create_directory(dir);
    chmod(dir.c_str(), 0777);
    CliResult r = run_cli({"list", "--cache-dir", dir.string()});
    CHECK(r.code == 2);
    CHECK(r.err.find("writable by") != std::string::npos);
    CliResult env = run_cli({"list"}, {"FUSEDOPT_CACHE_DIR=" + dir.string()});
    CHECK(env.code == 2);
  }

  TEST_CASE("list shows entries as a table and as JSON; prune and clear empty the cache") {
    TempDir d;
    std::string dir = (d.path() / "cache").string();
    REQUIRE(run_cli({"warmup", "--preset", "sgd,lion", "--cache-dir", dir}).code == 0);
    CliResult table = run_cli({"list", "--cache-dir", dir});
    CHECK(table.code == 0);
    CHECK(table.out.find("sgd") != std::string::npos);
    CHECK(table.out.find("lion") != std::string::npos);
    CHECK(table.out.find("2 entries") != std::string::npos);
    CliResult json = run_cli({"list", "--json", "--cache-dir", dir});
    CHECK(json_int(json.out, "count") == 2);
    CHECK(json.out.find("\"target\": \"host\"") != std::string::npos);
    CliResult prune = run_cli({"prune", "--max-bytes", "1", "--cache-dir", dir});
    CHECK(prune.code == 0);
    CHECK(entries(dir, ".so").empty());
    REQUIRE(run_cli({"warmup", "--preset", "sgd", "--cache-dir", dir}).code == 0);
    CHECK(run_cli({"clear", "--cache-dir", dir}).code == 0);
    CHECK(entries(dir, ".so").empty());
  }

  TEST_CASE("list shows a long rule name and a quantized binding whole, its columns aligned") {
    TempDir d;
    const std::string dir = (d.path() / "cache").string();
    const std::string rule = (d.path() / "heavy_ball_with_a_rather_long_name.rule").string();
    std::ofstream(rule) << "param p\ngrad g\nstate m = 0\nhyper lr = 0.1\nm = 0.9 * m + g\n"
                           "p = p - lr * m\n";
    REQUIRE(run_cli({"warmup", rule, "--preset", "sgd", "--dtypes", "fp32,fp32+q=q8s@256",
                     "--cache-dir", dir})
                .code == 0);
    CliResult table = run_cli({"list", "--cache-dir", dir});
    REQUIRE(table.code == 0);
    CHECK(table.out.find("heavy_ball_with_a_rather_long_name ") != std::string::npos);
    CHECK(table.out.find("fp32:fp32:fp32+q=q8s@256 ") != std::string::npos);
    // Every line of the table (header, entries) has its SIZE column's right edge, then two
    // spaces and the date, at one offset: the header's "SIZE  LAST USED".
    std::istringstream lines(table.out);
    std::string line, header;
    std::getline(lines, header);
    const std::size_t edge = header.find("SIZE") + 4;
    int rows = 0;
    while (std::getline(lines, line) && line.find(" entries, ") == std::string::npos) {
      CHECK(line.substr(edge, 2) == "  ");
      CHECK(line[edge - 1] == 'B');  // "116.4 KiB"
      ++rows;
    }
    CHECK(rows == 4);
  }

  TEST_CASE("a folder is not a rule file, and --json prints JSON even when the input is bad") {
    TempDir d;
    const std::string dir = (d.path() / "c").string();
    CliResult check = run_cli({"check", d.path().string()});
    CHECK(check.code == 2);
    CHECK(check.err.find("is a folder, not a rule file") != std::string::npos);
    CliResult warm = run_cli({"warmup", d.path().string(), "--cache-dir", dir});
    CHECK(warm.code == 2);
    CHECK(warm.err.find("is a folder, not a rule file") != std::string::npos);
    CliResult json = run_cli({"warmup", "--preset", "adamm", "--json", "--cache-dir", dir});
    CHECK(json.code == 2);
    CHECK(json.out.rfind("{\"error\": \"unknown preset 'adamm'", 0) == 0);
    CHECK(json.out.find("}") != std::string::npos);
  }

  TEST_CASE("a host compile that runs past FUSEDOPT_COMPILE_TIMEOUT is stopped and fails") {
    TempDir d;
    // A "compiler" that answers --version at once and then never finishes a compile.
    const fs::path cxx = d.path() / "slow-cxx";
    {
      std::ofstream f(cxx);
      f << "#!/bin/sh\nif [ \"$1\" = --version ]; then echo slow 1.0; exit 0; fi\nsleep 60\n";
    }
    fs::permissions(cxx, fs::perms::owner_all);
    const auto start = std::chrono::steady_clock::now();
    CliResult r = run_cli({"warmup", "--preset", "sgd", "--cache-dir", (d.path() / "c").string()},
                          {"FUSEDOPT_HOST_CXX=" + cxx.string(), "FUSEDOPT_COMPILE_TIMEOUT=1"});
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(r.err.find("did not finish fusedopt_sgd.cpp within 1 s (FUSEDOPT_COMPILE_TIMEOUT)") !=
          std::string::npos);
    CHECK(seconds < 30);  // stopped at the limit, not after the compiler's 60 s
    CliResult bad = run_cli({"warmup", "--preset", "sgd", "--cache-dir", (d.path() / "c").string()},
                            {"FUSEDOPT_COMPILE_TIMEOUT=soon"});
    CHECK(bad.code == 2);  // bad input, as docs/environment.md says (review #12)
    CHECK(bad.err.find("FUSEDOPT_COMPILE_TIMEOUT=soon is not a number of seconds") !=
          std::string::npos);
  }
}

namespace {

/// Starts the CLI with `args` and `env` added, without waiting; its output goes to files in
/// `io`.
pid_t start_cli(const std::vector<std::string>& args, const std::vector<std::string>& env,
                const fs::path& io) {
  const std::string out = (io / "out").string(), err = (io / "err").string();
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    dup2(o, 1);
    dup2(e, 2);
    for (const std::string& kv : env) putenv(const_cast<char*>(kv.c_str()));
    std::vector<char*> argv;
    std::string cli = FUSEDOPT_CACHE_CLI;
    argv.push_back(cli.data());
    for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

/// A "compiler" that answers --version, and otherwise writes a temporary into $TMPDIR,
/// starts a child of its own, writes "<its pid> <the child's pid> <its TMPDIR>" to
/// $FAKE_CXX_PIDS and waits: a compile that never ends, with a process tree.
fs::path hanging_compiler(const fs::path& dir) {
  const fs::path cxx = dir / "hanging-cxx";
  std::ofstream f(cxx);
  f << "#!/bin/sh\n"
       "if [ \"$1\" = --version ]; then echo hanging 1.0; exit 0; fi\n"
       "echo 'a temporary, as cc1plus writes' > \"${TMPDIR:-/tmp}/cc-fake.s\"\n"
       "sleep 300 &\n"
       "echo \"$$ $! $TMPDIR\" > \"$FAKE_CXX_PIDS.part\" && mv \"$FAKE_CXX_PIDS.part\" "
       "\"$FAKE_CXX_PIDS\"\n"
       "wait\n";
  f.close();
  fs::permissions(cxx, fs::perms::owner_all);
  return cxx;
}

/// Whether every process in `pids` is gone within `seconds` (a zombie counts as gone).
bool all_gone(const std::vector<pid_t>& pids, double seconds) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (true) {
    bool gone = true;
    for (pid_t p : pids) gone = gone && !fusedopt::support::process_alive(p);
    if (gone) return true;
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::vector<fs::path> build_dirs_in(const fs::path& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (e.path().filename().string().rfind("fusedopt-build-", 0) == 0) out.push_back(e.path());
  }
  return out;
}

}  // namespace

TEST_SUITE("cli") {
  TEST_CASE(
      "warmup killed with SIGKILL mid-compile takes its compiler down with it; the build "
      "folder it leaves is shown by verify and removed by prune") {
    TempDir d;
    const fs::path tmpdir = d.path() / "tmp", io = d.path() / "io";
    fs::create_directories(tmpdir);
    fs::create_directories(io);
    const fs::path pids_file = d.path() / "pids";
    const std::string cache = (d.path() / "c").string();
    const std::vector<std::string> env = {
        "FUSEDOPT_HOST_CXX=" + hanging_compiler(d.path()).string(),
        "FAKE_CXX_PIDS=" + pids_file.string(), "TMPDIR=" + tmpdir.string()};
    const pid_t cli = start_cli({"warmup", "--preset", "sgd", "--cache-dir", cache}, env, io);
    REQUIRE(cli > 0);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (!fs::exists(pids_file) && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    REQUIRE(fs::exists(pids_file));
    pid_t compiler = 0, child = 0;
    std::string compiler_tmpdir;
    {
      std::ifstream in(pids_file);
      in >> compiler >> child >> compiler_tmpdir;
    }
    REQUIRE(compiler > 0);
    REQUIRE(child > 0);
    const std::vector<fs::path> left = build_dirs_in(tmpdir);
    REQUIRE(left.size() == 1);
    // The compiler's own temporaries go into the build folder.
    CHECK(fs::path(compiler_tmpdir) == left[0]);
    CHECK(left[0].filename().string().rfind("fusedopt-build-" + std::to_string(cli) + "-", 0) == 0);

    ::kill(cli, SIGKILL);
    int status = 0;
    ::waitpid(cli, &status, 0);
    CHECK(all_gone({compiler, child}, 10));
    if (!all_gone({compiler, child}, 0)) {
      ::kill(compiler, SIGKILL);
      ::kill(child, SIGKILL);
    }
    REQUIRE(build_dirs_in(tmpdir).size() == 1);  // SIGKILL: nothing of ours ran after it

    const std::vector<std::string> same_tmp = {"TMPDIR=" + tmpdir.string()};
    CliResult v = run_cli({"verify", "--cache-dir", cache}, same_tmp);
    INFO(v.out, v.err);
    CHECK(v.code == 1);
    CHECK(v.out.find(left[0].string()) != std::string::npos);
    CHECK(v.out.find("stale compiler build folder of process " + std::to_string(cli) +
                     ", which is gone") != std::string::npos);
    CHECK(build_dirs_in(tmpdir).size() == 1);  // shown, not removed
    CliResult p = run_cli({"prune", "--max-bytes", "1G", "--cache-dir", cache}, same_tmp);
    CHECK(p.code == 0);
    CHECK(build_dirs_in(tmpdir).empty());
    CHECK(run_cli({"verify", "--cache-dir", cache}, same_tmp).code == 0);
  }

  TEST_CASE("a compile stopped at FUSEDOPT_COMPILE_TIMEOUT leaves no process and no file") {
    TempDir d;
    const fs::path tmpdir = d.path() / "tmp";
    fs::create_directories(tmpdir);
    const fs::path pids_file = d.path() / "pids";
    CliResult r = run_cli({"warmup", "--preset", "sgd", "--cache-dir", (d.path() / "c").string()},
                          {"FUSEDOPT_HOST_CXX=" + hanging_compiler(d.path()).string(),
                           "FAKE_CXX_PIDS=" + pids_file.string(), "TMPDIR=" + tmpdir.string(),
                           "FUSEDOPT_COMPILE_TIMEOUT=2"});
    INFO(r.err);
    CHECK(r.code == 1);
    CHECK(r.err.find("(FUSEDOPT_COMPILE_TIMEOUT); it was stopped") != std::string::npos);
    REQUIRE(fs::exists(pids_file));
    pid_t compiler = 0, child = 0;
    {
      std::ifstream in(pids_file);
      in >> compiler >> child;
    }
    CHECK(all_gone({compiler, child}, 10));
    CHECK(fs::is_empty(tmpdir));  // no build folder, no compiler temporary
  }
}

}  // namespace fusedopt::testing
