// Optimizer::save / load: safetensors files with one tensor per (parameter, state) pair and
// the master copies, plus metadata (rule, step, hypers) that load() checks before copying
// anything, so a failed load leaves the optimizer as it was.
#include <fmt/format.h>

#include <optional>
#include <set>

#include "fusedopt/error.hpp"
#include "io/safetensors.hpp"
#include "jit/build.hpp"
#include "runtime/optimizer_impl.hpp"
#include "support/parse_number.hpp"

namespace fusedopt {

using runtime::CheckpointTensor;

namespace {

/// The layout of the metadata and tensor names below.
/// Bump when you change this: a key, a name pattern or a value's format.
/// 2: the file's checksum (io::kChecksumKey, over the whole file) is required.
/// 1: (before 2026-11-26) the same layout; a checksum of the data section when present.
constexpr int kCheckpointFormat = 2;
constexpr int kOldestFormat = 1;

const char* st_dtype(DType d) { return io::safetensors_dtype(d); }

}  // namespace

/// The rule states (not the per-step outputs) of every param, its scalar states (one F64
/// each, empty params included), then the masters: what save() writes and load()
/// requires. A master is expected for every 16-bit param when master_weights is set, empty
/// ones included, so the set does not depend on sizes.
std::vector<CheckpointTensor> Optimizer::Impl::checkpoint_tensors() const {
  std::vector<CheckpointTensor> out;
  for (std::size_t p = 0; p < params.size(); ++p) {
    for (const runtime::StateSpec& spec : specs) {
      if (!spec.saved()) continue;
      // A master for every 16-bit param (empty ones too), none for an fp32 one.
      if (spec.kind == runtime::StateSpec::Kind::Master && params[p].param.dtype == DType::F32) {
        continue;
      }
      const Tensor t = state_view(spec, p);
      out.push_back({t.name, t.dtype, t.numel, t.data});
    }
  }
  return out;
}

/// "group0:lr=0.001,beta1=0.90000000000000002;group1:...", 17 significant digits so every
/// double reads back exactly.
std::string Optimizer::Impl::hypers_text() const {
  std::string out;
  for (std::size_t g = 0; g < hypers.size(); ++g) {
    out += fmt::format("{}group{}:", g ? ";" : "", g);
    for (std::size_t k = 0; k < hyper_names.size(); ++k) {
      out += fmt::format("{}{}={:.17g}", k ? "," : "", hyper_names[k], hypers[g][k]);
    }
  }
  return out;
}

namespace {

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = text.find(sep, begin);
    out.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

}  // namespace

void Optimizer::save(const std::filesystem::path& path) const {
  const Impl& m = live("save");
  Impl::Exclusive hold(m, "save");
  std::vector<io::TensorView> views;
  // Memory the host can read is written in place; device memory is staged through host
  // memory (the backend's copies wait for every queued step first).
  std::vector<std::vector<std::byte>> staged;
  m.backend->synchronize();
  for (const CheckpointTensor& e : m.checkpoint_tensors()) {
    const auto bytes = static_cast<std::size_t>(e.numel) * dtype_size(e.dtype);
    const void* data = m.backend->host_address(e.data);
    if (!data && bytes > 0) {
      staged.emplace_back(bytes);
      m.backend->copy_to_host(staged.back().data(), e.data, bytes);
      data = staged.back().data();
    }
    views.push_back({e.name, st_dtype(e.dtype), {e.numel}, data, bytes});
  }
  std::string keys;
  for (const auto& kernel : m.kernels) keys += (keys.empty() ? "" : ",") + kernel->key();
  // "name<TAB>numel<TAB>dtype" per param, in order: what a tool needs to cut the file into
  // shards (ShardedOptimizer::split_checkpoint); load() does not read it.
  std::string params;
  for (const runtime::ParamSlot& s : m.params) {
    params += fmt::format("{}\t{}\t{}\n", s.name, s.param.numel, to_string(s.param.dtype));
  }
  const std::map<std::string, std::string> metadata = {
      {"fusedopt_checkpoint_format", std::to_string(kCheckpointFormat)},
      {"fusedopt_version", jit::version()},
      {"rule", m.rule.name()},
      {"rule_text", m.rule.text()},
      {"kernel_keys", keys},
      {"step", std::to_string(m.current_step_count())},
      {"hypers", m.hypers_text()},
      {"state_dtype", to_string(m.options.state_dtype)},
      {"master_weights", m.options.master_weights ? "true" : "false"},
      {"params", params},
  };
  io::write_safetensors(path, views, metadata);  // atomic: temp file, fsync, rename
}

void Optimizer::load(const std::filesystem::path& path) {
  Impl& m = live("load");
  Impl::Exclusive hold(m, "load");
  auto fail = [&](const std::string& what) {
    throw UsageError(fmt::format("cannot load checkpoint {}: {}", path.string(), what));
  };
  io::SafetensorsFile file;
  try {
    file = io::read_safetensors(path);
  } catch (const Error& e) {
    throw IoError(fmt::format("cannot load checkpoint: {}", e.what()));
  }
  auto meta = [&](const char* key) -> const std::string& {
    auto it = file.metadata.find(key);
    if (it == file.metadata.end()) fail(fmt::format("metadata '{}' is missing", key));
    return it->second;
  };

  // Everything is checked first; nothing is touched until all of it passed.
  const std::optional<std::int64_t> format =
      support::parse_int_strict(meta("fusedopt_checkpoint_format"));
  if (!format || *format < kOldestFormat || *format > kCheckpointFormat) {
    fail(fmt::format("checkpoint format {} is not a format this fusedopt reads ({} to {})",
                     meta("fusedopt_checkpoint_format"), kOldestFormat, kCheckpointFormat));
  }
  if (*format >= 2 && (file.checksum.empty() || !file.data_checked)) {
    // save() writes it into every file of this format: its entry was removed or damaged.
    throw IoError(fmt::format(
        "cannot load checkpoint {}: it has no checksum ('{}'), which every checkpoint of "
        "format {} carries: the file was changed or damaged after it was written",
        path.string(), io::kChecksumKey, *format));
  }
  if (meta("rule") != m.rule.name()) {
    fail(fmt::format("it was saved by rule '{}', this optimizer runs rule '{}'", meta("rule"),
                     m.rule.name()));
  }
  if (meta("rule_text") != m.rule.text()) {
    fail(fmt::format("rule '{}' was saved with a different text (the rule changed since)",
                     m.rule.name()));
  }
  const std::string& step_text = meta("step");
  const std::optional<std::int64_t> parsed_step = support::parse_int_strict(step_text);
  if (!parsed_step || *parsed_step < 0) {
    fail(fmt::format("step '{}' is not a step count", step_text));
  }
  const std::int64_t step = *parsed_step;
  if (step > kMaxSteps) {
    fail(fmt::format("step {} is above the most steps an optimizer takes (2^53)", step_text));
  }

  std::vector<std::vector<double>> hypers = m.hypers;
  const std::vector<std::string> groups = split(meta("hypers"), ';');
  if (groups.size() != m.hypers.size()) {
    fail(fmt::format("it holds hypers for {} param group{}, this optimizer has {}", groups.size(),
                     groups.size() == 1 ? "" : "s", m.hypers.size()));
  }
  for (std::size_t g = 0; g < groups.size(); ++g) {
    const std::string prefix = fmt::format("group{}:", g);
    if (groups[g].compare(0, prefix.size(), prefix) != 0) {
      fail(fmt::format("hypers of group {} are malformed: '{}'", g, groups[g]));
    }
    std::set<std::size_t> seen;
    for (const std::string& item : split(groups[g].substr(prefix.size()), ',')) {
      if (item.empty() && m.hyper_names.empty()) continue;  // a rule without hypers
      const std::size_t eq = item.find('=');
      if (eq == std::string::npos)
        fail(fmt::format("hyper '{}' of group {} is malformed", item, g));
      const std::string name = item.substr(0, eq), value = item.substr(eq + 1);
      std::size_t k = 0;
      try {
        k = m.hyper_index(name);
      } catch (const Error& e) {
        fail(fmt::format("group {}: {}", g, e.what()));
      }
      // Only the spelling save() writes; then the rule every entry point applies.
      const std::optional<double> parsed = support::parse_double_strict(value);
      if (!parsed) {
        fail(fmt::format("hyper '{}' of group {} has the value '{}', not a finite decimal number",
                         name, g, value));
      }
      const double x = *parsed;
      try {
        check_hyper_value("load", name, static_cast<int>(g), x);
      } catch (const UsageError& e) {
        fail(e.what());
      }
      hypers[g][k] = x;
      if (!seen.insert(k).second) {
        fail(fmt::format("hyper '{}' appears twice in group {}", name, g));
      }
    }
    if (seen.size() != m.hyper_names.size()) {
      fail(fmt::format("group {} lacks some of the rule's hypers", g));
    }
  }

  const std::vector<CheckpointTensor> expected = m.checkpoint_tensors();
  std::set<std::string> names;
  for (const CheckpointTensor& e : expected) {
    names.insert(e.name);
    auto it = file.tensors.find(e.name);
    if (it == file.tensors.end()) fail(fmt::format("tensor '{}' is missing", e.name));
    const io::SafetensorsFile::Entry& entry = it->second;
    if (entry.dtype != st_dtype(e.dtype)) {
      fail(fmt::format("tensor '{}' is {}, this optimizer keeps it as {}", e.name, entry.dtype,
                       st_dtype(e.dtype)));
    }
    if (entry.shape != std::vector<std::int64_t>{e.numel}) {
      std::string shape;
      for (std::int64_t d : entry.shape) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      fail(fmt::format("tensor '{}' has shape [{}], this optimizer's has [{}]", e.name, shape,
                       e.numel));
    }
  }
  for (const auto& [name, entry] : file.tensors) {
    if (!names.count(name)) {
      fail(fmt::format("it holds tensor '{}', which this optimizer has no param or state for",
                       name));
    }
  }

  // The backend's copies wait for every queued step and land before they return.
  for (const CheckpointTensor& e : expected) {
    if (e.numel == 0) continue;
    m.backend->copy_from_host(e.data, file.tensor_data(e.name),
                              static_cast<std::size_t>(e.numel) * dtype_size(e.dtype));
  }
  m.step_count = step;
  for (auto& kernel : m.kernels) kernel->set_device_steps(step);
  m.hypers = std::move(hypers);
  m.push_hypers();
}

}  // namespace fusedopt
