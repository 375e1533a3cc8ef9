// Every pass of every preset moves exactly the roles the planner counts: the fo_load and
// fo_store calls in each generated pass function are the pass's read and write sets, the
// CUDA vector path stages exactly those (FO_UPDATE_STAGE/STORES), and the bytes per element
// that stats() reports are the sum of the role sets over the passes.
#include <doctest/doctest.h>

#include <regex>
#include <set>
#include <string>
#include <vector>

#include "codegen/codegen.hpp"
#include "presets.hpp"

namespace fusedopt::testing {

using namespace fusedopt;
using fusedopt::codegen::Strategy;

namespace {

std::string function_text(const std::string& code, const std::string& signature) {
  const std::size_t a = code.find(signature);
  REQUIRE_MESSAGE(a != std::string::npos, signature);
  return code.substr(a, code.find("\n}\n", a) - a);
}

/// Role numbers captured by `re` (one group) in `text`.
std::set<int> captured(const std::string& text, const std::regex& re) {
  std::set<int> out;
  for (std::sregex_iterator it(text.begin(), text.end(), re), end; it != end; ++it) {
    out.insert(std::stoi((*it)[1]));
  }
  return out;
}

std::set<int> as_set(const std::vector<int>& v) { return {v.begin(), v.end()}; }

std::string define_line(const std::string& code, const std::string& name) {
  const std::size_t a = code.find("#define " + name + "(");
  REQUIRE_MESSAGE(a != std::string::npos, name);
  return code.substr(a, code.find('\n', a) - a);
}

}  // namespace

TEST_SUITE("codegen") {
  TEST_CASE("each pass loads and stores exactly its role sets, and the bits are their sum") {
    const std::regex load(R"(fo_load\(t\.r(\d+),)"), store(R"(fo_store\(t\.r(\d+),)");
    const std::regex staged_load(R"(LOAD\((\d+)\))"), staged_decl(R"(DECL\((\d+)\))"),
        staged_store(R"(STORE\((\d+)\))");
    int checked = 0;
    for (const std::string& name : preset_names()) {
      const auto rule = preset_rule(name);
      for (const char* binding : {"fp32", "bf16:bf16:fp32+master", "fp16:fp16:bf16"}) {
        const std::vector<Strategy> strategies =
            rule->reduction_passes > 0 ? std::vector<Strategy>{Strategy::Recompute, Strategy::Store}
                                       : std::vector<Strategy>{Strategy::Auto};
        for (Strategy strategy : strategies) {
          CAPTURE(name);
          CAPTURE(binding);
          const std::string strategy_name = codegen::to_string(strategy);
          CAPTURE(strategy_name);
          const codegen::KernelBody body =
              codegen::generate_body(*rule, DTypeBinding::parse(binding), strategy);
          const int passes = body.reduction_passes + 1;
          REQUIRE(static_cast<int>(body.pass_reads.size()) == passes);
          std::int64_t bits = 0;
          for (int k = 0; k < passes; ++k) {
            CAPTURE(k);
            // Factored rules (row/col state) name them fo_element_rc, fo_reduce_element_rc.
            const std::string rc = body.factored ? "_rc" : "";
            const std::string fn =
                k == body.reduction_passes
                    ? function_text(body.code, "FO_FN void fo_element" + rc + "(")
                    : function_text(body.code, "FO_FN void fo_reduce_element" + rc + "<" +
                                                   std::to_string(k) + ">(");
            CHECK(captured(fn, load) == as_set(body.pass_reads[k]));
            CHECK(captured(fn, store) == as_set(body.pass_writes[k]));
            for (int r : body.pass_reads[k]) bits += body.role_bits.at(r);
            for (int r : body.pass_writes[k]) bits += body.role_bits.at(r);
          }
          CHECK(bits == (body.strategy == Strategy::Store ? body.bits_store : body.bits_recompute));
          // The vector path stages the update's reads and stores its writes, nothing else.
          const std::string stage = define_line(body.code, "FO_UPDATE_STAGE");
          const std::set<int> reads = as_set(body.pass_reads.back());
          const std::set<int> writes = as_set(body.pass_writes.back());
          CHECK(captured(stage, staged_load) == reads);
          std::set<int> write_only;
          for (int r : writes) {
            if (!reads.count(r)) write_only.insert(r);
          }
          CHECK(captured(stage, staged_decl) == write_only);
          CHECK(captured(define_line(body.code, "FO_UPDATE_STORES"), staged_store) == writes);
          ++checked;
        }
      }
    }
    CHECK(checked >= 36);
  }
}

}  // namespace fusedopt::testing
