// fusedopt-cache check and presets: what rules are and what their kernels cost, as text or
// (--json) as one JSON document on stdout.
#include <fmt/format.h>

#include <string>
#include <vector>

#include "cli.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/kernel.hpp"

namespace fusedopt::cli {
namespace {

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& n : names) out += (out.empty() ? "" : " ") + n;
  return out.empty() ? "-" : out;
}

std::string json_names(const std::vector<std::string>& names) {
  std::string out = "[";
  for (std::size_t i = 0; i < names.size(); ++i) out += (i ? ", " : "") + json_string(names[i]);
  return out + "]";
}

/// What `rule` compiles to for each target and binding: per pass, the tensors read and
/// written and the bytes per element; per CUDA entry point, registers and spills. As text,
/// or as a JSON list of {target, dtypes, bytes_per_element, strategy, passes, functions}.
std::string reports(const Rule& rule, const std::vector<Target>& targets,
                    const std::vector<DTypeBinding>& dtypes, bool json) {
  std::string out;
  for (const Target& t : targets) {
    for (const DTypeBinding& d : dtypes) {
      const KernelReport r = report_kernel(rule, t, d);
      if (json) {
        std::string passes, functions;
        for (const KernelPass& p : r.passes) {
          passes += fmt::format(
              "{}{{\"update\": {}, \"reads\": {}, \"writes\": {}, \"bytes_per_element\": {}}}",
              passes.empty() ? "" : ", ", p.update ? "true" : "false", json_names(p.reads),
              json_names(p.writes), p.bytes_per_element);
        }
        for (const KernelFunction& f : r.functions) {
          functions += fmt::format(
              "{}{{\"name\": {}, \"registers\": {}, \"stack_bytes\": {}, "
              "\"spill_store_bytes\": {}, \"spill_load_bytes\": {}}}",
              functions.empty() ? "" : ", ", json_string(f.name), f.registers, f.stack_bytes,
              f.spill_store_bytes, f.spill_load_bytes);
        }
        out += fmt::format(
            "{}{{\"target\": {}, \"dtypes\": {}, \"bytes_per_element\": {}, \"strategy\": {}, "
            "\"passes\": [{}], \"functions\": [{}]}}",
            out.empty() ? "" : ", ", json_string(t.str()), json_string(d.str()),
            r.bytes_per_element, json_string(to_string(r.strategy)), passes, functions);
        continue;
      }
      out +=
          fmt::format("  {} {}: {} B/element per step{}\n", t.str(), d.str(), r.bytes_per_element,
                      r.passes.size() > 1 ? fmt::format(" ({})", to_string(r.strategy)) : "");
      for (std::size_t k = 0; k < r.passes.size(); ++k) {
        const KernelPass& p = r.passes[k];
        out += fmt::format("    pass {} ({}): reads {}; writes {}; {} B/element\n", k,
                           p.update ? "update" : "reduction", join_names(p.reads),
                           join_names(p.writes), p.bytes_per_element);
      }
      for (const KernelFunction& f : r.functions) {
        out += fmt::format(
            "    {}: {} registers, {} B stack, {} B spill stores, {} B spill loads\n", f.name,
            f.registers, f.stack_bytes, f.spill_store_bytes, f.spill_load_bytes);
      }
    }
  }
  return json ? "[" + out + "]" : out;
}

std::string rule_error_json(const RuleError& e) {
  return fmt::format(
      "{{\"file\": {}, \"line\": {}, \"column\": {}, \"message\": {}, \"source_line\": {}, "
      "\"hint\": {}}}",
      json_string(e.file()), e.line(), e.column(), json_string(e.message()),
      json_string(e.source_line()), json_string(e.hint()));
}

/// Checks rule file `f`: as text on stdout (errors on stderr), or as one JSON object appended
/// to `listed`. False when the file is bad (unreadable or not a valid rule).
bool check_file(const std::string& f, const std::vector<Target>& targets,
                const std::vector<DTypeBinding>& dtypes, bool json, std::string& listed) {
  const std::string path = json_string(f);
  const char* sep = listed.empty() ? "" : ", ";
  std::string text;
  try {
    text = read_rule_file(f);
  } catch (const UsageError& e) {
    if (json) {
      listed += fmt::format("{}{{\"path\": {}, \"ok\": false, \"error\": {{\"message\": {}}}}}",
                            sep, path, json_string(e.message));
    } else {
      fmt::print(stderr, "{}: error: {}\n", f, e.message);
    }
    return false;
  }
  try {
    const Rule rule = Rule::parse(text, f);
    if (json) {
      listed +=
          fmt::format("{}{{\"path\": {}, \"ok\": true, \"rule\": {}, \"reports\": {}}}", sep, path,
                      json_string(rule.describe()), reports(rule, targets, dtypes, true));
    } else {
      fmt::print("{}: ok: {}\n", f, rule.describe());
      fmt::print("{}", reports(rule, targets, dtypes, false));
    }
    return true;
  } catch (const RuleError& e) {
    if (json) {
      listed += fmt::format("{}{{\"path\": {}, \"ok\": false, \"error\": {}}}", sep, path,
                            rule_error_json(e));
    } else {
      fmt::print(stderr, "{}\n", e.what());
    }
    return false;
  }
}

}  // namespace

int cmd_check(Args& args) {
  std::vector<std::string> files;
  std::vector<std::string> target_names, dtype_names;
  bool help = false, json = false;
  parse_common(args, R"(usage: fusedopt-cache check RULE_FILE... [--target T] [--dtypes D] [--json]

Parse and check rule files. Errors are printed as FILE:LINE:COL: error: MESSAGE,
then the line and a caret; exit 2 if any file is bad.

With --target (host, emu, sm_80, sm_90, ...; comma-separated) and optionally --dtypes
(default fp32), also tells what each kernel does and costs, without a GPU: per
pass, the tensors it reads and writes and the bytes per element; for CUDA
targets, each entry point's registers, stack and spills (from NVRTC's ptxas).

  --json   print one JSON document: {"files": [{"path", "ok", "rule" (name,
           hypers, states, statements: describe()), "reports": [...]} or
           {"path", "ok": false, "error": {"file", "line", "column", "message",
           "source_line", "hint"}}]}; the exit code is the text form's.
)",
               &help, [&](Args& a) {
                 if (a.flag("--json")) return (json = true);
                 if (auto v = a.option("--target")) {
                   for (auto& x : list_value("--target", *v)) target_names.push_back(x);
                   return true;
                 }
                 if (auto v = a.option("--dtypes")) {
                   for (auto& x : list_value("--dtypes", *v)) dtype_names.push_back(x);
                   return true;
                 }
                 if (a.peek().rfind("-", 0) == 0 && a.peek() != "-") return false;
                 files.push_back(a.next());
                 return true;
               });
  if (help) return kExitOk;
  return json_errors(json, [&] {
    if (files.empty()) throw UsageError{"check needs at least one rule file"};
    if (!dtype_names.empty() && target_names.empty()) {
      throw UsageError{"--dtypes needs --target (what to report on)"};
    }
    if (dtype_names.empty()) dtype_names.push_back("fp32");
    std::vector<Target> targets;
    std::vector<DTypeBinding> dtypes;
    try {
      for (const std::string& t : target_names) targets.push_back(Target::parse(t));
      for (const std::string& d : dtype_names) dtypes.push_back(DTypeBinding::parse(d));
    } catch (const Error& e) {
      throw UsageError{e.what()};
    }
    int status = kExitOk;
    std::string listed;
    for (const std::string& f : files) {
      if (!check_file(f, targets, dtypes, json, listed)) status = kExitBadInput;
    }
    if (json) fmt::print("{{\"files\": [{}]}}\n", listed);
    return status;
  });
}

int cmd_presets(Args& args) {
  bool help = false, json = false;
  parse_common(args,
               "usage: fusedopt-cache presets [--json]\n\nList the preset rules. A preset with "
               "options lists them; the preset with option X is named PRESET+X.\n\n"
               "  --json   print [{\"name\", \"description\", \"options\", \"hypers\": {NAME: "
               "default}, \"states\"}]\n",
               &help, [&](Args& a) {
                 if (a.flag("--json")) return (json = true);
                 return false;
               });
  if (help) return kExitOk;
  return json_errors(json, [&] {
    std::string listed;
    for (const std::string& name : Rule::presets()) {
      const Rule rule = Rule::preset(name);
      const std::string text = rule.text();
      std::string first = text.substr(0, text.find('\n'));
      if (first.rfind("#", 0) == 0) first = first.substr(first.find_first_not_of("# "));
      const std::vector<std::string> options = Rule::preset_options(name);
      if (json) {
        std::string hypers;
        for (const auto& [h, value] : rule.hypers()) {
          hypers += fmt::format("{}{}: {}", hypers.empty() ? "" : ", ", json_string(h), value);
        }
        listed += fmt::format(
            "{}{{\"name\": {}, \"description\": {}, \"options\": {}, \"hypers\": {{{}}}, "
            "\"states\": {}}}",
            listed.empty() ? "" : ", ", json_string(name), json_string(first), json_names(options),
            hypers, json_names(rule.states()));
        continue;
      }
      std::string shown;
      for (const std::string& o : options) shown += (shown.empty() ? " [options: " : ", ") + o;
      if (!shown.empty()) shown += "]";
      fmt::print("{:<14} {}{}\n", name, first, shown);
    }
    if (json) fmt::print("[{}]\n", listed);
    return kExitOk;
  });
}

}  // namespace fusedopt::cli
