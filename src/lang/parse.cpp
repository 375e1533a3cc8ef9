// parse_rule: the size limit, then the lexer/parser, then the checker.
#include "lang/parse.hpp"

#include <fmt/format.h>

#include "fusedopt/error.hpp"
#include "lang/checker.hpp"
#include "lang/parser.hpp"
#include "lang/source.hpp"

namespace fusedopt::lang {
namespace {

// "dir/adamw.rule" -> "adamw"; both separators, since rules may name Windows paths.
std::string stem(const std::string& file) {
  std::size_t slash = file.find_last_of("/\\");
  std::string base = slash == std::string::npos ? file : file.substr(slash + 1);
  std::size_t dot = base.rfind('.');
  if (dot != std::string::npos && dot > 0) base.resize(dot);
  return base;
}

}  // namespace

std::shared_ptr<const Rule> parse_rule(std::string_view text, const std::string& file) {
  if (text.size() > kMaxRuleBytes) {
    throw RuleError(file, 1, 1,
                    fmt::format("the rule is {} bytes, more than the limit of {} bytes",
                                text.size(), kMaxRuleBytes),
                    "", 1, "a rule is a short per-element update; is this the right file?");
  }
  auto rule = std::make_shared<Rule>();
  rule->name = stem(file);
  rule->file = file;
  rule->text = std::string(text);
  // The Source views the rule's own copy of the text, which lives as long as the parse.
  const Source source(rule->text, file);
  ParsedRule parsed = parse_syntax(source);
  check_rule(source, parsed, *rule);
  return rule;
}

}  // namespace fusedopt::lang
