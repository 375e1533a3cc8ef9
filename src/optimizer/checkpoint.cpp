// Optimizer::save / load: safetensors files with one tensor per (parameter, state) pair and
// the master copies, plus metadata (rule, step, hypers) that load() checks before copying
// anything, so a failed load leaves the optimizer as it was. The pieces say what: the state
// store its tensors and storage, the hypers their text, the runner its step and kernels.
#include <fmt/format.h>

#include <algorithm>
#include <optional>
#include <set>

#include "fusedopt/checkpoint_format.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/safetensors.hpp"
#include "fusedopt/state_check.hpp"
#include "fusedopt/version.hpp"
#include "io/safetensors.hpp"
#include "optimizer/optimizer_impl.hpp"
#include "support/check.hpp"
#include "support/parse_number.hpp"

namespace fusedopt {

using runtime::CheckpointTensor;

namespace {

namespace ck = fusedopt::checkpoint;

}  // namespace

void Optimizer::save(const std::filesystem::path& path) const {
  const Impl& m = live("save");
  Impl::Exclusive hold(m, "save");
  std::vector<SafetensorsTensor> tensors;
  // Memory the host can read is written in place; device memory is staged through host
  // memory (the backend's copies wait for every queued step first).
  std::vector<std::vector<std::byte>> staged;
  m.backend->synchronize();
  for (const CheckpointTensor& e : m.store.checkpoint_tensors()) {
    const auto bytes = static_cast<std::size_t>(e.numel) * dtype_size(e.dtype);
    const void* data = m.backend->host_address(e.data);
    if (!data && bytes > 0) {
      staged.emplace_back(bytes);
      m.backend->copy_to_host(staged.back().data(), e.data, bytes);
      data = staged.back().data();
    }
    tensors.push_back({e.name, e.dtype, e.numel, data});
  }
  std::string keys;
  for (const auto& kernel : m.runner.kernels()) keys += (keys.empty() ? "" : ",") + kernel->key();
  std::vector<ck::ParamEntry> params;
  for (const runtime::ParamSlot& s : m.store.params()) {
    params.push_back({s.name, s.param.numel, s.param.dtype});
  }
  std::map<std::string, std::string> metadata = {
      {ck::kFormatKey, std::to_string(ck::kFormat)},
      {ck::kVersionKey, FUSEDOPT_VERSION_STRING},
      {ck::kRuleKey, m.rule.name()},
      {ck::kRuleTextKey, m.rule.text()},
      {ck::kKernelKeysKey, keys},
      {ck::kStepKey, std::to_string(m.runner.steps_taken())},
      {ck::kHypersKey, m.hypers.text()},
      {ck::kStateDtypeKey, to_string(m.options.state_dtype)},
      {ck::kMasterWeightsKey, m.options.master_weights ? "true" : "false"},
      {ck::kParamsKey, ck::format_params(params)},
  };
  if (const auto [storage, block] = m.store.storage_text(); !storage.empty()) {
    metadata[ck::kStateStorageKey] = storage;
    metadata[ck::kQuantBlockKey] = block;
  }
  // The same writer as every fusedopt file (fusedopt/safetensors.hpp): atomic (a temp file,
  // fsync, rename), with the checksum of the whole file.
  write_safetensors(path, tensors, metadata);
}

namespace {

using ck::Refusal;

/// Metadata entry `key` of `file`, or malformed.
const std::string& meta(const io::SafetensorsFile& file, const char* key, const Refusal& r) {
  auto it = file.metadata.find(key);
  if (it == file.metadata.end()) r.malformed(fmt::format("metadata '{}' is missing", key));
  return it->second;
}

/// The format, the checksum it requires and the rule: is this file for this optimizer?
void check_header(const io::SafetensorsFile& file, const Rule& rule, const Refusal& r) {
  const std::optional<std::int64_t> format =
      support::parse_int_strict(meta(file, ck::kFormatKey, r));
  if (!format || *format < ck::kOldestFormat || *format > ck::kFormat) {
    r.malformed(fmt::format("checkpoint format {} is not a format this fusedopt reads ({} to {})",
                            meta(file, ck::kFormatKey, r), ck::kOldestFormat, ck::kFormat));
  }
  if (*format >= 2 && (file.checksum.empty() || !file.data_checked)) {
    // save() writes it into every file of this format: its entry was removed or damaged.
    r.malformed(
        fmt::format("it has no checksum ('{}'), which every checkpoint of format {} "
                    "carries: the file was changed or damaged after it was written",
                    io::kChecksumKey, *format));
  }
  if (meta(file, ck::kRuleKey, r) != rule.name()) {
    r.misfit(fmt::format("it was saved by rule '{}', this optimizer runs rule '{}'",
                         meta(file, ck::kRuleKey, r), rule.name()));
  }
  if (meta(file, ck::kRuleTextKey, r) != rule.text()) {
    r.misfit(fmt::format("rule '{}' was saved with a different text (the rule changed since)",
                         rule.name()));
  }
}

std::int64_t read_step(const io::SafetensorsFile& file, const Refusal& r) {
  const std::string& text = meta(file, ck::kStepKey, r);
  const std::optional<std::int64_t> step = support::parse_int_strict(text);
  if (!step || *step < 0) r.malformed(fmt::format("step '{}' is not a step count", text));
  if (*step > kMaxSteps) {
    r.malformed(fmt::format("step {} is above the most steps an optimizer takes (2^53)", text));
  }
  return *step;
}

/// Group `g`'s hypers as hypers_text() writes them ("groupG:name=value,..."), into `out`
/// (the group's values in `names` order): every hyper once, in the writer's spelling, through
/// the rule every entry point applies.
void read_group_hypers(const std::vector<std::string>& names, std::size_t g,
                       const std::string& text, std::vector<double>& out, const Refusal& r) {
  const std::string prefix = fmt::format("group{}:", g);
  if (text.compare(0, prefix.size(), prefix) != 0) {
    r.malformed(fmt::format("hypers of group {} are malformed: '{}'", g, text));
  }
  std::set<std::size_t> seen;
  for (const std::string& item : ck::fields(text.substr(prefix.size()), ',')) {
    if (item.empty() && names.empty()) continue;  // a rule without hypers
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos) {
      r.malformed(fmt::format("hyper '{}' of group {} is malformed", item, g));
    }
    const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
    const auto at = std::find(names.begin(), names.end(), name);
    if (at == names.end()) {  // the rule's text matched: the file is malformed
      r.malformed(fmt::format("group {} has hyper '{}', which the rule has not", g, name));
    }
    const auto k = static_cast<std::size_t>(at - names.begin());
    const std::optional<double> x = support::parse_double_strict(value);
    if (!x) {
      r.malformed(
          fmt::format("hyper '{}' of group {} has the value '{}', not a finite decimal number",
                      name, g, value));
    }
    try {
      check_hyper_value("load", name, static_cast<int>(g), *x);
    } catch (const UsageError& e) {
      r.misfit(e.what());
    }
    out[k] = *x;
    if (!seen.insert(k).second) {
      r.malformed(fmt::format("hyper '{}' appears twice in group {}", name, g));
    }
  }
  if (seen.size() != names.size()) {
    r.malformed(fmt::format("group {} lacks some of the rule's hypers", g));
  }
}

/// Every group's hypers of `file`, starting from `current` (the optimizer's).
std::vector<std::vector<double>> read_hypers(const io::SafetensorsFile& file,
                                             const std::vector<std::string>& names,
                                             std::vector<std::vector<double>> current,
                                             const Refusal& r) {
  const std::vector<std::string> groups = ck::fields(meta(file, ck::kHypersKey, r), ';');
  if (groups.size() != current.size()) {
    r.misfit(fmt::format("it holds hypers for {} param group{}, this optimizer has {}",
                         groups.size(), groups.size() == 1 ? "" : "s", current.size()));
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    read_group_hypers(names, g, groups[g], current[g], r);
  }
  return current;
}

/// A file that records its states' storage (written since 2026-11-27) must have `mine`:
/// codes of another map would load as wrong values.
void check_storage(const io::SafetensorsFile& file, const std::pair<std::string, std::string>& mine,
                   const Refusal& r) {
  if (!file.metadata.count(ck::kStateStorageKey) && !file.metadata.count(ck::kQuantBlockKey))
    return;
  auto theirs = [&](const char* key) {
    auto it = file.metadata.find(key);
    return it == file.metadata.end() ? std::string() : it->second;
  };
  const std::string storage = theirs(ck::kStateStorageKey), block = theirs(ck::kQuantBlockKey);
  if (storage != mine.first || block != mine.second) {
    r.misfit(fmt::format("its states are stored as {} (blocks of {}), this optimizer keeps {}",
                         storage, block.empty() ? "?" : block,
                         mine.first.empty()
                             ? std::string("them unquantized")
                             : fmt::format("{} (blocks of {})", mine.first, mine.second)));
  }
}

/// The file holds exactly the tensors `expected`, each in its dtype and shape.
void check_tensors(const io::SafetensorsFile& file, const std::vector<CheckpointTensor>& expected,
                   const Refusal& r) {
  std::set<std::string> names;
  for (const CheckpointTensor& e : expected) {
    names.insert(e.name);
    auto it = file.tensors.find(e.name);
    if (it == file.tensors.end()) r.misfit(fmt::format("tensor '{}' is missing", e.name));
    const io::SafetensorsFile::Entry& entry = it->second;
    if (entry.dtype != safetensors_name(e.dtype)) {
      r.misfit(fmt::format("tensor '{}' is {}, this optimizer keeps it as {}", e.name, entry.dtype,
                           safetensors_name(e.dtype)));
    }
    if (entry.shape != std::vector<std::int64_t>{e.numel}) {
      std::string shape;
      for (std::int64_t d : entry.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      r.misfit(fmt::format("tensor '{}' has shape [{}], this optimizer's has [{}]", e.name, shape,
                           e.numel));
    }
  }
  for (const auto& [name, entry] : file.tensors) {
    if (!names.count(name)) {
      r.misfit(fmt::format("it holds tensor '{}', which this optimizer has no param or state for",
                           name));
    }
  }
}

/// The storage the file records per rule state ("m=q8s,v=q8u" -> m: q8s, ...) and its block;
/// empty and 0 where it records none (files written before 2026-11-27).
std::pair<std::map<std::string, std::string>, std::int64_t> recorded_storage(
    const io::SafetensorsFile& file, const Refusal& r) {
  std::map<std::string, std::string> kinds;
  auto it = file.metadata.find(ck::kStateStorageKey);
  if (it == file.metadata.end()) return {};
  for (const std::string& item : ck::fields(it->second, ',')) {
    const std::size_t eq = item.find('=');
    if (eq == std::string::npos || !kinds.emplace(item.substr(0, eq), item.substr(eq + 1)).second) {
      r.malformed(fmt::format("its state storage '{}' is malformed", it->second));
    }
  }
  const std::optional<std::int64_t> block =
      support::parse_int_strict(meta(file, ck::kQuantBlockKey, r));
  if (!block || *block <= 0) r.malformed("its quant_block is not a block size");
  return {kinds, *block};
}

/// Each quantized state's codes and absmax as the file holds them, through the one check of a
/// loaded state (fusedopt/state_check.hpp): its storage and block, codes, absmax values.
void check_quant_states(const io::SafetensorsFile& file, const runtime::StateStore& store,
                        const Refusal& r) {
  const auto [kinds, block] = recorded_storage(file, r);
  for (std::size_t p = 0; p < store.params().size(); ++p) {
    const std::string& param = store.params()[p].name;
    for (const runtime::StateSpec& spec : store.specs()) {
      if (spec.kind != StateKind::Element) continue;
      const KeptState kept = store.kept_state(p, spec.index);
      if (kept.storage == Quant::None) continue;  // values: their dtype and shape suffice
      LoadedState in;
      if (auto at = kinds.find(spec.name); at != kinds.end()) in.storage = at->second;
      in.block = block;
      const std::string codes = ck::tensor_name(param, spec.name), absmax = codes + ".absmax";
      const io::SafetensorsFile::Entry& c = file.tensors.at(codes);
      const io::SafetensorsFile::Entry& a = file.tensors.at(absmax);
      in.codes_dtype = c.dtype;
      in.codes_numel = c.shape.empty() ? 1 : c.shape[0];
      in.codes = file.tensor_data(codes);
      in.absmax_dtype = a.dtype;
      in.absmax_numel = a.shape.empty() ? 1 : a.shape[0];
      in.absmax = file.tensor_data(absmax);
      try {
        check_loaded_state(fmt::format("state '{}' of param '{}'", spec.name, param), kept, in);
      } catch (const UsageError& e) {
        r.misfit(e.what());
      }
    }
  }
}

}  // namespace

void Optimizer::Impl::load_file(const io::SafetensorsFile& file, const std::string& where,
                                bool check_only) {
  // Everything is checked first; nothing is touched until all of it passed.
  const Refusal refusal{fmt::format("cannot load checkpoint {}", where)};
  check_header(file, rule, refusal);
  const std::int64_t step = read_step(file, refusal);
  std::vector<std::vector<double>> new_hypers =
      read_hypers(file, hypers.names(), hypers.values(), refusal);
  check_storage(file, store.storage_text(), refusal);
  const std::vector<CheckpointTensor> expected = store.checkpoint_tensors();
  check_tensors(file, expected, refusal);
  check_quant_states(file, store, refusal);
  try {
    runner.check_hypers(new_hypers);  // a matrix stage's iteration numbers
  } catch (const UsageError& e) {
    refusal.misfit(e.what());
  }
  if (check_only) return;

  // The backend's copies wait for every queued step and land before they return.
  for (const CheckpointTensor& e : expected) {
    if (e.numel == 0) continue;
    backend->copy_from_host(e.data, file.tensor_data(e.name),
                            static_cast<std::size_t>(e.numel) * dtype_size(e.dtype));
  }
  runner.set_steps_taken(step);
  hypers.replace(std::move(new_hypers));
  runner.set_hypers(hypers.values());
}

void Optimizer::load(const std::filesystem::path& path) {
  Impl& m = live("load");
  Impl::Exclusive hold(m, "load");
  io::SafetensorsFile file;
  try {
    file = io::read_safetensors(path);
  } catch (const Error& e) {
    throw IoError(fmt::format("cannot load checkpoint: {}", e.what()));
  }
  m.load_file(file, path.string());
}

namespace {

/// The tensors as a checked file in memory: the caller read and checked them (a sharded
/// checkpoint's shards are each checked whole against their checksum).
io::SafetensorsFile file_in_memory(const std::map<std::string, std::string>& metadata,
                                   const std::vector<SafetensorsTensor>& tensors) {
  io::SafetensorsFile file;
  file.metadata = metadata;
  file.checksum = "in memory";
  file.data_checked = true;
  for (const SafetensorsTensor& t : tensors) {
    FUSEDOPT_CHECK_USAGE(t.numel >= 0 && (t.numel == 0 || t.data != nullptr),
                         "load_tensors: tensor '{}' has {} elements at {}", t.name, t.numel,
                         t.data);
    const auto bytes = static_cast<std::size_t>(t.numel) * dtype_size(t.dtype);
    io::SafetensorsFile::Entry e;
    e.dtype = safetensors_name(t.dtype);
    e.shape = {t.numel};
    e.begin = file.data.size();
    file.data.append(static_cast<const char*>(t.data), bytes);
    e.end = file.data.size();
    FUSEDOPT_CHECK_USAGE(file.tensors.emplace(t.name, std::move(e)).second,
                         "load_tensors: tensor '{}' is given twice", t.name);
  }
  return file;
}

}  // namespace

void OptimizerExtension::load_tensors(Optimizer& opt,
                                      const std::map<std::string, std::string>& metadata,
                                      const std::vector<SafetensorsTensor>& tensors,
                                      const std::string& where) {
  Optimizer::Impl& m = opt.live("load");
  Optimizer::Impl::Exclusive hold(m, "load");
  m.load_file(file_in_memory(metadata, tensors), where);
}

void OptimizerExtension::check_tensors(Optimizer& opt,
                                       const std::map<std::string, std::string>& metadata,
                                       const std::vector<SafetensorsTensor>& tensors,
                                       const std::string& where) {
  Optimizer::Impl& m = opt.live("load");
  Optimizer::Impl::Exclusive hold(m, "load");
  m.load_file(file_in_memory(metadata, tensors), where, true);
}

}  // namespace fusedopt
