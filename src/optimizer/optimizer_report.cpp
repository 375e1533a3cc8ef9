// The optimizer's reports: what fusing bought (fusion_report) and what each pass of each
// binding reads and writes (schedule_report), for FUSEDOPT_LOG=info, and stats(): sizes,
// bytes and traffic per pass, the step program, the kernels.
#include <fmt/format.h>

#include <algorithm>

#include "optimizer/optimizer_impl.hpp"
#include "rule_access.hpp"
#include "support/log.hpp"

namespace fusedopt {
namespace {

std::string format_elements(std::int64_t n) {
  if (n < 10000) return fmt::format("{} element{}", n, n == 1 ? "" : "s");
  if (n < 1000000) return fmt::format("{:.1f} K elements", static_cast<double>(n) / 1e3);
  if (n < 1000000000) return fmt::format("{:.1f} M elements", static_cast<double>(n) / 1e6);
  return fmt::format("{:.2f} G elements", static_cast<double>(n) / 1e9);
}

std::string role_list(const KernelLayout& body, const std::vector<int>& roles) {
  std::string out;
  for (int r : roles) out += (out.empty() ? "" : " ") + body.roles[static_cast<std::size_t>(r)];
  return out.empty() ? "-" : out;
}

/// What each pass reads and writes, and why the strategy was chosen, per binding.
std::string describe_schedule(const lang::Rule& r,
                              const std::vector<std::unique_ptr<runtime::Binding>>& backends,
                              const std::vector<DTypeBinding>& bindings) {
  std::string out;
  for (std::size_t b = 0; b < backends.size(); ++b) {
    const KernelLayout& body = backends[b]->layout();
    out += fmt::format("{}{} [{}]:", out.empty() ? "" : "\n", r.name, bindings[b].str());
    for (std::size_t k = 0; k < body.pass_reads.size(); ++k) {
      std::string what;
      for (const ReductionSlot& s : body.slots) {
        if (s.pass == static_cast<int>(k) && s.name != "grad_check") {
          what += (what.empty() ? "" : ", ") + fmt::format("{} (line {})", s.name, s.line);
        }
      }
      const bool update = static_cast<int>(k) == body.reduction_passes;
      out +=
          fmt::format(" pass {} {}: reads {}, writes {};", k, update ? "update" : "[" + what + "]",
                      role_list(body, body.pass_reads[k]), role_list(body, body.pass_writes[k]));
    }
    if (body.store_pass >= 0) {
      std::string held;
      for (const std::string& s : body.scratch) held += (held.empty() ? "" : ", ") + s;
      out += fmt::format(
          " store: pass {} keeps {} in fp32 scratch ({} MB) for the update: {} B/element "
          "per step, against {} recomputing",
          body.store_pass, held.empty() ? "nothing" : held,
          static_cast<double>(backends[b]->scratch_bytes()) / 1e6,
          static_cast<double>(body.bits_store) / 8, static_cast<double>(body.bits_recompute) / 8);
    } else {
      out += fmt::format(
          " recompute: the update recomputes what it needs: {} B/element per step, "
          "against {} storing",
          static_cast<double>(body.bits_recompute) / 8, static_cast<double>(body.bits_store) / 8);
    }
  }
  return out;
}

}  // namespace

namespace runtime {

Reports make_reports(const Rule& rule, const StateStore& store, const StepRunner& runner,
                     const Backend& backend) {
  const std::vector<ParamSlot>& params = store.params();
  const std::vector<DTypeBinding>& bindings = store.bindings();
  const std::vector<std::unique_ptr<Binding>>& kernels = runner.kernels();
  Reports out;
  // What fusing bought: the launches a per-tensor loop would make against ours.
  std::int64_t elements = 0, nonempty = 0, launches = 0;
  for (const ParamSlot& s : params) {
    elements += s.param.numel;
    nonempty += s.param.numel > 0 ? 1 : 0;
  }
  for (std::size_t b = 0; b < kernels.size(); ++b) {
    launches += kernels[b]->launches_per_step(b == 0);  // the step's count: one per step
  }
  out.fusion =
      fmt::format("{} over {} tensor{} ({}): {} launch{} per step instead of {}", rule.name(),
                  params.size(), params.size() == 1 ? "" : "s", format_elements(elements), launches,
                  launches == 1 ? "" : "es", nonempty);
  if (bindings.size() > 1) {
    std::string list;
    for (const DTypeBinding& b : bindings) list += (list.empty() ? "" : ", ") + b.str();
    out.fusion += fmt::format(" (one per dtype binding: {})", list);
  }
  const int passes = runner.reduction_passes();
  if (passes > 0) {
    out.fusion += fmt::format(" ({} reduction pass{} + update{})", passes, passes == 1 ? "" : "es",
                              bindings.size() > 1 ? " per binding" : "");
    out.schedule = describe_schedule(detail::lang_rule(rule), kernels, bindings);
  }
  support::log(support::LogLevel::Info, out.fusion);
  if (!out.schedule.empty()) support::log(support::LogLevel::Info, out.schedule);
  if (support::log_enabled(support::LogLevel::Debug)) {
    for (std::size_t b = 0; b < kernels.size(); ++b) {
      support::log(
          support::LogLevel::Debug,
          fmt::format("kernel {} ({}) on {}: {} tensors, {} from {} in {:.3f} s", bindings[b].str(),
                      rule.name(), backend.name(), store.binding_params()[b].size(),
                      kernels[b]->key(), to_string(kernels[b]->origin()), kernels[b]->seconds()));
    }
  }
  return out;
}

}  // namespace runtime

OptimizerStats Optimizer::stats() const {
  const Impl& m = live("stats");
  const std::vector<runtime::ParamSlot>& params = m.store.params();
  const std::vector<std::unique_ptr<runtime::Binding>>& kernels = m.runner.kernels();
  OptimizerStats st;
  st.tensors = static_cast<std::int64_t>(params.size());
  for (const runtime::ParamSlot& s : params) {
    st.elements += s.param.numel;
    if (s.binding < 0) continue;
    // What each pass of the binding's kernel reads and writes, per element.
    const KernelLayout& body = kernels[static_cast<std::size_t>(s.binding)]->layout();
    std::int64_t bits = 0;  // per element: a 4-bit state's codes move half a byte
    for (const auto* roles : {&body.pass_reads, &body.pass_writes}) {
      for (const std::vector<int>& pass : *roles) {
        for (int r : pass) bits += body.role_bits[static_cast<std::size_t>(r)];
      }
    }
    st.bytes_per_step += bits * s.param.numel / 8;
    st.bytes_recompute += body.bits_recompute * s.param.numel / 8;
    st.bytes_store += body.bits_store * s.param.numel / 8;
  }
  for (std::size_t b = 0; b < kernels.size(); ++b) {
    std::int64_t elements = 0;
    for (int p : m.store.binding_params()[b]) {
      elements += params[static_cast<std::size_t>(p)].param.numel;
    }
    const KernelLayout& body = kernels[b]->layout();
    for (std::size_t k = 0; k < body.pass_reads.size(); ++k) {
      PassTraffic t;
      t.elements = elements;
      const std::vector<int>& reads = body.pass_reads[k];
      const std::vector<int>& writes = body.pass_writes[k];
      auto has = [](const std::vector<int>& v, int r) {
        return std::find(v.begin(), v.end(), r) != v.end();
      };
      for (int r : reads)
        (has(writes, r) ? t.update_bits : t.read_bits).push_back(body.role_bits[r]);
      for (int r : writes)
        if (!has(reads, r)) t.write_bits.push_back(body.role_bits[r]);
      st.traffic.push_back(std::move(t));
    }
  }
  st.state_bytes = m.store.bytes();
  st.reduction_passes = m.runner.reduction_passes();
  if (st.reduction_passes > 0 && !kernels.empty()) {
    st.reduction_strategy = kernels.front()->layout().strategy;
  }
  st.schedule_report = m.reports.schedule;
  st.step_program = runtime::describe(m.runner.plain_program());
  st.scaled_step_program = runtime::describe(m.runner.scaled_program());
  int staged = 0;  // pieces of a factored rule: the finalizes' further stages
  for (int n : m.runner.finalize_stages()) staged += n - 1;
  for (std::size_t b = 0; b < kernels.size(); ++b) {
    const auto& kernel = kernels[b];
    st.launches_per_step += kernel->launches_per_step(b == 0);  // the count: one per step
    if (!kernel->plan().empty()) st.launches_per_step += staged;
    st.kernel_keys.push_back(kernel->key());
    st.kernel_seconds += kernel->seconds();
    // KernelOrigin runs from the cheapest to the dearest: the dearest is the largest.
    if (!st.kernel_origin || kernel->origin() > *st.kernel_origin)
      st.kernel_origin = kernel->origin();
  }
  st.fusion_report = m.reports.fusion;
  return st;
}

const char* to_string(StateKind kind) {
  switch (kind) {
    case StateKind::Element:
      return "element";
    case StateKind::Output:
      return "output";
    case StateKind::Scalar:
      return "scalar";
    case StateKind::Row:
      return "row";
    case StateKind::Col:
      return "col";
    case StateKind::Master:
      return "master";
    case StateKind::Absmax:
      return "absmax";
  }
  return "?";
}

}  // namespace fusedopt
