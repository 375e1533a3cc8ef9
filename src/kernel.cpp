// The public pipeline API (include/fusedopt/kernel.hpp) over lang and the kernel provider.
#include "fusedopt/kernel.hpp"

#include <fmt/format.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "compile/compiler.hpp"
#include "compile/kernel_provider.hpp"
#include "fusedopt/error.hpp"
#include "lang/parse.hpp"
#include "presets.hpp"
#include "rule_access.hpp"
#include "support/check.hpp"

namespace fusedopt {

const char* to_string(ReductionStrategy strategy) {
  switch (strategy) {
    case ReductionStrategy::Auto:
      return "auto";
    case ReductionStrategy::Recompute:
      return "recompute";
    case ReductionStrategy::Store:
      return "store";
  }
  return "?";
}

const char* to_string(KernelOrigin origin) {
  switch (origin) {
    case KernelOrigin::Memory:
      return "memory";
    case KernelOrigin::Disk:
      return "disk";
    case KernelOrigin::Compiled:
      return "compiled";
  }
  return "?";
}

ReductionStrategy parse_reduction_strategy(const std::string& name) {
  for (ReductionStrategy s :
       {ReductionStrategy::Auto, ReductionStrategy::Recompute, ReductionStrategy::Store}) {
    if (name == to_string(s)) return s;
  }
  throw UsageError("reduction strategy '" + name + "' is none of 'auto', 'recompute' and 'store'");
}

Rule Rule::parse(std::string_view text, const std::string& file) {
  return Rule(lang::parse_rule(text, file));
}

Rule Rule::preset(const std::string& name) { return Rule(preset_rule(name)); }

std::vector<std::string> Rule::presets() { return preset_names(); }

std::vector<std::string> Rule::preset_options(const std::string& name) {
  return fusedopt::preset_options(name);
}

const std::string& Rule::name() const { return impl_->name; }

const std::string& Rule::text() const { return impl_->text; }

std::vector<std::pair<std::string, double>> Rule::hypers() const {
  std::vector<std::pair<std::string, double>> out;
  for (int h : impl_->hypers)
    out.emplace_back(impl_->symbols[h].name, impl_->symbols[h].default_value);
  return out;
}

int Rule::reduction_passes() const { return impl_->reduction_passes; }

int Rule::matrix_stages() const { return static_cast<int>(impl_->stages.size()); }

Rule Rule::with_grad_clipping(double max_grad_norm) const {
  // As OptimizerOptions::max_grad_norm: NaN, infinite or not positive is refused.
  FUSEDOPT_CHECK_USAGE(max_grad_norm > 0.0 && std::isfinite(max_grad_norm),
                       "with_grad_clipping: max_grad_norm is {}; it must be positive and finite",
                       max_grad_norm);
  FUSEDOPT_CHECK_USAGE(max_grad_norm <= static_cast<double>(FLT_MAX),
                       "with_grad_clipping: max_grad_norm is {}; it becomes the hyper "
                       "'max_grad_norm', which must be within fp32's range (<= {:.8g})",
                       max_grad_norm, static_cast<double>(FLT_MAX));
  lang::ParseOptions options;
  options.clip_grad_norm = true;
  options.max_grad_norm = max_grad_norm;
  try {
    return Rule(lang::parse_rule(impl_->text, impl_->file, options));
  } catch (const RuleError& e) {
    // The rule alone passed its checks: what clipping adds is what failed.
    const std::string hint = e.hint().empty() ? "" : e.hint() + "; ";
    throw RuleError(e.file(), e.line(), e.column(),
                    e.message() +
                        " (with gradient clipping, which adds 2 statements, the hyper "
                        "'max_grad_norm' and 1 reduction pass to the rule)",
                    e.source_line(), 1, hint + "turn clipping off, or make room for it");
  }
}

std::vector<std::string> Rule::states() const {
  std::vector<std::string> out;
  for (int s : impl_->states) out.push_back(impl_->symbols[s].name);
  return out;
}

std::vector<std::string> Rule::scalars() const {
  std::vector<std::string> out;
  for (int s : impl_->scalars) out.push_back(impl_->symbols[s].name);
  return out;
}

std::vector<std::string> Rule::row_states() const {
  std::vector<std::string> out;
  for (int s : impl_->row_states) out.push_back(impl_->symbols[s].name);
  return out;
}

std::vector<std::pair<std::string, std::string>> Rule::storage() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& [sym, kind] : impl_->storage) out.emplace_back(impl_->symbols[sym].name, kind);
  return out;
}

std::vector<std::string> Rule::col_states() const {
  std::vector<std::string> out;
  for (int s : impl_->col_states) out.push_back(impl_->symbols[s].name);
  return out;
}

std::string Rule::describe() const {
  const codegen::KernelBody body = codegen::generate_body(*impl_, DTypeBinding{});
  auto join = [](const std::vector<std::string>& names) {
    std::string out;
    for (const std::string& n : names) out += (out.empty() ? "" : " ") + n;
    return out;
  };
  std::string passes;
  if (body.reduction_passes > 0) {
    passes = fmt::format(", {} reduction pass{} before the update (", body.reduction_passes,
                         body.reduction_passes == 1 ? "" : "es");
    for (int k = 0; k < body.reduction_passes; ++k) {
      std::vector<std::string> names;
      for (const codegen::ReductionSlot& s : body.slots) {
        if (s.pass == k && s.line > 0) names.push_back(s.name);
      }
      // A pass of row_mean, col_mean and matrix_mean only has no slots of its own.
      if (names.empty() && body.factored) names.push_back("row, column and matrix means");
      passes += fmt::format("{}pass {}: {}", k ? "; " : "", k, join(names));
    }
    passes += fmt::format("), {} with fp32 tensors", codegen::to_string(body.strategy));
  }
  return fmt::format(
      "rule '{}': tensors [{}], hypers [{}], {} statements, {} uniform values hoisted out of "
      "the element loop{}",
      impl_->name, join(body.roles), join(body.hypers), impl_->stmts.size(), body.num_uniforms,
      passes);
}

namespace {

/// The entry points of a ptxas -v log, in the order it reports them.
std::vector<KernelFunction> parse_ptxas_log(const std::string& log) {
  std::vector<KernelFunction> out;
  std::istringstream in(log);
  for (std::string line; std::getline(in, line);) {
    const std::string props = "Function properties for ";
    if (auto at = line.find(props); at != std::string::npos) {
      out.push_back({line.substr(at + props.size()), 0, 0, 0, 0});
      continue;
    }
    if (line.find("Compile time") != std::string::npos) continue;
    if (out.empty()) continue;
    KernelFunction& f = out.back();
    if (line.find("bytes stack frame") != std::string::npos) {
      std::sscanf(line.c_str() + line.find_first_of("0123456789"),
                  "%d bytes stack frame, %d bytes spill stores, %d bytes spill loads",
                  &f.stack_bytes, &f.spill_store_bytes, &f.spill_load_bytes);
    } else if (auto used = line.find("Used "); used != std::string::npos) {
      std::sscanf(line.c_str() + used, "Used %d registers", &f.registers);
    }
  }
  return out;
}

std::vector<std::string> role_names(const codegen::KernelBody& body,
                                    const std::vector<int>& roles) {
  std::vector<std::string> out;
  for (int r : roles) out.push_back(body.roles.at(static_cast<std::size_t>(r)));
  return out;
}

CompiledKernel compile(const provider::KernelRequest& request, const CompileOptions& options) {
  cache::KernelCache& cache = provider::cache_at(options.cache_dir);
  provider::ProvidedKernel k = provider::provide(request, cache);
  CompiledKernel out;
  out.key = k.key.hex();
  out.origin = to_string(provider::kernel_origin(k.origin));
  out.seconds = k.seconds;
  out.target = request.target;
  out.dtypes = request.dtypes;
  out.binary = k.binary;
  out.source = std::move(k.source);
  out.cache_note = cache.last_disk_error();
  if (const cache::DiskStore* disk = cache.disk()) {
    // Kept means a file load() would return, not any file at that name: a store refused by
    // an untrusted sub-folder, or one that failed on a folder in the way, leaves something
    // there too.
    const std::string problem = disk->entry_problem(k.key, k.ext);
    if (problem.empty()) {
      out.disk_entry = disk->entry_path(k.key, k.ext);
    } else {
      out.cache_note = out.cache_note.empty() || problem.find(out.cache_note) != std::string::npos
                           ? problem
                           : problem + " (" + out.cache_note + ")";
    }
  }
  return out;
}

}  // namespace

CompiledKernel compile_kernel(const Rule& rule, const Target& target, const DTypeBinding& dtypes,
                              const CompileOptions& options) {
  provider::KernelRequest request;
  request.rule = RuleAccess::impl(rule);
  request.dtypes = dtypes;
  request.target = target;
  request.strategy = options.reduction_strategy;
  return compile(request, options);
}

CompiledKernel compile_trusted_functor(const TrustedFunctor& functor, const Target& target,
                                       const DTypeBinding& dtypes, const CompileOptions& options) {
  provider::KernelRequest request;
  request.functor = &functor;
  request.dtypes = dtypes;
  request.target = target;
  return compile(request, options);
}

KernelReport report_kernel(const Rule& rule, const Target& target, const DTypeBinding& dtypes,
                           ReductionStrategy strategy) {
  const codegen::KernelBody body =
      codegen::generate_body(*RuleAccess::impl(rule), dtypes, strategy);
  KernelReport out;
  out.strategy = body.strategy;
  for (std::size_t k = 0; k < body.pass_reads.size(); ++k) {
    KernelPass pass;
    pass.update = k + 1 == body.pass_reads.size();
    pass.reads = role_names(body, body.pass_reads[k]);
    pass.writes = role_names(body, body.pass_writes[k]);
    for (const auto* roles : {&body.pass_reads[k], &body.pass_writes[k]}) {
      for (int r : *roles)
        pass.bytes_per_element += body.role_bits.at(static_cast<std::size_t>(r)) / 8.0;
    }
    out.bytes_per_element += pass.bytes_per_element;
    out.passes.push_back(std::move(pass));
  }
  if (target.kind == Target::Kind::Cuda) {
    const std::string source = codegen::generate_source(body, target);
    // The entry points only (math helpers such as pow's slow path are functions too).
    const std::string log =
        jit::nvrtc_resource_log(source, codegen::source_file_name(body, target), target);
    for (KernelFunction& f : parse_ptxas_log(log)) {
      if (f.name.rfind("fusedopt_", 0) == 0) out.functions.push_back(std::move(f));
    }
    // Every kernel has entry points: a log without them is one this parser does not know
    // (seen once on an H200 machine, not understood): say so with the log, never report none.
    if (out.functions.empty()) {
      throw InternalError(fmt::format(
          "{}: NVRTC's ptxas report (--ptxas-options=-v) named no fusedopt_ entry point; "
          "its log ({} bytes) begins:\n{}",
          target.str(), log.size(), log.substr(0, 2000)));
    }
  }
  return out;
}

}  // namespace fusedopt
