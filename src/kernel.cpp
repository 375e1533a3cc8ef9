// The public pipeline API (include/fusedopt/kernel.hpp) over lang, codegen, jit and cache.
#include "fusedopt/kernel.hpp"

#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "jit/kernel_builder.hpp"
#include "lang/parse.hpp"
#include "presets.hpp"

namespace fusedopt {

Rule Rule::parse(std::string_view text, const std::string& file) {
  return Rule(lang::parse_rule(text, file));
}

Rule Rule::preset(const std::string& name) { return Rule(preset_rule(name)); }

std::vector<std::string> Rule::presets() { return preset_names(); }

const std::string& Rule::name() const { return impl_->name; }

std::vector<std::pair<std::string, double>> Rule::hypers() const {
  std::vector<std::pair<std::string, double>> out;
  for (int h : impl_->hypers)
    out.emplace_back(impl_->symbols[h].name, impl_->symbols[h].default_value);
  return out;
}

int Rule::reduction_passes() const { return impl_->reduction_passes; }

Rule Rule::with_grad_clipping(double max_grad_norm) const {
  lang::ParseOptions options;
  options.clip_grad_norm = true;
  options.max_grad_norm = max_grad_norm;
  return Rule(lang::parse_rule(impl_->text, impl_->file, options));
}

std::vector<std::string> Rule::states() const {
  std::vector<std::string> out;
  for (int s : impl_->states) out.push_back(impl_->symbols[s].name);
  return out;
}

namespace {

CompiledKernel finish(const codegen::KernelBody& body, const Target& target,
                      const DTypeBinding& dtypes) {
  jit::BuiltKernel k = jit::build_kernel(body, dtypes, target, cache::KernelCache::global());
  CompiledKernel out;
  out.key = k.key.hex();
  out.origin = cache::to_string(k.origin);
  out.seconds = k.seconds;
  out.target = target;
  out.dtypes = dtypes;
  out.binary = k.binary;
  out.source = std::move(k.source);
  return out;
}

}  // namespace

CompiledKernel compile_kernel(const Rule& rule, const Target& target, const DTypeBinding& dtypes) {
  return finish(codegen::generate_body(*rule.impl(), dtypes), target, dtypes);
}

CompiledKernel compile_trusted_functor(const TrustedFunctor& functor, const Target& target,
                                       const DTypeBinding& dtypes) {
  return finish(codegen::generate_functor_body(functor, dtypes), target, dtypes);
}

}  // namespace fusedopt
