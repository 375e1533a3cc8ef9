// fusedopt-cache list, verify, prune, clear, check and presets.
#include <fmt/format.h>

#include <algorithm>
#include <ctime>
#include <fstream>
#include <sstream>

#include "cache/image_check.hpp"
#include "cli.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/kernel.hpp"

namespace fusedopt::cli {
namespace {

/// Names on stderr each file `command` could not remove; returns how many.
/// `removal`'s leftovers as a JSON array of {"path", "reason"}.
std::string leftovers_json(const cache::Removal& removal) {
  std::string out = "[";
  for (std::size_t i = 0; i < removal.leftovers.size(); ++i) {
    const cache::Leftover& l = removal.leftovers[i];
    out += fmt::format("{}{{\"path\": {}, \"reason\": {}}}", i ? ", " : "",
                       json_string(l.path.string()), json_string(l.reason));
  }
  return out + "]";
}

std::size_t report_leftovers(const char* command, const cache::Removal& removal) {
  for (const cache::Leftover& l : removal.leftovers) {
    fmt::print(stderr, "{}: could not remove {}: {}\n", command, l.path.string(), l.reason);
  }
  return removal.leftovers.size();
}

std::string format_time(std::int64_t t) {
  std::time_t tt = static_cast<std::time_t>(t);
  std::tm tm{};
  localtime_r(&tt, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M", &tm);
  return buf;
}

std::string one_line(std::string s) {
  for (char& c : s) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  return s;
}

}  // namespace

namespace {
int verify_store(const std::optional<std::string>& dir, bool remove, bool json);
int prune_store(const std::optional<std::string>& dir, std::uint64_t max_bytes, bool json);
}  // namespace

int cmd_list(Args& args) {
  bool json = false, help = false;
  auto dir = parse_common(args, R"(usage: fusedopt-cache list [--json] [--cache-dir DIR]

Show every entry: key, rule, target, dtypes, size and when it was last used.
)",
                          &help, [&](Args& a) {
                            // `json || a.flag(..)` would not consume a second --json: a loop.
                            if (a.flag("--json")) return (json = true);
                            return false;
                          });
  if (help) return kExitOk;
  return json_errors(json, [&] {
    cache::DiskStore store = open_store(dir);
    std::vector<cache::EntryInfo> entries = store.list();
    std::uint64_t total = 0;
    for (const auto& e : entries) total += e.file_bytes;
    if (json) {
      std::string out = "{\"cache_dir\": " + json_string(store.dir().string()) + ", \"entries\": [";
      for (std::size_t i = 0; i < entries.size(); ++i) {
        const auto& e = entries[i];
        out += fmt::format(
            "{}\n  {{\"key\": {}, \"ext\": {}, \"path\": {}, \"file_bytes\": {}, "
            "\"payload_bytes\": {}, \"last_used\": {}, \"kind\": {}, \"name\": {}, \"target\": {}, "
            "\"dtypes\": {}, \"compiler\": {}, \"fusedopt_version\": {}}}",
            i ? "," : "", json_string(e.key.hex()), json_string(e.ext),
            json_string(e.path.string()), e.file_bytes, e.payload_bytes, e.last_used,
            json_string(e.record.get("kind")), json_string(e.record.get("name")),
            json_string(e.record.get("target")), json_string(e.record.get("dtypes")),
            json_string(one_line(e.record.get("compiler"))),
            json_string(e.record.get("fusedopt_version")));
      }
      out += fmt::format("\n], \"count\": {}, \"total_bytes\": {}}}\n", entries.size(), total);
      fmt::print("{}", out);
      return kExitOk;
    }
    // Columns as wide as their longest value: a rule's name and a quantized binding
    // ("fp32:fp32:fp32+q=q8s/q8u@256") are shown whole.
    auto name_of = [](const cache::EntryInfo& e) {
      const std::string name = e.record.get("name");
      return name.empty() ? std::string("(unreadable)") : name;
    };
    std::size_t rule_w = 16, dtypes_w = 22;
    for (const auto& e : entries) {
      rule_w = std::max(rule_w, name_of(e).size());
      dtypes_w = std::max(dtypes_w, e.record.get("dtypes").size());
    }
    fmt::print("{:<14} {:<6} {:<{}} {:<8} {:<{}} {:>10}  {}\n", "KEY", "TYPE", "RULE", rule_w,
               "TARGET", "DTYPES", dtypes_w, "SIZE", "LAST USED");
    for (const auto& e : entries) {
      fmt::print("{:<14} {:<6} {:<{}} {:<8} {:<{}} {:>10}  {}\n", e.key.hex().substr(0, 12), e.ext,
                 name_of(e), rule_w, e.record.get("target"), e.record.get("dtypes"), dtypes_w,
                 human_bytes(e.file_bytes), format_time(e.last_used));
    }
    fmt::print("{} entries, {} in {}\n", entries.size(), human_bytes(total), store.dir().string());
    return kExitOk;
  });
}

int cmd_verify(Args& args) {
  bool remove = false, json = false, help = false;
  auto dir =
      parse_common(args, R"(usage: fusedopt-cache verify [--remove] [--json] [--cache-dir DIR]

Re-read and re-hash every entry. Prints each bad one and exits 1 if there is any.
  --remove   also delete the bad entries (the next warmup recompiles them)
  --json     print the result as JSON: {"cache_dir", "entries", "bad": [{"path",
             "reason", "removed"}]}
)",
                   &help, [&](Args& a) {
                     if (a.flag("--json")) return (json = true);
                     if (a.flag("--remove")) return (remove = true);
                     return false;
                   });
  if (help) return kExitOk;
  return json_errors(json, [&] { return verify_store(dir, remove, json); });
}

namespace {

int verify_store(const std::optional<std::string>& dir, bool remove, bool json) {
  cache::DiskStore store = open_store(dir);
  // Every entry must also be a binary its device can load (cache/image_check.hpp).
  std::vector<cache::BadEntry> bad = store.verify(remove, cache::image_problem);
  std::size_t total = store.list().size();
  if (json) {
    std::string list;
    for (std::size_t i = 0; i < bad.size(); ++i) {
      list += fmt::format("{}{{\"path\": {}, \"reason\": {}, \"removed\": {}}}", i ? ", " : "",
                          json_string(bad[i].path.string()), json_string(bad[i].reason),
                          bad[i].removed ? "true" : "false");
    }
    fmt::print("{{\"cache_dir\": {}, \"entries\": {}, \"bad\": [{}]}}\n",
               json_string(store.dir().string()), total, list);
    return bad.empty() ? kExitOk : kExitFailed;
  }
  for (const auto& b : bad) {
    fmt::print("bad: {}: {}{}\n", b.path.string(), b.reason, b.removed ? " (removed)" : "");
  }
  if (bad.empty()) {
    fmt::print("verify: {} entries, all good ({})\n", total, store.dir().string());
    return kExitOk;
  }
  fmt::print("verify: {} bad {} in {}\n", bad.size(), bad.size() == 1 ? "entry" : "entries",
             store.dir().string());
  return kExitFailed;
}

}  // namespace

int cmd_prune(Args& args) {
  std::optional<std::uint64_t> max_bytes;
  bool help = false, json = false;
  auto dir =
      parse_common(args, R"(usage: fusedopt-cache prune --max-bytes N [--json] [--cache-dir DIR]

Evict least recently used entries until the cache holds at most N bytes
(N may end in K, M or G). Exits 1, naming each one, when entries cannot be
removed (a read-only folder) and the cache stays over N.
  --json     print the result as JSON: {"cache_dir", "removed_bytes", "total_bytes",
             "entries", "leftovers": [{"path", "reason"}]}
)",
                   &help, [&](Args& a) {
                     if (a.flag("--json")) return (json = true);
                     if (auto v = a.option("--max-bytes")) {
                       max_bytes = parse_bytes(*v, "--max-bytes");
                       return true;
                     }
                     return false;
                   });
  if (help) return kExitOk;
  if (!max_bytes) throw UsageError{"prune needs --max-bytes N"};
  return json_errors(json, [&] { return prune_store(dir, *max_bytes, json); });
}

namespace {

int prune_store(const std::optional<std::string>& dir, std::uint64_t max_bytes, bool json) {
  cache::DiskStore store = open_store(dir);
  const cache::Removal removal = store.prune(max_bytes);
  const std::uint64_t total = store.total_bytes();
  if (json) {
    fmt::print(
        "{{\"cache_dir\": {}, \"removed_bytes\": {}, \"total_bytes\": {}, \"entries\": {}, "
        "\"leftovers\": {}}}\n",
        json_string(store.dir().string()), removal.removed_bytes, total, store.list().size(),
        leftovers_json(removal));
    return total <= max_bytes ? kExitOk : kExitFailed;
  }
  fmt::print("prune: removed {}; the cache now holds {} ({} entries)\n",
             human_bytes(removal.removed_bytes), human_bytes(total), store.list().size());
  // Leftovers are named either way; only a cache still over the bound fails (as --help and
  // the JSON form say): a stale temp that stays behind in a cache under N is no failure.
  report_leftovers("prune", removal);
  if (total <= max_bytes) return kExitOk;
  fmt::print(stderr, "prune: the cache holds {}, more than the {} asked for\n", human_bytes(total),
             human_bytes(max_bytes));
  return kExitFailed;
}

}  // namespace

int cmd_clear(Args& args) {
  bool help = false, json = false;
  auto dir = parse_common(args, R"(usage: fusedopt-cache clear [--json] [--cache-dir DIR]

Remove every entry (and leftover temporary and lock files). Exits 1, naming each
one, when an entry cannot be removed (a read-only folder) or a sub-folder is not
trusted (not entered). Files that are not the cache's are left alone.
  --json     print the result as JSON: {"cache_dir", "removed_bytes",
             "leftovers": [{"path", "reason"}]}
)",
                          &help, [&](Args& a) {
                            // `json || a.flag(..)` would not consume a second --json: a loop.
                            if (a.flag("--json")) return (json = true);
                            return false;
                          });
  if (help) return kExitOk;
  return json_errors(json, [&] {
    cache::DiskStore store = open_store(dir);
    const cache::Removal removal = store.clear();
    if (json) {
      fmt::print("{{\"cache_dir\": {}, \"removed_bytes\": {}, \"leftovers\": {}}}\n",
                 json_string(store.dir().string()), removal.removed_bytes, leftovers_json(removal));
      return removal.leftovers.empty() ? kExitOk : kExitFailed;
    }
    fmt::print("clear: removed {} from {}\n", human_bytes(removal.removed_bytes),
               store.dir().string());
    return report_leftovers("clear", removal) == 0 ? kExitOk : kExitFailed;
  });
}

}  // namespace fusedopt::cli
