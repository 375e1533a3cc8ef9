// The optimizer's state store (state_store.hpp): the states of the rule, each param's
// binding, and their memory laid out in arenas, scalar, row and column states.
#include "optimizer/state_store.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>

#include "abi.h"
#include "exec/plan.hpp"
#include "fusedopt/error.hpp"
#include "optimizer/pieces.hpp"
#include "optimizer/quant_states.hpp"
#include "rule_access.hpp"
#include "support/check.hpp"
#include "support/checked_math.hpp"

namespace fusedopt::runtime {

namespace {

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

}  // namespace

StateStore::StateStore(const Rule& rule, const OptimizerOptions& options)
    : rule_name_(rule.name()), factored_(RuleAccess::impl(rule)->factored()), options_(options) {
  const lang::Rule& r = detail::lang_rule(rule);
  for (int s : r.states) state_names_.push_back(r.symbols[s].name);
  num_states_ = state_names_.size();
  for (int s : r.outputs) state_names_.push_back(r.symbols[s].name);
  for (int s : r.scalars) scalar_names_.push_back(r.symbols[s].name);
  for (int s : r.row_states) row_names_.push_back(r.symbols[s].name);
  for (int s : r.col_states) col_names_.push_back(r.symbols[s].name);
  using K = StateSpec::Kind;
  auto add = [&](K kind, const std::vector<std::string>& names, std::size_t first, std::size_t end,
                 DType dtype) {
    for (std::size_t k = first; k < end; ++k) specs_.push_back({kind, names[k], dtype, k - first});
  };
  quant_ = resolve_quant(options, r, &quant_sr_);
  add(K::Element, state_names_, 0, num_states_, options.state_dtype);
  for (std::size_t k = 0; k < num_states_; ++k) specs_[k].quant = quant_[k];
  add(K::Output, state_names_, num_states_, state_names_.size(), options.state_dtype);
  add(K::Scalar, scalar_names_, 0, scalar_names_.size(), DType::F64);
  add(K::Row, row_names_, 0, row_names_.size(), DType::F32);
  add(K::Col, col_names_, 0, col_names_.size(), DType::F32);
  if (options.master_weights) specs_.push_back({K::Master, "master", DType::F32, 0});
  for (std::size_t k = 0; k < num_states_; ++k) {
    if (quant_[k] != Quant::None) {
      specs_.push_back({K::Absmax, state_names_[k] + ".absmax", DType::F32, k, quant_[k]});
    }
  }
}

void StateStore::take_params(std::vector<ParamSlot> params, std::vector<PieceOrigin> origins) {
  params_ = std::move(params);
  origins_ = std::move(origins);
  pieces_ = std::any_of(params_.begin(), params_.end(),
                        [](const ParamSlot& s) { return !s.param.whole_shape.empty(); });
}

void StateStore::lay_out(Backend& backend) { lay_out_arenas(backend); }

void StateStore::lay_out_arenas(Backend& backend) {
  // Bindings (first-seen order) and arena layout: states and outputs in state_dtype, the
  // master copies in fp32 (sharing the fp32 arena when the states are fp32 too).
  std::map<DType, std::size_t> arena_bytes;
  std::vector<std::vector<std::size_t>> offsets(params_.size());  // per state, then master
  for (std::size_t p = 0; p < params_.size(); ++p) {
    ParamSlot& s = params_[p];
    s.states.assign(state_names_.size(), nullptr);
    // With pieces every param binds, in param order: the same bindings on every rank.
    if (s.param.numel == 0 && !pieces_) continue;
    const DTypeBinding b = binding_of(p);
    auto it = std::find(bindings_.begin(), bindings_.end(), b);
    s.binding = static_cast<int>(it - bindings_.begin());
    if (it == bindings_.end()) bindings_.push_back(b);
    if (s.param.numel == 0) continue;
    const auto n = static_cast<std::size_t>(s.param.numel);
    for (std::size_t k = 0; k < state_names_.size(); ++k) {
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
  if (!scalar_names_.empty() || !row_names_.empty() || !col_names_.empty()) {
    for (std::size_t p = 0; p < params_.size(); ++p) {
      ParamSlot& s = params_[p];
      if (s.param.numel > 0 || s.binding >= 0) continue;
      const DTypeBinding b = binding_of(p);
      auto it = std::find(bindings_.begin(), bindings_.end(), b);
      if (it == bindings_.end() && !bindings_.empty()) it = bindings_.begin();
      s.binding = static_cast<int>(it - bindings_.begin());
      if (it == bindings_.end()) bindings_.push_back(b);
    }
  }
  // Checkpoints name the master copy "<param>/master": a state of that name would collide.
  const bool any_master = std::any_of(bindings_.begin(), bindings_.end(),
                                      [](const DTypeBinding& b) { return b.master; });
  if (any_master &&
      std::find(state_names_.begin(), state_names_.end(), "master") != state_names_.end()) {
    throw UsageError(
        fmt::format("Optimizer: rule '{}' has a state called 'master', which is the name "
                    "of the fp32 master copy in checkpoints; rename the state or turn "
                    "off master_weights",
                    rule_name_));
  }
  std::map<DType, std::byte*> base;
  for (const auto& [dtype, bytes] : arena_bytes) {
    Arena a;
    a.dtype = dtype;
    a.bytes = bytes;
    a.memory = backend.allocate(bytes);  // zeroed, so unused padding is defined
    base[dtype] = a.memory.bytes_data();
    arenas_.push_back(std::move(a));
  }
  for (std::size_t p = 0; p < params_.size(); ++p) {
    ParamSlot& s = params_[p];
    if (s.binding < 0 || s.param.numel == 0) continue;
    const DTypeBinding& b = bindings_[static_cast<std::size_t>(s.binding)];
    for (std::size_t k = 0; k < state_names_.size(); ++k) {
      const bool q = k < b.quant.size() && b.quant[k] != Quant::None;
      s.states[k] = base[q ? DType::U8 : b.state] + offsets[p][k];
    }
    if (bindings_[static_cast<std::size_t>(s.binding)].master) {
      s.master = base[DType::F32] + offsets[p].back();
    }
  }
}

std::vector<BindingTensors> StateStore::binding_tensors(Backend& backend, void* global_totals) {
  std::vector<BindingTensors> tensors(bindings_.size());
  binding_params_.assign(bindings_.size(), {});
  for (std::size_t b = 0; b < bindings_.size(); ++b) {
    tensors[b].dtypes = bindings_[b];
    tensors[b].global_totals = global_totals;
    tensors[b].strategy = options_.reduction_strategy;
    tensors[b].seed = options_.seed;
    tensors[b].stage_bf16 = options_.matrix_precision == DType::BF16;
  }
  const bool shaped_any = std::any_of(origins_.begin(), origins_.end(),
                                      [](const PieceOrigin& o) { return !o.shape.empty(); });
  for (std::size_t p = 0; p < params_.size(); ++p) {
    const ParamSlot& s = params_[p];
    if (s.binding < 0) continue;
    const auto b = static_cast<std::size_t>(s.binding);
    BindingTensors& t = tensors[b];
    t.numel.push_back(s.param.numel);
    t.group.push_back(s.group);
    t.shapes.push_back(s.param.shape);
    const bool given = p < origins_.size();
    const bool shaped_origin = given && !origins_[p].shape.empty();
    t.whole_shapes.push_back(shaped_origin                 ? origins_[p].shape
                             : s.param.whole_shape.empty() ? s.param.shape
                                                           : s.param.whole_shape);
    t.names.push_back(describe(s));
    // The random numbers' key: the param's index here (a ShardedOptimizer's local optimizer
    // gives each piece its param's index and offset instead: OptimizerExtension::make; a
    // dim-0 piece its first element in the whole tensor).
    t.ids.push_back(given ? origins_[p].param : static_cast<long long>(p));
    t.ids.push_back(given ? origins_[p].offset : piece_offset(s.param));
    binding_params_[b].push_back(static_cast<int>(p));
    if (pieces_) {
      // The built-ins read the whole tensor's shape; a 1-D or 2-D piece's column and
      // matrix sums span pieces.
      append_whole_info(s.param, t.whole_info);
      t.spans.push_back(spans_pieces(s.param) && factored_);
    } else if (shaped_any) {
      // Element ranges of shaped params (a ShardedOptimizer's): the built-ins read the
      // whole param's shape (a range of a param without one: 1-D of the whole param's numel).
      Tensor whole = s.param;
      if (given) whole.numel = origins_[p].numel;
      if (shaped_origin) whole.whole_shape = origins_[p].shape;
      append_whole_info(whole, t.whole_info);
    }
  }
  for (std::size_t b = 0; b < bindings_.size(); ++b) tensors[b].ptrs = binding_ptrs(b);
  lay_out_scalars(backend, tensors);
  lay_out_rc_states(backend, tensors);
  return tensors;
}

void StateStore::lay_out_scalars(Backend& backend, std::vector<BindingTensors>& tensors) {
  // Scalar states: one row of doubles per tensor, each binding's tensors adjacent, in one
  // allocation of the device (zeroed; the kernels write the initial values).
  if (scalar_names_.empty()) return;
  const std::size_t per = scalar_names_.size();
  std::size_t rows = 0;
  for (const auto& t : tensors) rows += t.numel.size();
  scalars_ = backend.allocate(rows * per * sizeof(double));
  auto* base = static_cast<double*>(scalars_.data());
  std::size_t first = 0;
  for (std::size_t b = 0; b < tensors.size(); ++b) {
    tensors[b].scalars = base + first * per;
    for (std::size_t i = 0; i < binding_params_[b].size(); ++i) {
      params_[static_cast<std::size_t>(binding_params_[b][i])].scalars = base + (first + i) * per;
    }
    first += tensors[b].numel.size();
  }
}

void StateStore::lay_out_rc_states(Backend& backend, std::vector<BindingTensors>& tensors) {
  // Row and column states: per binding, state-major ([k][row of the binding]), fp32.
  if (row_names_.empty() && col_names_.empty()) return;
  const auto nr = static_cast<std::int64_t>(row_names_.size());
  const auto nc = static_cast<std::int64_t>(col_names_.size());
  std::vector<std::int64_t> rows(tensors.size(), 0), cols(tensors.size(), 0);
  for (std::size_t b = 0; b < tensors.size(); ++b) {
    for (int p : binding_params_[b]) {
      ParamSlot& s = params_[static_cast<std::size_t>(p)];
      const MatrixShape m = matrix_shape(s.param.shape, s.param.numel);
      s.rows.first = rows[b];
      s.cols.first = cols[b];
      s.rows.count = m.batch * m.rows;  // fits: checked with the param's shape
      s.cols.count = m.batch * m.cols;
      const std::optional<std::int64_t> r = support::checked_add(rows[b], s.rows.count);
      const std::optional<std::int64_t> c = support::checked_add(cols[b], s.cols.count);
      FUSEDOPT_CHECK_USAGE(r && c,
                           "{}: the rows and columns of the params up to it overflow 64 bits "
                           "(their row and column states could not be laid out)",
                           describe(s));
      rows[b] = *r;
      cols[b] = *c;
    }
  }
  std::int64_t total = 0;
  for (std::size_t b = 0; b < tensors.size(); ++b) total += rows[b] * nr + cols[b] * nc;
  rc_states_ = backend.allocate(static_cast<std::size_t>(total) * sizeof(float));
  auto* at = static_cast<float*>(rc_states_.data());
  for (std::size_t b = 0; b < tensors.size(); ++b) {
    tensors[b].row_states = at;
    tensors[b].col_states = at + rows[b] * nr;
    for (int p : binding_params_[b]) {
      ParamSlot& s = params_[static_cast<std::size_t>(p)];
      s.rows.base = at;
      s.rows.stride = rows[b];
      s.cols.base = at + rows[b] * nr;
      s.cols.stride = cols[b];
    }
    at += rows[b] * nr + cols[b] * nc;
  }
}

std::vector<std::vector<void*>> StateStore::binding_ptrs(std::size_t b) const {
  return role_pointers(params_, binding_params_[b], bindings_[b].master);
}

std::size_t StateStore::bytes() const {
  std::size_t n = scalars_.size() + rc_states_.size();
  for (const Arena& a : arenas_) n += a.bytes;
  return n;
}

}  // namespace fusedopt::runtime
