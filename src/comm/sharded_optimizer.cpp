// ShardedOptimizer: ZeRO-1/2 over the public Optimizer. Each dtype's parameters, laid end to
// end in parameter order, are cut into W equal contiguous shards (shard_layout.hpp); rank r's
// fused optimizer runs over views of the pieces in its shard. Gradients are reduced by a
// GradBucketer (all-reduce for ZeRO-1; for ZeRO-2 buckets cut at shard boundaries, each
// reduced to its owner), the reduction hook combines the optimizer's totals across ranks in
// float64, and the owners broadcast their updated pieces in buckets. Checkpoints:
// sharded_checkpoint.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <utility>

#include "sharded_impl.hpp"
#include "support/check.hpp"

namespace fusedopt::comm {

using detail::cut_into_shards;
using detail::slice;

namespace {

/// UsageError for a rule whose states belong to whole tensors (not sharded yet).
void check_shardable(const Rule& rule);

std::string where(const Device& d) {
  return d.kind == Device::Kind::Cuda ? fmt::format("cuda:{}", d.index) : std::string("host");
}

/// Per param: the multiple of elements its pieces begin on, its states' quantization block
/// where they are quantized (as Optimizer decides: quant_min_numel), else 1; empty when no
/// state is quantized.
std::vector<std::int64_t> block_alignment(const Rule& rule, const OptimizerOptions& options,
                                          const std::vector<Tensor>& params) {
  DTypeBinding b;
  b.quant = resolve_state_storage(rule, options);  // UsageError for bad storage options
  b.quant_block = options.quant_block;
  if (!b.quantized()) return {};
  std::vector<std::int64_t> align;
  for (const Tensor& p : params)
    align.push_back(p.numel > 0 && p.numel >= options.quant_min_numel ? b.block() : 1);
  return align;
}

std::string millions(std::int64_t n) {
  return n >= 100000 ? fmt::format("{:.1f} M", static_cast<double>(n) / 1e6) : fmt::format("{}", n);
}

}  // namespace

ShardedOptimizer::ShardedOptimizer(Communicator comm, const Rule& rule,
                                   std::vector<ParamGroup> groups, ShardOptions options)
    : impl_(std::make_unique<Impl>(std::move(comm))) {
  Impl& m = *impl_;
  m.options = options;
  m.rank = m.comm.rank();
  m.ranks = m.comm.size();
  FUSEDOPT_CHECK_USAGE(options.stage == 1 || options.stage == 2,
                       "ShardedOptimizer: stage {} is neither 1 (ZeRO-1) nor 2 (ZeRO-2)",
                       options.stage);
  FUSEDOPT_CHECK_USAGE(!groups.empty(), "ShardedOptimizer: no param groups given");
  check_shardable(rule);
  m.take_params(groups);
  if (rule.matrix_stages() > 0) m.assign_matrix_owners(rule);
  {
    std::vector<std::pair<std::int64_t, DType>> sizes;
    for (const Tensor& p : m.params) sizes.emplace_back(p.numel, p.dtype);
    // UsageError for a dtype with too few elements, or a rank left without any.
    m.cut = cut_into_shards(sizes, m.ranks, block_alignment(rule, options.optimizer, m.params));
  }
  // The parameters' layout must be one buffer per dtype in parameter order, as for the
  // gradients: the broadcasts are ranges of it (this throws UsageError naming the param).
  (void)detail::bucket_layout(m.params, options.buckets, {});
  m.comm.check_same("ShardedOptimizer plan", m.plan_fingerprint(rule, groups));
  m.build_local(rule, groups);
  m.build_reducer();
  m.build_gather();
}

namespace {

void check_shardable(const Rule& rule) {
  if (rule.scalars().empty() && rule.row_states().empty() && rule.col_states().empty()) return;
  std::string names;
  for (const auto& list : {rule.scalars(), rule.row_states(), rule.col_states()}) {
    for (const std::string& s : list) names += (names.empty() ? "" : ", ") + s;
  }
  throw UsageError(fmt::format(
      "ShardedOptimizer: rule '{}' keeps per-tensor scalar or row/column states ({}), "
      "which are not sharded yet (a shard holds a slice of a tensor; those states belong "
      "to the whole tensor): use Optimizer for this rule",
      rule.name(), names));
}

}  // namespace

void ShardedOptimizer::Impl::take_params(const std::vector<ParamGroup>& groups) {
  for (std::size_t g = 0; g < groups.size(); ++g) {
    FUSEDOPT_CHECK_USAGE(groups[g].params.size() == groups[g].grads.size(),
                         "ShardedOptimizer: group {} has {} params but {} grads", g,
                         groups[g].params.size(), groups[g].grads.size());
    for (std::size_t k = 0; k < groups[g].params.size(); ++k) {
      Tensor p = groups[g].params[k];
      const Tensor& gr = groups[g].grads[k];
      const std::size_t i = params.size();
      if (p.name.empty()) p.name = fmt::format("param{}", i);
      FUSEDOPT_CHECK_USAGE(gr.numel == p.numel && gr.dtype == p.dtype,
                           "ShardedOptimizer: param {} ('{}'): its grad has {} x {}, the param "
                           "{} x {}",
                           i, p.name, gr.numel, to_string(gr.dtype), p.numel, to_string(p.dtype));
      FUSEDOPT_CHECK_USAGE(p.numel >= 0, "ShardedOptimizer: param {} ('{}') has {} elements", i,
                           p.name, p.numel);
      FUSEDOPT_CHECK_USAGE(p.device == comm.device() && gr.device == comm.device(),
                           "ShardedOptimizer: param {} ('{}') and its grad live on {} and {}; the "
                           "{} communicator reduces memory of {}",
                           i, p.name, where(p.device), where(gr.device), comm.backend(),
                           where(comm.device()));
      total[p.dtype] += p.numel;
      param_group.push_back(static_cast<int>(g));
      params.push_back(p);
      grads.push_back(gr);
    }
  }
}

// Every rank must cut and step the same way: the rule (its text, by hash), the options,
// every group's hypers (defaults resolved: a value given or defaulted reads the same), and
// every param's name, size, shape and dtypes. A rank that differs in any of them (another
// name, lr=0.5 in one group) fails on every rank, naming the first difference.
std::string ShardedOptimizer::Impl::plan_fingerprint(const Rule& rule,
                                                     const std::vector<ParamGroup>& groups) const {
  const OptimizerOptions& o = options.optimizer;
  std::string storage;
  std::uint64_t sr = 0;
  const std::vector<Quant> quant = resolve_state_storage(rule, o, &sr);
  for (std::size_t k = 0; k < quant.size(); ++k)
    storage += fmt::format("{}{} ", to_string(quant[k]), k < 64 && (sr >> k & 1) ? "+sr" : "");
  std::string plan = fmt::format(
      "ShardedOptimizer stage {}, {} ranks, rule {} ({} chars, hash {:016x})\n"
      "options: state {}, master {}, capturable {}, max_grad_norm {:.17g}, strategy {}, "
      "stochastic rounding {} (seed {}), storage {} (block {}, from {} elements), buckets "
      "{}/{}/{}\n",
      options.stage, ranks, rule.name(), rule.text().size(), std::hash<std::string>{}(rule.text()),
      to_string(o.state_dtype), o.master_weights, o.capturable, o.max_grad_norm,
      static_cast<int>(o.reduction_strategy), o.stochastic_rounding, o.seed, storage, o.quant_block,
      o.quant_min_numel, options.buckets.bucket_bytes, options.buckets.first_bucket_bytes,
      options.buckets.max_tensors);
  const std::vector<std::pair<std::string, double>> defaults = rule.hypers();
  for (std::size_t g = 0, i = 0; g < groups.size(); ++g) {
    std::string hypers;
    for (const auto& [name, value] : defaults) {
      double v = value;
      for (const auto& [given, x] : groups[g].hypers) {
        if (given == name) v = x;
      }
      hypers += fmt::format(" {}={:.17g}", name, v);
    }
    plan += fmt::format("group {}: {} params, hypers{}\n", g, groups[g].params.size(), hypers);
    for (std::size_t k = 0; k < groups[g].params.size(); ++k, ++i) {
      std::string shape;
      for (std::int64_t d : params[i].shape)
        shape += (shape.empty() ? "" : ",") + std::to_string(d);
      plan +=
          fmt::format("param {}: '{}' {} x {} [{}], grad {}\n", i, params[i].name, params[i].numel,
                      to_string(params[i].dtype), shape, to_string(grads[i].dtype));
    }
  }
  return plan;
}

// The fused optimizer over this rank's pieces, group by group; its reduction hook combines
// the totals across ranks.
void ShardedOptimizer::Impl::build_local(const Rule& rule, const std::vector<ParamGroup>& groups) {
  std::vector<ParamGroup> local_groups(groups.size());
  std::vector<fusedopt::PieceOrigin> origins;  // each piece: its param, where, how big
  owned.assign(params.size(), {0, 0});
  for (std::size_t g = 0, i = 0; g < groups.size(); ++g) {
    local_groups[g].hypers = groups[g].hypers;
    for (std::size_t k = 0; k < groups[g].params.size(); ++k, ++i) {
      for (const auto& [piece, r] : pieces(params[i], i)) {
        if (r != rank) continue;
        const std::int64_t begin =
            (static_cast<std::byte*>(piece.data) - static_cast<std::byte*>(params[i].data)) /
            static_cast<std::int64_t>(dtype_size(piece.dtype));
        owned[i] = {begin, begin + piece.numel};
        // An element range: its own shape none; the whole param's goes with its origin.
        Tensor range = piece;
        range.shape.clear();
        local_groups[g].params.push_back(range);
        local_groups[g].grads.push_back(slice(grads[i], begin, begin + piece.numel));
        piece_param.push_back(static_cast<int>(i));
        origins.push_back({static_cast<long long>(i), static_cast<long long>(begin),
                           static_cast<long long>(params[i].numel), params[i].shape});
      }
    }
  }
  local = fusedopt::OptimizerExtension::make(rule, std::move(local_groups), options.optimizer,
                                             std::move(origins));
  fusedopt::OptimizerExtension::set_step_extension(*local, this);
}

// Gradient reduction: all-reduce (ZeRO-1), or each piece reduced to its owner (ZeRO-2).
void ShardedOptimizer::Impl::build_reducer() {
  if (options.stage == 1) {
    reducer = std::make_unique<GradBucketer>(comm, grads, options.buckets);
    return;
  }
  std::vector<Tensor> grad_pieces;
  std::vector<int> roots;
  reducer_grads.resize(params.size());
  for (std::size_t i = 0; i < grads.size(); ++i) {
    for (const auto& [piece, r] : pieces(grads[i], i)) {
      reducer_grads[i].push_back(static_cast<int>(grad_pieces.size()));
      grad_pieces.push_back(piece);
      roots.push_back(r);
    }
  }
  reducer = std::make_unique<GradBucketer>(comm, std::move(grad_pieces), options.buckets,
                                           std::move(roots));
}

// Parameter broadcasts: buckets of the pieces, each from its owner.
void ShardedOptimizer::Impl::build_gather() {
  std::vector<Tensor> param_pieces;
  std::vector<int> roots;
  for (std::size_t i = 0; i < params.size(); ++i) {
    for (const auto& [piece, r] : pieces(params[i], i)) {
      param_pieces.push_back(piece);
      roots.push_back(r);
    }
  }
  BucketOptions gather_options = options.buckets;
  gather_options.first_bucket_bytes = gather_options.bucket_bytes;  // nothing to overlap
  gather_options.max_tensors = 0;
  gather = detail::bucket_layout(param_pieces, gather_options, roots);
}

ShardedOptimizer::~ShardedOptimizer() = default;
ShardedOptimizer::ShardedOptimizer(ShardedOptimizer&&) noexcept = default;
ShardedOptimizer& ShardedOptimizer::operator=(ShardedOptimizer&&) noexcept = default;

ShardedOptimizer::Impl& ShardedOptimizer::live(const char* method) const {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr,
                       "ShardedOptimizer::{}: this ShardedOptimizer was moved from", method);
  return *impl_;
}

void ShardedOptimizer::Impl::combine(const ReductionPartials& p) {
  combine_globals(p);
  combine_per_tensor(p);
}

// Global slots: float64 all-reduces, one per kind (sum, max) on the host; on the device
// (NCCL) one per slot, in place, in the step's stream order.
void ShardedOptimizer::Impl::combine_globals(const ReductionPartials& p) {
  const bool on_device = p.device.kind == Device::Kind::Cuda;
  for (const bool max : {false, true}) {
    const ReduceOp op = max ? ReduceOp::Max : ReduceOp::Sum;
    std::vector<int> slots;
    for (const ReductionSlotInfo& s : p.slots) {
      if (!s.per_tensor && s.max == max) slots.push_back(s.slot);
    }
    if (slots.empty()) continue;
    if (on_device) {
      std::vector<Work> work;
      for (int s : slots) work.push_back(comm.all_reduce(p.global + s, 1, op, p.stream));
      for (Work& w : work) w.wait();
      continue;
    }
    std::vector<double> values;
    for (int s : slots) values.push_back(p.global[s]);
    comm.all_reduce(values.data(), static_cast<std::int64_t>(values.size()), op).wait();
    for (std::size_t k = 0; k < slots.size(); ++k) p.global[slots[k]] = values[k];
  }
}

// Per-tensor slots: a table [parameter][column] over every parameter (the pieces of a
// parameter on different ranks add up; a parameter this rank does not own contributes 0,
// or -inf to a max), one float64 all-reduce per kind. Device totals are staged through the
// host (they are few: a handful of doubles per tensor).
void ShardedOptimizer::Impl::combine_per_tensor(const ReductionPartials& p) {
  const bool on_device = p.device.kind == Device::Kind::Cuda;
  std::vector<std::vector<double>> staged(p.tensors.size());
  auto totals_bytes = [&](std::size_t b) {
    return static_cast<std::size_t>(p.tensors[b].num_tensors * p.tensors[b].stride) *
           sizeof(double);
  };
  std::vector<double*> totals;  // each kernel's totals, as the host reads them
  for (std::size_t b = 0; b < p.tensors.size(); ++b) totals.push_back(p.tensors[b].data);
  bool read = false;
  for (const bool max : {false, true}) {
    std::vector<int> columns;
    for (const ReductionSlotInfo& s : p.slots) {
      if (s.per_tensor && s.max == max) columns.push_back(s.slot);
    }
    if (columns.empty()) continue;
    if (on_device && !read) {
      for (std::size_t b = 0; b < p.tensors.size(); ++b) {
        staged[b].resize(totals_bytes(b) / sizeof(double));
        cuda_copy_to_host(staged[b].data(), p.tensors[b].data, totals_bytes(b), p.device.index);
        totals[b] = staged[b].data();
      }
      read = true;
    }
    std::vector<double> table(params.size() * columns.size(),
                              max ? -std::numeric_limits<double>::infinity() : 0.0);
    exchange_table(p, totals, columns, table, false);
    reduce_table(p, table, max ? ReduceOp::Max : ReduceOp::Sum);
    exchange_table(p, totals, columns, table, true);
  }
  if (read) {
    for (std::size_t b = 0; b < p.tensors.size(); ++b)
      cuda_copy_to_device(p.tensors[b].data, staged[b].data(), totals_bytes(b), p.device.index);
  }
}

// Copies the `columns` of every kernel's per-tensor totals into the table by parameter
// (`back`: the table back into the totals).
void ShardedOptimizer::Impl::exchange_table(const ReductionPartials& p,
                                            const std::vector<double*>& totals,
                                            const std::vector<int>& columns,
                                            std::vector<double>& table, bool back) const {
  const std::size_t width = columns.size();
  for (std::size_t b = 0; b < p.tensors.size(); ++b) {
    const ReductionPartials::TensorTotals& t = p.tensors[b];
    for (std::int64_t k = 0; k < t.num_tensors; ++k) {
      const auto param = static_cast<std::size_t>(
          piece_param[static_cast<std::size_t>(t.params[static_cast<std::size_t>(k)])]);
      for (std::size_t c = 0; c < width; ++c) {
        double& slot = totals[b][k * t.stride + columns[c]];
        double& cell = table[param * width + c];
        if (back) {
          slot = cell;
        } else {
          cell = slot;
        }
      }
    }
  }
}

// The table reduced over the ranks (through device memory for NCCL).
void ShardedOptimizer::Impl::reduce_table(const ReductionPartials& p, std::vector<double>& table,
                                          ReduceOp op) {
  const auto count = static_cast<std::int64_t>(table.size());
  if (p.device.kind != Device::Kind::Cuda) {
    comm.all_reduce(table.data(), count, op).wait();
    return;
  }
  const std::size_t bytes = table.size() * sizeof(double);
  if (!device_table || device_table->size() < bytes)
    device_table = std::make_unique<CudaBuffer>(bytes, p.device.index);
  auto* d = static_cast<double*>(device_table->data());
  cuda_copy_to_device(d, table.data(), bytes, p.device.index);
  comm.all_reduce(d, count, op, p.stream).wait();
  cuda_copy_to_host(table.data(), d, bytes, p.device.index);
}

void ShardedOptimizer::Impl::gather_params(void* stream) {
  std::vector<Work> work;
  work.reserve(gather.size());
  for (const Bucket& b : gather)
    work.push_back(comm.broadcast(b.data, b.count, b.dtype, b.root, stream));
  for (Work& w : work) w.wait();
}

// The verdict is the same on every rank (`hook` combines the grad check), so either every
// rank publishes or none does: a step skipped on the host stops before `publish`; on the
// device the verdict stays there, and every rank gathers (the unchanged pieces).
void ShardedOptimizer::Impl::begin(void* stream) {
  reducer->mark_all_ready(stream);  // what backward did not mark
  reducer->finish();
}

void ShardedOptimizer::mark_ready(int param, void* stream) {
  Impl& m = live("mark_ready");
  FUSEDOPT_CHECK_USAGE(param >= 0 && static_cast<std::size_t>(param) < m.params.size(),
                       "ShardedOptimizer::mark_ready: there is no param {} (there are {})", param,
                       m.params.size());
  if (m.options.stage == 1) {
    m.reducer->mark_ready(param, stream);
    return;
  }
  for (int g : m.reducer_grads[static_cast<std::size_t>(param)]) m.reducer->mark_ready(g, stream);
}

void ShardedOptimizer::mark_all_ready(void* stream) {
  live("mark_all_ready").reducer->mark_all_ready(stream);
}

StepResult ShardedOptimizer::step(void* stream) { return step_scaled(1.0f, stream); }

StepResult ShardedOptimizer::step_scaled(float inv_grad_scale, void* stream) {
  Impl& m = live("step_scaled");
  const float factor = inv_grad_scale / static_cast<float>(m.ranks);
  return m.local->step_scaled(factor, stream);  // its program: begin ... publish
}

StepResult ShardedOptimizer::step(GradScaler& scaler, void* stream) {
  Impl& m = live("step");
  const float factor = m.reducer->grad_scale();
  return scaler.step(*m.local, stream, factor);
}

void ShardedOptimizer::set_hyper(const std::string& name, double value, std::optional<int> group) {
  live("set_hyper").local->set_hyper(name, value, group);
}

void ShardedOptimizer::set_hyper(const std::string& name, double value, std::optional<int> group,
                                 void* stream) {
  live("set_hyper").local->set_hyper(name, value, group, stream);
}

Tensor ShardedOptimizer::state(const std::string& name, int param) const {
  const Impl& m = live("state");
  FUSEDOPT_CHECK_USAGE(param >= 0 && static_cast<std::size_t>(param) < m.params.size(),
                       "ShardedOptimizer::state('{}', {}): there is no param {} (there are {})",
                       name, param, param, m.params.size());
  for (std::size_t k = 0; k < m.piece_param.size(); ++k) {
    if (m.piece_param[k] == param) return m.local->state(name, static_cast<int>(k));
  }
  // Not owned here: an empty view (the name is still checked against the rule).
  Tensor none = m.piece_param.empty() ? Tensor{} : m.local->state(name, 0);
  none.data = nullptr;
  none.numel = 0;
  none.name = m.params[static_cast<std::size_t>(param)].name + "/" + name;
  return none;
}

double ShardedOptimizer::hyper(const std::string& name, int group) const {
  return live("hyper").local->hyper(name, group);
}

std::int64_t ShardedOptimizer::step_count() const { return live("step_count").local->step_count(); }

const Optimizer& ShardedOptimizer::local() const { return *live("local").local; }

std::pair<std::int64_t, std::int64_t> ShardedOptimizer::owned_range(int param) const {
  const Impl& m = live("owned_range");
  FUSEDOPT_CHECK_USAGE(param >= 0 && static_cast<std::size_t>(param) < m.params.size(),
                       "ShardedOptimizer::owned_range: there is no param {} (there are {})", param,
                       m.params.size());
  return m.owned[static_cast<std::size_t>(param)];
}

ShardStats ShardedOptimizer::stats() const {
  const Impl& m = live("stats");
  ShardStats s;
  s.stage = m.options.stage;
  s.rank = m.rank;
  s.ranks = m.ranks;
  for (const auto& [dtype, n] : m.total) s.elements += n;
  for (const auto& [begin, end] : m.owned) s.owned_elements += end - begin;
  s.local = m.local->stats();
  s.state_bytes = s.local.state_bytes;
  const BucketStats r = m.reducer->stats();
  s.reduce_collectives = r.buckets;
  s.gradient_bytes = r.bytes_per_step;
  s.gather_collectives = static_cast<int>(m.gather.size());
  for (const Bucket& b : m.gather) s.parameter_bytes += b.bytes;
  s.report = fmt::format(
      "rank {} of {} owns {} of {} elements (ZeRO-{}): {} bytes of optimizer state; per step "
      "{} gradient {} ({} bytes) and {} parameter broadcasts ({} bytes)",
      m.rank, m.ranks, millions(s.owned_elements), millions(s.elements), s.stage, s.state_bytes,
      s.reduce_collectives, s.stage == 1 ? "all-reduces" : "reduces", s.gradient_bytes,
      s.gather_collectives, s.parameter_bytes);
  return s;
}

}  // namespace fusedopt::comm
