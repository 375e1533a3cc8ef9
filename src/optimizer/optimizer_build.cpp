// Optimizer construction, in named steps: take the rule, validate the groups (errors name
// the tensor), make the device's backend, lay out the state arenas (one per dtype), bind
// one planned kernel per dtype binding, report.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "abi.h"
#include "compile/kernel_loader.hpp"
#include "compile/kernel_provider.hpp"
#include "exec/plan.hpp"
#include "fusedopt/error.hpp"
#include "io/json.hpp"
#include "optimizer/optimizer_impl.hpp"
#include "optimizer/pieces.hpp"
#include "optimizer/quant_states.hpp"
#include "rule_access.hpp"
#include "support/check.hpp"
#include "support/checked_math.hpp"
#include "support/log.hpp"

namespace fusedopt {

namespace runtime {

std::string describe(const ParamSlot& slot) {
  return fmt::format("group {}, param {} ('{}')", slot.group, slot.index_in_group, slot.name);
}

}  // namespace runtime

namespace {

using runtime::ParamSlot;

constexpr std::size_t kArenaAlign = 64;

std::size_t round_up(std::size_t n, std::size_t a) { return (n + a - 1) / a * a; }

/// The most bytes of state one optimizer lays out (2^56: far beyond any machine, and far
/// from where the arithmetic of the layout could overflow).
constexpr std::size_t kMaxArenaBytes = std::size_t{1} << 56;

/// `cursor` moved past `n` elements of `bytes` each, aligned; refuses a layout past
/// kMaxArenaBytes (a tensor of 2^62 elements) instead of wrapping around.
std::size_t advance(std::size_t cursor, std::size_t n, std::size_t bytes, const ParamSlot& s) {
  FUSEDOPT_CHECK_USAGE(n <= kMaxArenaBytes / bytes && cursor <= kMaxArenaBytes - n * bytes,
                       "{}: {} elements need more optimizer state than fusedopt lays out "
                       "(at most 2^56 bytes)",
                       runtime::describe(s), n);
  return round_up(cursor + n * bytes, kArenaAlign);
}

bool valid_dtype(DType d) {
  return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64;
}

/// Checks one param/grad pair on its own.
void validate_pair(const ParamSlot& s) {
  const std::string who = runtime::describe(s);
  if (!valid_dtype(s.param.dtype)) throw UsageError(who + ": param has an unsupported dtype");
  if (!valid_dtype(s.grad.dtype)) throw UsageError(who + ": grad has an unsupported dtype");
  // An fp64 binding is fp64 throughout (DTypeBinding): a float64 param, a float64 grad.
  FUSEDOPT_CHECK_USAGE((s.param.dtype == DType::F64) == (s.grad.dtype == DType::F64),
                       "{}: param is {} but grad is {} (a float64 param steps with a float64 "
                       "grad, and only it)",
                       who, to_string(s.param.dtype), to_string(s.grad.dtype));
  FUSEDOPT_CHECK_USAGE(s.param.numel >= 0, "{}: param has a negative size ({})", who,
                       s.param.numel);
  if (s.grad.numel != s.param.numel) {
    throw UsageError(
        fmt::format("{}: grad has {} elements, param has {}", who, s.grad.numel, s.param.numel));
  }
  FUSEDOPT_CHECK_USAGE(!(s.param.numel > 0 && s.param.data == nullptr),
                       "{}: param data is null ({} elements)", who, s.param.numel);
  FUSEDOPT_CHECK_USAGE(!(s.param.numel > 0 && s.grad.data == nullptr),
                       "{}: grad data is null ({} elements)", who, s.grad.numel);
  FUSEDOPT_CHECK_USAGE((s.grad.device == s.param.device), "{}: grad is on {} but param is on {}",
                       who, runtime::device_name(s.grad.device),
                       runtime::device_name(s.param.device));
  std::int64_t elements = 1;
  std::string dims;
  for (std::int64_t d : s.param.shape) {
    FUSEDOPT_CHECK_USAGE(d >= 0, "{}: param shape has a negative dimension ({})", who, d);
    elements = d == 0 || elements <= INT64_MAX / d ? elements * d : -1;
    dims += (dims.empty() ? "" : ", ") + std::to_string(d);
  }
  FUSEDOPT_CHECK_USAGE(s.param.shape.empty() || elements == s.param.numel,
                       "{}: param shape [{}] has {} elements, but numel is {}", who, dims,
                       elements < 0 ? std::string("too many") : std::to_string(elements),
                       s.param.numel);
  FUSEDOPT_CHECK_USAGE(s.grad.shape.empty() || s.grad.shape == s.param.shape,
                       "{}: grad shape differs from the param's [{}]", who, dims);
  try {
    (void)runtime::matrix_shape(s.param.shape, s.param.numel);  // rows and columns fit
  } catch (const UsageError& e) {
    throw UsageError(fmt::format("{}: param {}", who, e.what()));
  }
}

/// One tensor's bytes, for the overlap check: [begin, end) of slot `slot`'s param or grad.
struct ByteRange {
  std::uintptr_t begin = 0, end = 0;
  std::size_t slot = 0;
  bool grad = false;
  bool operator<(const ByteRange& o) const {
    return std::tie(begin, slot, grad) < std::tie(o.begin, o.slot, o.grad);
  }
};

std::vector<ByteRange> byte_ranges(const std::vector<ParamSlot>& params) {
  std::vector<ByteRange> ranges;
  ranges.reserve(2 * params.size());
  for (std::size_t p = 0; p < params.size(); ++p) {
    for (const bool grad : {false, true}) {
      const Tensor& t = grad ? params[p].grad : params[p].param;
      if (t.numel <= 0) continue;
      const auto begin = reinterpret_cast<std::uintptr_t>(t.data);
      const std::optional<std::uintptr_t> bytes = support::checked_mul(
          static_cast<std::uintptr_t>(t.numel), static_cast<std::uintptr_t>(dtype_size(t.dtype)));
      const std::optional<std::uintptr_t> end =
          bytes ? support::checked_add(begin, *bytes) : std::nullopt;
      FUSEDOPT_CHECK_USAGE(end.has_value(),
                           "{}: {} of {} elements runs past the end of the address space",
                           runtime::describe(params[p]), grad ? "grad" : "param", t.numel);
      ranges.push_back({begin, *end, p, grad});
    }
  }
  return ranges;
}

/// Refuses params and grads that share any byte (the fused kernel would race on them), in
/// O(n log n): the ranges sorted by start, each compared with the furthest-reaching range
/// before it (which also catches one range nested in a longer one). Addresses only, so host
/// and device tensors alike.
void check_no_overlap(const std::vector<ParamSlot>& params) {
  std::vector<ByteRange> ranges = byte_ranges(params);
  std::sort(ranges.begin(), ranges.end());
  const ByteRange* reach = nullptr;
  for (const ByteRange& r : ranges) {
    if (reach && r.begin < reach->end) {
      throw UsageError(fmt::format(
          "{}: {} overlaps the {} of {} in memory (params and grads must not share any byte)",
          runtime::describe(params[r.slot]), r.grad ? "grad" : "param",
          reach->grad ? "grad" : "param", runtime::describe(params[reach->slot])));
    }
    if (!reach || r.end > reach->end) reach = &r;
  }
}

/// Refuses a param name a checkpoint cannot carry (names key checkpoints): not UTF-8 (the
/// header is JSON), or holding a control character (the params table that fusedopt-ckpt
/// and the sharded checkpoints cut files by is one "name<TAB>numel<TAB>dtype" line each).
void check_param_name(const ParamSlot& s) {
  std::string shown;  // the name with its control and non-UTF-8 bytes escaped
  const bool utf8 = io::is_valid_utf8(s.name);
  const char* bad = nullptr;
  for (unsigned char c : s.name) {
    const bool control = c < 0x20 || c == 0x7f;
    if (control && !bad)
      bad = c == '\t' ? "a tab" : c == '\n' ? "a newline" : "a control character";
    shown += control || (!utf8 && c >= 0x80) ? fmt::format("\\x{:02x}", c) : std::string(1, c);
  }
  if (utf8 && !bad) return;
  throw UsageError(fmt::format(
      "group {}, param {} ('{}'): the name {}, which a checkpoint cannot carry (names key "
      "checkpoints: they must be UTF-8 without control characters)",
      s.group, s.index_in_group, shown,
      utf8 ? fmt::format("holds {}", bad) : std::string("is not valid UTF-8")));
}

}  // namespace

Optimizer::Optimizer(const Rule& rule, std::vector<ParamGroup> groups, OptimizerOptions options)
    : impl_(Impl::build(rule, std::move(groups), options, {})) {}

Optimizer::Optimizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

std::unique_ptr<Optimizer::Impl> Optimizer::Impl::build(const Rule& user_rule,
                                                        std::vector<ParamGroup> groups,
                                                        const OptimizerOptions& options,
                                                        std::vector<PieceOrigin> origins) {
  auto impl = std::make_unique<Impl>(user_rule);
  Impl& m = *impl;
  m.options = options;
  m.origins = std::move(origins);
  m.take_rule(user_rule);
  m.validate_groups(groups);
  try {
    m.backend = runtime::make_backend(m.device);
  } catch (const UnavailableError& e) {
    throw UnavailableError(fmt::format("{}: param is on {} but {}",
                                       runtime::describe(m.params.front()),
                                       runtime::device_name(m.device), e.what()));
  }
  m.lay_out_arenas();
  m.bind_kernels();
  m.report();
  return impl;
}

void Optimizer::Impl::take_rule(const Rule& user_rule) {
  check_options(options);
  if (options.max_grad_norm > 0.0) rule = user_rule.with_grad_clipping(options.max_grad_norm);
  const lang::Rule& r = detail::lang_rule(rule);
  reduction_passes = r.reduction_passes;
  for (int s : r.states) state_names.push_back(r.symbols[s].name);
  num_states = state_names.size();
  for (int s : r.outputs) state_names.push_back(r.symbols[s].name);
  for (int s : r.scalars) scalar_names.push_back(r.symbols[s].name);
  for (int s : r.row_states) row_names.push_back(r.symbols[s].name);
  for (int s : r.col_states) col_names.push_back(r.symbols[s].name);
  for (int h : r.hypers) hyper_names.push_back(r.symbols[h].name);
  using K = runtime::StateSpec::Kind;
  auto add = [&](K kind, const std::vector<std::string>& names, std::size_t first, std::size_t end,
                 DType dtype) {
    for (std::size_t k = first; k < end; ++k) specs.push_back({kind, names[k], dtype, k - first});
  };
  quant = runtime::resolve_quant(options, r, &quant_sr);
  add(K::Element, state_names, 0, num_states, options.state_dtype);
  for (std::size_t k = 0; k < num_states; ++k) specs[k].quant = quant[k];
  add(K::Output, state_names, num_states, state_names.size(), options.state_dtype);
  add(K::Scalar, scalar_names, 0, scalar_names.size(), DType::F64);
  add(K::Row, row_names, 0, row_names.size(), DType::F32);
  add(K::Col, col_names, 0, col_names.size(), DType::F32);
  if (options.master_weights) specs.push_back({K::Master, "master", DType::F32, 0});
  for (std::size_t k = 0; k < num_states; ++k) {
    if (quant[k] != Quant::None) {
      specs.push_back({K::Absmax, state_names[k] + ".absmax", DType::F32, k, quant[k]});
    }
  }
}

void Optimizer::Impl::validate_groups(std::vector<ParamGroup>& groups) {
  if (groups.empty()) throw UsageError("Optimizer: no param groups given");
  std::vector<double> defaults;
  for (const auto& [name, value] : rule.hypers()) defaults.push_back(value);
  std::map<std::string, std::size_t> by_name;
  std::map<const void*, std::size_t> by_data;
  for (std::size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& group = groups[g];
    if (group.params.size() != group.grads.size()) {
      throw UsageError(
          fmt::format("group {}: {} params but {} grads (every param needs its grad, in "
                      "the same order)",
                      g, group.params.size(), group.grads.size()));
    }
    hypers.push_back(defaults);
    std::set<std::size_t> given;
    for (const auto& [name, value] : group.hypers) {
      std::size_t k = 0;
      try {
        k = hyper_index(name);
      } catch (const Error& e) {
        throw UsageError(fmt::format("group {}: {}", g, e.what()));
      }
      FUSEDOPT_CHECK_USAGE(given.insert(k).second,
                           "group {}: hyper '{}' is given twice (which one should win?)", g, name);
      check_hyper_value("Optimizer", name, static_cast<int>(g), value);
      hypers[g][k] = value;
    }
    for (std::size_t i = 0; i < group.params.size(); ++i) {
      ParamSlot s;
      s.group = static_cast<int>(g);
      s.index_in_group = static_cast<int>(i);
      s.param = group.params[i];
      s.grad = group.grads[i];
      s.name = s.param.name.empty() ? fmt::format("param{}", params.size()) : s.param.name;
      runtime::infer_piece_shape(s.param);
      validate_pair(s);
      runtime::validate_piece(s.param, runtime::describe(s));
      pieces = pieces || !s.param.whole_shape.empty();
      check_param_name(s);
      const std::string who = runtime::describe(s);
      const auto [same_name, fresh_name] = by_name.emplace(s.name, params.size());
      FUSEDOPT_CHECK_USAGE(fresh_name, "{}: the name is already used by {} (names key checkpoints)",
                           who, runtime::describe(params[same_name->second]));
      if (s.param.numel > 0) {
        const auto [same_data, fresh_data] = by_data.emplace(s.param.data, params.size());
        FUSEDOPT_CHECK_USAGE(fresh_data, "{}: the same memory as {} (a param may appear only once)",
                             who, runtime::describe(params[same_data->second]));
      }
      if (!params.empty() && !(s.param.device == params.front().param.device)) {
        throw UsageError(
            fmt::format("{}: param is on {} but {} is on {} (one optimizer, one device)", who,
                        runtime::device_name(s.param.device), runtime::describe(params.front()),
                        runtime::device_name(params.front().param.device)));
      }
      params.push_back(std::move(s));
    }
  }
  if (params.empty()) throw UsageError("Optimizer: the param groups hold no parameters");
  check_no_overlap(params);
  device = params.front().param.device;
}

void Optimizer::Impl::lay_out_arenas() {
  // Bindings (first-seen order) and arena layout: states and outputs in state_dtype, the
  // master copies in fp32 (sharing the fp32 arena when the states are fp32 too).
  std::map<DType, std::size_t> arena_bytes;
  std::vector<std::vector<std::size_t>> offsets(params.size());  // per state, then master
  for (std::size_t p = 0; p < params.size(); ++p) {
    ParamSlot& s = params[p];
    s.states.assign(state_names.size(), nullptr);
    // With pieces every param binds, in param order: the same bindings on every rank.
    if (s.param.numel == 0 && !pieces) continue;
    const DTypeBinding b = binding_of(p);
    auto it = std::find(bindings.begin(), bindings.end(), b);
    s.binding = static_cast<int>(it - bindings.begin());
    if (it == bindings.end()) bindings.push_back(b);
    if (s.param.numel == 0) continue;
    const auto n = static_cast<std::size_t>(s.param.numel);
    for (std::size_t k = 0; k < state_names.size(); ++k) {
      // A quantized state's codes and absmax are one piece of bytes (abi.h's layout).
      const Quant q = k < b.quant.size() ? b.quant[k] : Quant::None;
      std::size_t& cursor = arena_bytes[q != Quant::None ? DType::U8 : b.state];
      offsets[p].push_back(cursor);
      cursor = q != Quant::None ? advance(cursor,
                                          static_cast<std::size_t>(
                                              fo_q_bytes(s.param.numel, quant_bits(q), b.block())),
                                          1, s)
                                : advance(cursor, n, dtype_size(b.state), s);
    }
    if (b.master) {
      std::size_t& cursor = arena_bytes[DType::F32];
      offsets[p].push_back(cursor);
      cursor = advance(cursor, n, 4, s);
    }
  }
  // Scalar states count steps, not elements: an empty tensor keeps them too, stepped by a
  // kernel of its own binding, else by the first one (no code runs on its elements), so
  // no kernel is built for empty tensors alone unless every tensor is empty.
  if (!scalar_names.empty() || !row_names.empty() || !col_names.empty()) {
    for (std::size_t p = 0; p < params.size(); ++p) {
      ParamSlot& s = params[p];
      if (s.param.numel > 0 || s.binding >= 0) continue;
      const DTypeBinding b = binding_of(p);
      auto it = std::find(bindings.begin(), bindings.end(), b);
      if (it == bindings.end() && !bindings.empty()) it = bindings.begin();
      s.binding = static_cast<int>(it - bindings.begin());
      if (it == bindings.end()) bindings.push_back(b);
    }
  }
  // Checkpoints name the master copy "<param>/master": a state of that name would collide.
  const bool any_master =
      std::any_of(bindings.begin(), bindings.end(), [](const DTypeBinding& b) { return b.master; });
  if (any_master &&
      std::find(state_names.begin(), state_names.end(), "master") != state_names.end()) {
    throw UsageError(
        fmt::format("Optimizer: rule '{}' has a state called 'master', which is the name "
                    "of the fp32 master copy in checkpoints; rename the state or turn "
                    "off master_weights",
                    rule.name()));
  }
  std::map<DType, std::byte*> base;
  for (const auto& [dtype, bytes] : arena_bytes) {
    runtime::Arena a;
    a.dtype = dtype;
    a.bytes = bytes;
    a.memory = backend->allocate(bytes);  // zeroed, so unused padding is defined
    base[dtype] = a.memory.bytes_data();
    arenas.push_back(std::move(a));
  }
  for (std::size_t p = 0; p < params.size(); ++p) {
    ParamSlot& s = params[p];
    if (s.binding < 0 || s.param.numel == 0) continue;
    const DTypeBinding& b = bindings[static_cast<std::size_t>(s.binding)];
    for (std::size_t k = 0; k < state_names.size(); ++k) {
      const bool q = k < b.quant.size() && b.quant[k] != Quant::None;
      s.states[k] = base[q ? DType::U8 : b.state] + offsets[p][k];
    }
    if (bindings[static_cast<std::size_t>(s.binding)].master) {
      s.master = base[DType::F32] + offsets[p].back();
    }
  }
}

void Optimizer::Impl::bind_kernels() {
  std::vector<runtime::BindingTensors> tensors = binding_tensors();
  lay_out_scalars(tensors);
  lay_out_rc_states(tensors);
  const std::vector<std::vector<double>> h = hyper_values();
  for (const runtime::BindingTensors& t : tensors) {
    kernels.push_back(std::make_unique<runtime::Binding>(
        *backend,
        runtime::load_kernel(*backend, RuleAccess::impl(rule), t.dtypes, t.strategy,
                             provider::cache_at({})),
        t, h));
  }
  lay_out_shard();
  for (auto& kernel : kernels) kernel->init_states();
  steps_taken = backend->allocate(sizeof(double));  // zeroed: no step taken
  // The grad check rides on pass 0 (one read of the gradient for the unscale, the check and
  // any norm) unless a pass 0 writes (the Store strategy with one reduction pass): the skip
  // must be known before anything is written.
  fold_check = true;
  for (const auto& kernel : kernels) fold_check = fold_check && kernel->layout().store_pass != 0;
  compile_programs();
}

std::vector<runtime::BindingTensors> Optimizer::Impl::binding_tensors() {
  // The global reduction totals: one row shared by every binding's kernel. Its last slot
  // is the grad check, which capturable steps also use as the device-side skip flag and
  // which a step_scaled's separate check hands to the reduction hook (every rule has it).
  {
    const auto slots = static_cast<std::size_t>(detail::lang_rule(rule).num_global_reductions) + 1;
    global_totals = backend->allocate(slots * sizeof(double));
  }
  std::vector<runtime::BindingTensors> tensors(bindings.size());
  binding_params.assign(bindings.size(), {});
  for (std::size_t b = 0; b < bindings.size(); ++b) {
    tensors[b].dtypes = bindings[b];
    tensors[b].global_totals = global_totals.data();
    tensors[b].strategy = options.reduction_strategy;
    tensors[b].seed = options.seed;
  }
  for (std::size_t p = 0; p < params.size(); ++p) {
    const ParamSlot& s = params[p];
    if (s.binding < 0) continue;
    const auto b = static_cast<std::size_t>(s.binding);
    runtime::BindingTensors& t = tensors[b];
    t.numel.push_back(s.param.numel);
    t.group.push_back(s.group);
    t.shapes.push_back(s.param.shape);
    t.names.push_back(runtime::describe(s));
    // The random numbers' key: the param's index here (a ShardedOptimizer's local optimizer
    // gives each piece its param's index and offset instead: OptimizerExtension::make; a
    // dim-0 piece its first element in the whole tensor).
    const bool given = p < origins.size();
    t.ids.push_back(given ? origins[p].param : static_cast<long long>(p));
    t.ids.push_back(given ? origins[p].offset : runtime::piece_offset(s.param));
    binding_params[b].push_back(static_cast<int>(p));
    if (pieces) {
      // The built-ins read the whole tensor's shape; a 1-D or 2-D piece's column and
      // matrix sums span pieces.
      runtime::append_whole_info(s.param, t.whole_info);
      t.spans.push_back(runtime::spans_pieces(s.param) && RuleAccess::impl(rule)->factored());
    }
  }
  for (std::size_t b = 0; b < bindings.size(); ++b) tensors[b].ptrs = binding_ptrs(b);
  return tensors;
}

void Optimizer::Impl::lay_out_scalars(std::vector<runtime::BindingTensors>& tensors) {
  // Scalar states: one row of doubles per tensor, each binding's tensors adjacent, in one
  // allocation of the device (zeroed; the kernels write the initial values).
  if (scalar_names.empty()) return;
  const std::size_t per = scalar_names.size();
  std::size_t rows = 0;
  for (const auto& t : tensors) rows += t.numel.size();
  scalars = backend->allocate(rows * per * sizeof(double));
  auto* base = static_cast<double*>(scalars.data());
  std::size_t first = 0;
  for (std::size_t b = 0; b < tensors.size(); ++b) {
    tensors[b].scalars = base + first * per;
    for (std::size_t i = 0; i < binding_params[b].size(); ++i) {
      params[static_cast<std::size_t>(binding_params[b][i])].scalars = base + (first + i) * per;
    }
    first += tensors[b].numel.size();
  }
}

void Optimizer::Impl::lay_out_rc_states(std::vector<runtime::BindingTensors>& tensors) {
  // Row and column states: per binding, state-major ([k][row of the binding]), fp32.
  if (row_names.empty() && col_names.empty()) return;
  const auto nr = static_cast<std::int64_t>(row_names.size());
  const auto nc = static_cast<std::int64_t>(col_names.size());
  std::vector<std::int64_t> rows(tensors.size(), 0), cols(tensors.size(), 0);
  for (std::size_t b = 0; b < tensors.size(); ++b) {
    for (int p : binding_params[b]) {
      ParamSlot& s = params[static_cast<std::size_t>(p)];
      const runtime::MatrixShape m = runtime::matrix_shape(s.param.shape, s.param.numel);
      s.row_first = rows[b];
      s.col_first = cols[b];
      s.row_count = m.batch * m.rows;  // fits: checked with the param's shape
      s.col_count = m.batch * m.cols;
      const std::optional<std::int64_t> r = support::checked_add(rows[b], s.row_count);
      const std::optional<std::int64_t> c = support::checked_add(cols[b], s.col_count);
      FUSEDOPT_CHECK_USAGE(r && c,
                           "{}: the rows and columns of the params up to it overflow 64 bits "
                           "(their row and column states could not be laid out)",
                           runtime::describe(s));
      rows[b] = *r;
      cols[b] = *c;
    }
  }
  std::int64_t total = 0;
  for (std::size_t b = 0; b < tensors.size(); ++b) total += rows[b] * nr + cols[b] * nc;
  rc_states = backend->allocate(static_cast<std::size_t>(total) * sizeof(float));
  auto* at = static_cast<float*>(rc_states.data());
  for (std::size_t b = 0; b < tensors.size(); ++b) {
    tensors[b].row_states = at;
    tensors[b].col_states = at + rows[b] * nr;
    for (int p : binding_params[b]) {
      ParamSlot& s = params[static_cast<std::size_t>(p)];
      s.row_base = at;
      s.row_stride = rows[b];
      s.col_base = at + rows[b] * nr;
      s.col_stride = cols[b];
    }
    at += rows[b] * nr + cols[b] * nc;
  }
}

std::vector<std::vector<void*>> Optimizer::Impl::binding_ptrs(std::size_t b) const {
  std::vector<std::vector<void*>> out;
  out.reserve(binding_params[b].size());
  for (int p : binding_params[b]) {
    const ParamSlot& s = params[static_cast<std::size_t>(p)];
    std::vector<void*> ptrs = {s.param.data, s.grad.data};
    ptrs.insert(ptrs.end(), s.states.begin(), s.states.end());
    if (bindings[b].master) ptrs.push_back(s.master);  // null for an empty tensor
    out.push_back(std::move(ptrs));
  }
  return out;
}

void Optimizer::rebind(const std::vector<void*>& param_data, const std::vector<void*>& grad_data,
                       void* stream) {
  Impl& m = live("rebind");
  Impl::Exclusive hold(m, "rebind");
  const std::size_t n = m.params.size();
  for (const auto* list : {&param_data, &grad_data}) {
    FUSEDOPT_CHECK_USAGE(list->empty() || list->size() == n,
                         "Optimizer::rebind: {} {} pointers for {} params (give one per param, "
                         "or none)",
                         list->size(), list == &param_data ? "param" : "grad", n);
  }
  // The new pointers in place (each old one kept), checked, then handed to the kernels; any
  // refusal puts the old ones back.
  std::vector<std::pair<Tensor*, void*>> old;
  for (std::size_t p = 0; p < n; ++p) {
    for (const bool grad : {false, true}) {
      const std::vector<void*>& list = grad ? grad_data : param_data;
      Tensor& t = grad ? m.params[p].grad : m.params[p].param;
      if (list.empty() || list[p] == nullptr || list[p] == t.data) continue;
      old.emplace_back(&t, t.data);
      t.data = list[p];
    }
  }
  if (old.empty()) return;
  auto restore = [&] {
    for (const auto& [t, data] : old) t->data = data;
  };
  try {
    check_no_overlap(m.params);
  } catch (...) {
    restore();
    throw;
  }
  try {
    for (std::size_t b = 0; b < m.kernels.size(); ++b) {
      m.kernels[b]->rebind(m.binding_ptrs(b), stream);
    }
  } catch (...) {
    // A kernel refused (a host pointer for a CUDA optimizer): back to the old pointers.
    restore();
    for (std::size_t b = 0; b < m.kernels.size(); ++b) {
      m.kernels[b]->rebind(m.binding_ptrs(b), stream);
    }
    throw;
  }
}

}  // namespace fusedopt
