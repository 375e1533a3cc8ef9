// ShardedOptimizer: ZeRO-1/2 over the public Optimizer. Each dtype's parameters, laid end to
// end in parameter order, are cut into W equal contiguous shards; rank r's fused optimizer
// runs over views of the pieces in its shard. Gradients are reduced by a GradBucketer
// (all-reduce for ZeRO-1; for ZeRO-2 buckets cut at shard boundaries, each reduced to its
// owner), the reduction hook combines the optimizer's totals across ranks in float64, and
// the owners broadcast their updated pieces in buckets.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <limits>
#include <map>
#include <random>
#include <sstream>
#include <utility>

#include "comm/buckets.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/safetensors.hpp"
#include "fusedopt/sharded.hpp"
#include "support/check.hpp"
#include "support/parse_number.hpp"

namespace fusedopt::comm {

namespace {

/// A view of elements [begin, end) of `t`.
Tensor slice(const Tensor& t, std::int64_t begin, std::int64_t end) {
  Tensor v = t;
  v.data = static_cast<std::byte*>(t.data) + begin * static_cast<std::int64_t>(dtype_size(t.dtype));
  v.numel = end - begin;
  return v;
}

/// One rank's piece of a parameter: elements [begin, end).
struct Piece {
  int rank;
  std::int64_t begin, end;
};

/// Each parameter cut at the shard boundaries of its dtype: W equal contiguous shards of the
/// dtype's parameters laid end to end (the last one shorter). UsageError when a dtype has
/// fewer elements than ranks.
std::vector<std::vector<Piece>> cut_into_shards(
    const std::vector<std::pair<std::int64_t, DType>>& params, int ranks) {
  std::map<DType, std::int64_t> total;
  for (const auto& [n, d] : params) total[d] += n;
  std::map<DType, std::int64_t> shard, offset;
  for (const auto& [d, n] : total) {
    FUSEDOPT_CHECK_USAGE(n >= ranks,
                         "the {} parameters hold {} elements, fewer than the {} ranks (every "
                         "rank must own some of each dtype)",
                         to_string(d), n, ranks);
    shard[d] = (n + ranks - 1) / ranks;
  }
  std::vector<std::vector<Piece>> out(params.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    const auto [n, d] = params[i];
    const std::int64_t s = shard[d], at = offset[d];
    for (std::int64_t e = 0; e < n;) {
      const int r = static_cast<int>((at + e) / s);
      const std::int64_t end = std::min(n, (r + 1) * s - at);
      out[i].push_back({r, e, end});
      e = end;
    }
    offset[d] += n;
  }
  return out;
}

std::string where(const Device& d) {
  return d.kind == Device::Kind::Cuda ? fmt::format("cuda:{}", d.index) : std::string("host");
}

std::string millions(std::int64_t n) {
  return n >= 100000 ? fmt::format("{:.1f} M", static_cast<double>(n) / 1e6) : fmt::format("{}", n);
}

}  // namespace

struct ShardedOptimizer::Impl {
  explicit Impl(Communicator c) : comm(std::move(c)) {}
  Communicator comm;
  ShardOptions options;
  int rank = 0;
  int ranks = 1;

  /// Every parameter over all groups, in order.
  std::vector<Tensor> params, grads;
  /// Per dtype: elements of its parameters.
  std::map<DType, std::int64_t> total;
  /// Per parameter: its pieces, one per rank whose shard it overlaps.
  std::vector<std::vector<Piece>> cut;
  /// Per parameter: the piece this rank owns, [begin, end) of its elements.
  std::vector<std::pair<std::int64_t, std::int64_t>> owned;
  /// Per local (piece) index of the fused optimizer: the parameter it is a piece of.
  std::vector<int> piece_param;

  std::unique_ptr<Optimizer> local;
  std::unique_ptr<GradBucketer> reducer;
  /// ZeRO-2: per parameter, the reducer's gradient indices of its pieces (one per owner).
  std::vector<std::vector<int>> reducer_grads;
  /// The parameter broadcasts: buckets of pieces, each from its owner.
  std::vector<Bucket> gather;
  /// NCCL: device scratch for the per-tensor totals' all-reduce (grown on demand).
  std::unique_ptr<CudaBuffer> device_table;

  /// Parameter (or gradient) `i` cut at the shard boundaries: (view, owner) per piece.
  std::vector<std::pair<Tensor, int>> pieces(const Tensor& t, std::size_t i) const {
    std::vector<std::pair<Tensor, int>> out;
    for (const Piece& p : cut[i]) out.emplace_back(slice(t, p.begin, p.end), p.rank);
    return out;
  }

  void combine(const ReductionPartials& p);
  void gather_params(void* stream);
  bool finish_and(const std::function<StepResult()>& step_shard, void* stream);
};

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
  if (!rule.scalars().empty() || !rule.row_states().empty() || !rule.col_states().empty()) {
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
  for (std::size_t g = 0; g < groups.size(); ++g) {
    FUSEDOPT_CHECK_USAGE(groups[g].params.size() == groups[g].grads.size(),
                         "ShardedOptimizer: group {} has {} params but {} grads", g,
                         groups[g].params.size(), groups[g].grads.size());
    for (std::size_t k = 0; k < groups[g].params.size(); ++k) {
      Tensor p = groups[g].params[k];
      const Tensor& gr = groups[g].grads[k];
      const std::size_t i = m.params.size();
      if (p.name.empty()) p.name = fmt::format("param{}", i);
      FUSEDOPT_CHECK_USAGE(gr.numel == p.numel && gr.dtype == p.dtype,
                           "ShardedOptimizer: param {} ('{}'): its grad has {} x {}, the param "
                           "{} x {}",
                           i, p.name, gr.numel, to_string(gr.dtype), p.numel, to_string(p.dtype));
      FUSEDOPT_CHECK_USAGE(p.numel >= 0, "ShardedOptimizer: param {} ('{}') has {} elements", i,
                           p.name, p.numel);
      FUSEDOPT_CHECK_USAGE(p.device == m.comm.device() && gr.device == m.comm.device(),
                           "ShardedOptimizer: param {} ('{}') and its grad live on {} and {}; the "
                           "{} communicator reduces memory of {}",
                           i, p.name, where(p.device), where(gr.device), m.comm.backend(),
                           where(m.comm.device()));
      m.total[p.dtype] += p.numel;
      m.params.push_back(p);
      m.grads.push_back(gr);
    }
  }
  {
    std::vector<std::pair<std::int64_t, DType>> sizes;
    for (const Tensor& p : m.params) sizes.emplace_back(p.numel, p.dtype);
    m.cut = cut_into_shards(sizes, m.ranks);  // UsageError for a dtype with too few elements
  }
  // The parameters' layout must be one buffer per dtype in parameter order, as for the
  // gradients: the broadcasts are ranges of it (this throws UsageError naming the param).
  (void)detail::bucket_layout(m.params, options.buckets, {});

  // Every rank must cut and step the same way: the rule (its text, by hash), the options,
  // every group's hypers (defaults resolved: a value given or defaulted reads the same),
  // and every param's name, size, shape and dtypes. A rank that differs in any of them
  // (another name, lr=0.5 in one group) fails on every rank, naming the first difference.
  const OptimizerOptions& o = options.optimizer;
  std::string plan = fmt::format(
      "ShardedOptimizer stage {}, {} ranks, rule {} ({} chars, hash {:016x})\n"
      "options: state {}, master {}, capturable {}, max_grad_norm {:.17g}, strategy {}, "
      "buckets {}/{}/{}\n",
      options.stage, m.ranks, rule.name(), rule.text().size(),
      std::hash<std::string>{}(rule.text()), to_string(o.state_dtype), o.master_weights,
      o.capturable, o.max_grad_norm, static_cast<int>(o.reduction_strategy),
      options.buckets.bucket_bytes, options.buckets.first_bucket_bytes,
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
      for (std::int64_t d : m.params[i].shape)
        shape += (shape.empty() ? "" : ",") + std::to_string(d);
      plan += fmt::format("param {}: '{}' {} x {} [{}], grad {}\n", i, m.params[i].name,
                          m.params[i].numel, to_string(m.params[i].dtype), shape,
                          to_string(m.grads[i].dtype));
    }
  }
  m.comm.check_same("ShardedOptimizer plan", plan);

  // The fused optimizer over this rank's pieces, group by group.
  std::vector<ParamGroup> local_groups(groups.size());
  m.owned.assign(m.params.size(), {0, 0});
  for (std::size_t g = 0, i = 0; g < groups.size(); ++g) {
    local_groups[g].hypers = groups[g].hypers;
    for (std::size_t k = 0; k < groups[g].params.size(); ++k, ++i) {
      for (const auto& [piece, r] : m.pieces(m.params[i], i)) {
        if (r != m.rank) continue;
        const std::int64_t begin =
            (static_cast<std::byte*>(piece.data) - static_cast<std::byte*>(m.params[i].data)) /
            static_cast<std::int64_t>(dtype_size(piece.dtype));
        m.owned[i] = {begin, begin + piece.numel};
        local_groups[g].params.push_back(piece);
        local_groups[g].grads.push_back(slice(m.grads[i], begin, begin + piece.numel));
        m.piece_param.push_back(static_cast<int>(i));
      }
    }
  }
  m.local = std::make_unique<Optimizer>(rule, std::move(local_groups), options.optimizer);
  Impl* self = impl_.get();
  m.local->set_reduction_hook([self](const ReductionPartials& p) { self->combine(p); });

  // Gradient reduction: all-reduce (ZeRO-1), or each piece reduced to its owner (ZeRO-2).
  if (options.stage == 1) {
    m.reducer = std::make_unique<GradBucketer>(m.comm, m.grads, options.buckets);
  } else {
    std::vector<Tensor> grad_pieces;
    std::vector<int> roots;
    m.reducer_grads.resize(m.params.size());
    for (std::size_t i = 0; i < m.grads.size(); ++i) {
      for (const auto& [piece, r] : m.pieces(m.grads[i], i)) {
        m.reducer_grads[i].push_back(static_cast<int>(grad_pieces.size()));
        grad_pieces.push_back(piece);
        roots.push_back(r);
      }
    }
    m.reducer = std::unique_ptr<GradBucketer>(
        new GradBucketer(m.comm, std::move(grad_pieces), options.buckets, std::move(roots)));
  }
  // Parameter broadcasts: buckets of the pieces, each from its owner.
  {
    std::vector<Tensor> param_pieces;
    std::vector<int> roots;
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      for (const auto& [piece, r] : m.pieces(m.params[i], i)) {
        param_pieces.push_back(piece);
        roots.push_back(r);
      }
    }
    BucketOptions gather_options = options.buckets;
    gather_options.first_bucket_bytes = gather_options.bucket_bytes;  // nothing to overlap
    gather_options.max_tensors = 0;
    m.gather = detail::bucket_layout(param_pieces, gather_options, roots);
  }
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
  const bool on_device = p.device.kind == Device::Kind::Cuda;
  // Global slots: float64 all-reduces, one per kind (sum, max) on the host; on the device
  // (NCCL) one per slot, in place, in the step's stream order.
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
  // Per-tensor slots: a table [parameter][column] over every parameter (the pieces of a
  // parameter on different ranks add up; a parameter this rank does not own contributes 0,
  // or -inf to a max), one float64 all-reduce per kind. Device totals are staged through
  // the host (they are few: a handful of doubles per tensor).
  const std::size_t n = params.size();
  std::vector<std::vector<double>> staged(p.tensors.size());
  auto totals_of = [&](std::size_t b) -> double* {
    return on_device ? staged[b].data() : p.tensors[b].data;
  };
  auto totals_bytes = [&](std::size_t b) {
    return static_cast<std::size_t>(p.tensors[b].num_tensors * p.tensors[b].stride) *
           sizeof(double);
  };
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
      }
      read = true;
    }
    const std::size_t width = columns.size();
    std::vector<double> table(n * width, max ? -std::numeric_limits<double>::infinity() : 0.0);
    for (std::size_t b = 0; b < p.tensors.size(); ++b) {
      const ReductionPartials::TensorTotals& t = p.tensors[b];
      const double* data = totals_of(b);
      for (std::int64_t k = 0; k < t.num_tensors; ++k) {
        const auto param = static_cast<std::size_t>(
            piece_param[static_cast<std::size_t>(t.params[static_cast<std::size_t>(k)])]);
        for (std::size_t c = 0; c < width; ++c)
          table[param * width + c] = data[k * t.stride + columns[c]];
      }
    }
    const ReduceOp op = max ? ReduceOp::Max : ReduceOp::Sum;
    const auto count = static_cast<std::int64_t>(table.size());
    if (on_device) {
      const std::size_t bytes = table.size() * sizeof(double);
      if (!device_table || device_table->size() < bytes)
        device_table = std::make_unique<CudaBuffer>(bytes, p.device.index);
      auto* d = static_cast<double*>(device_table->data());
      cuda_copy_to_device(d, table.data(), bytes, p.device.index);
      comm.all_reduce(d, count, op, p.stream).wait();
      cuda_copy_to_host(table.data(), d, bytes, p.device.index);
    } else {
      comm.all_reduce(table.data(), count, op).wait();
    }
    for (std::size_t b = 0; b < p.tensors.size(); ++b) {
      const ReductionPartials::TensorTotals& t = p.tensors[b];
      double* data = totals_of(b);
      for (std::int64_t k = 0; k < t.num_tensors; ++k) {
        const auto param = static_cast<std::size_t>(
            piece_param[static_cast<std::size_t>(t.params[static_cast<std::size_t>(k)])]);
        for (std::size_t c = 0; c < width; ++c)
          data[k * t.stride + columns[c]] = table[param * width + c];
      }
    }
  }
  if (read) {
    for (std::size_t b = 0; b < p.tensors.size(); ++b)
      cuda_copy_to_device(p.tensors[b].data, staged[b].data(), totals_bytes(b), p.device.index);
  }
}

void ShardedOptimizer::Impl::gather_params(void* stream) {
  std::vector<Work> work;
  work.reserve(gather.size());
  for (const Bucket& b : gather)
    work.push_back(comm.broadcast(b.data, b.count, b.dtype, b.root, stream));
  for (Work& w : work) w.wait();
}

bool ShardedOptimizer::Impl::finish_and(const std::function<StepResult()>& step_shard,
                                        void* stream) {
  reducer->mark_all_ready(stream);  // what backward did not mark
  reducer->finish();
  // The verdict is the same on every rank (the hook combines the grad check), so either
  // every rank gathers or none does. On the device the verdict stays there: every rank
  // gathers (a skipped step broadcasts the unchanged pieces), then asks.
  const StepResult result = step_shard();
  if (!result.known() || result.taken()) gather_params(stream);
  return result.taken();
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

bool ShardedOptimizer::step(void* stream) { return step_scaled(1.0f, stream); }

bool ShardedOptimizer::step_scaled(float inv_grad_scale, void* stream) {
  Impl& m = live("step_scaled");
  const float factor = inv_grad_scale / static_cast<float>(m.ranks);
  return m.finish_and([&] { return m.local->step_scaled(factor, stream); }, stream);
}

bool ShardedOptimizer::step(GradScaler& scaler, void* stream) {
  Impl& m = live("step");
  const float factor = m.reducer->grad_scale();
  return m.finish_and([&] { return scaler.step(*m.local, stream, factor); }, stream);
}

void ShardedOptimizer::set_hyper(const std::string& name, double value, std::optional<int> group) {
  live("set_hyper").local->set_hyper(name, value, group);
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

namespace {

constexpr const char* kIndexFile = "index.safetensors";
/// 2: each "files" line is "<file><TAB><its checksum>", every shard's checksum (16 hex
/// digits, over the whole file) as it was written by this save. 1 (before 2026-11-26): file
/// names alone; still read.
constexpr const char* kShardedFormat = "2";
constexpr const char* kOldestShardedFormat = "1";

/// Sums `values` (host memory) over the ranks, staged through device memory when the
/// communicator's buffers live on a CUDA device (NCCL reads device memory only).
void host_all_reduce(Communicator& comm, double* values, std::size_t n) {
  const Device d = comm.device();
  if (d.kind != Device::Kind::Cuda) {
    comm.all_reduce(values, static_cast<std::int64_t>(n)).wait();
    return;
  }
  CudaBuffer buffer(n * sizeof(double), d.index);
  cuda_copy_to_device(buffer.data(), values, n * sizeof(double), d.index);
  comm.all_reduce(static_cast<double*>(buffer.data()), static_cast<std::int64_t>(n)).wait();
  cuda_copy_to_host(values, buffer.data(), n * sizeof(double), d.index);
}

std::string shard_file(const std::string& tag, int rank, int ranks) {
  return fmt::format("shard-{}-{:05}-of-{:05}.safetensors", tag, rank, ranks);
}

/// How many ranks report a failure (every rank learns it, so all of them throw or none).
int failures(Communicator& comm, bool failed) {
  double n = failed ? 1.0 : 0.0;
  host_all_reduce(comm, &n, 1);
  return static_cast<int>(n);
}

bool is_hex_digest(const std::string& text) {
  return text.size() == 16 && text.find_first_not_of("0123456789abcdef") == std::string::npos;
}

/// Every rank's `digest` (16 hex digits), in rank order: exchanged as two exact 32-bit
/// halves per rank.
std::vector<std::string> gather_digests(Communicator& comm, const std::string& digest) {
  const auto ranks = static_cast<std::size_t>(comm.size());
  const auto rank = static_cast<std::size_t>(comm.rank());
  std::vector<double> halves(2 * ranks, 0.0);
  const std::uint64_t v = std::stoull(digest, nullptr, 16);
  halves[2 * rank] = static_cast<double>(v >> 32);
  halves[2 * rank + 1] = static_cast<double>(v & 0xffffffffu);
  host_all_reduce(comm, halves.data(), halves.size());
  std::vector<std::string> out;
  for (std::size_t r = 0; r < ranks; ++r) {
    const std::uint64_t hi = static_cast<std::uint64_t>(halves[2 * r]);
    const std::uint64_t lo = static_cast<std::uint64_t>(halves[2 * r + 1]);
    out.push_back(fmt::format("{:016x}", (hi << 32) | lo));
  }
  return out;
}

/// Reads all of `r` and checks it against its checksum; a file that carries the current
/// checkpoint format must have one. IoError naming the file otherwise.
void verify_whole(const SafetensorsReader& r) {
  if (r.verify()) return;
  auto it = r.metadata().find("fusedopt_checkpoint_format");
  const bool current = it != r.metadata().end() && it->second != "1";
  if (current || r.metadata().count("fusedopt_sharded_format")) {
    throw IoError(
        fmt::format("{}: it has no checksum, which every file fusedopt writes carries: "
                    "the file was changed or damaged after it was written",
                    r.path().string()));
  }
}

/// An index, read and checked whole: its checksum, format, and the "files" lines as
/// (file, checksum; "" for format 1).
struct Index {
  std::unique_ptr<SafetensorsReader> reader;
  std::vector<std::pair<std::string, std::string>> files;
  const std::string& meta(const char* key) const {
    auto it = reader->metadata().find(key);
    if (it == reader->metadata().end()) {
      throw IoError(
          fmt::format("{}: index metadata '{}' is missing", reader->path().string(), key));
    }
    return it->second;
  }
};

std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}

std::vector<std::string> fields(const std::string& line) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t tab = line.find('\t', begin);
    out.push_back(line.substr(begin, tab == std::string::npos ? std::string::npos : tab - begin));
    if (tab == std::string::npos) return out;
    begin = tab + 1;
  }
}

std::int64_t to_int(const std::string& text, const std::string& what) {
  const std::optional<std::int64_t> v = support::parse_int_strict(text);
  if (!v) throw UsageError(fmt::format("{} '{}' is not an integer", what, text));
  return *v;
}

std::size_t st_bytes(const std::string& st_dtype) { return st_dtype == "F32" ? 4 : 2; }

Index read_index(const std::filesystem::path& dir) {
  Index index;
  index.reader = std::make_unique<SafetensorsReader>(dir / kIndexFile);
  verify_whole(*index.reader);
  const std::string& format = index.meta("fusedopt_sharded_format");
  if (format != kShardedFormat && format != kOldestShardedFormat) {
    throw UsageError(fmt::format("{}: format {} is not one this fusedopt reads ({} to {})",
                                 index.reader->path().string(), format, kOldestShardedFormat,
                                 kShardedFormat));
  }
  for (const std::string& line : lines(index.meta("files"))) {
    const std::vector<std::string> f = fields(line);
    const bool ok =
        format == kOldestShardedFormat ? f.size() == 1 : f.size() == 2 && is_hex_digest(f[1]);
    if (!ok || f[0].empty() || f[0].find('/') != std::string::npos) {
      throw UsageError(
          fmt::format("{}: file line '{}' is malformed", index.reader->path().string(), line));
    }
    index.files.emplace_back(f[0], f.size() == 2 ? f[1] : std::string());
  }
  if (index.files.empty()) {
    throw UsageError(fmt::format("{}: the index names no shard files", dir.string()));
  }
  return index;
}

/// Opens shard `f` of `index` and checks all of it: its own checksum, the one the index
/// recorded for it (a shard of another save, or a file put in its place, is refused), and
/// its step against the index's.
std::unique_ptr<SafetensorsReader> open_shard(const std::filesystem::path& dir, const Index& index,
                                              std::size_t f) {
  const auto& [name, digest] = index.files[f];
  auto r = std::make_unique<SafetensorsReader>(dir / name);
  verify_whole(*r);
  auto step = r->metadata().find("step");
  if (step == r->metadata().end() || step->second != index.meta("step")) {
    throw IoError(
        fmt::format("{}: it holds step {}, the index's set step {}: it is a shard of "
                    "another save",
                    r->path().string(), step == r->metadata().end() ? "(none)" : step->second,
                    index.meta("step")));
  }
  if (!digest.empty() && r->checksum() != digest) {
    throw IoError(
        fmt::format("{}: its checksum is {}, the index recorded {}: it is not the "
                    "file this save wrote",
                    r->path().string(), r->checksum().empty() ? "(none)" : r->checksum(), digest));
  }
  return r;
}

/// Commits a set of shard files: `dir`/index.safetensors, written atomically.
void write_index(const std::filesystem::path& dir, const std::string& tag, int ranks, int stage,
                 std::int64_t step, const std::vector<std::string>& names,
                 const std::vector<std::pair<std::int64_t, DType>>& sizes,
                 const std::vector<std::string>& digests) {
  std::string params, pieces, files;
  for (std::size_t i = 0; i < names.size(); ++i) {
    params += fmt::format("{}\t{}\t{}\n", names[i], sizes[i].first, to_string(sizes[i].second));
  }
  for (int r = 0; r < ranks; ++r) {
    files +=
        fmt::format("{}\t{}\n", shard_file(tag, r, ranks), digests[static_cast<std::size_t>(r)]);
  }
  // Every rank's pieces follow from the sizes; written out so that a reader needs no
  // sharding arithmetic of its own.
  const std::vector<std::vector<Piece>> cut = cut_into_shards(sizes, ranks);
  for (std::size_t i = 0; i < cut.size(); ++i) {
    for (const Piece& p : cut[i])
      pieces += fmt::format("{}\t{}\t{}\t{}\n", p.rank, i, p.begin, p.end);
  }
  const std::map<std::string, std::string> metadata = {
      {"fusedopt_sharded_format", kShardedFormat},
      {"world_size", std::to_string(ranks)},
      {"stage", std::to_string(stage)},
      {"tag", tag},
      {"step", std::to_string(step)},
      {"params", params},
      {"files", files},
      {"pieces", pieces},
  };
  write_safetensors(dir / kIndexFile, {}, metadata);  // atomic: this commits the set
}

/// The state tensors of parameter `name` in a checkpoint file: "<name>/<state>" (a state
/// name has no '/'), with their safetensors dtypes.
std::vector<std::pair<std::string, std::string>> states_of(const SafetensorsReader& r,
                                                           const std::string& name) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const std::string& t : r.names()) {
    if (t.rfind(name + "/", 0) == 0 && t.find('/', name.size() + 1) == std::string::npos)
      out.emplace_back(t.substr(name.size() + 1), r.entry(t).dtype);
  }
  return out;
}

}  // namespace

void ShardedOptimizer::save(const std::filesystem::path& dir) const {
  Impl& m = live("save");
  // A fresh tag for this set's file names, drawn by rank 0: a save that dies halfway never
  // overwrites a file the committed index names.
  double draw = 0;
  if (m.rank == 0) draw = static_cast<double>(std::random_device{}() & 0xffffffu);
  host_all_reduce(m.comm, &draw, 1);
  const std::string tag =
      fmt::format("{}-{:06x}", m.local->step_count(), static_cast<unsigned>(draw));
  std::string error, digest(16, '0');
  try {
    std::filesystem::create_directories(dir);
    const std::filesystem::path shard = dir / shard_file(tag, m.rank, m.ranks);
    m.local->save(shard);  // atomic
    digest = SafetensorsReader(shard).checksum();
  } catch (const std::exception& e) {
    error = e.what();
  }
  if (const int n = failures(m.comm, !error.empty())) {
    throw IoError(fmt::format(
        "ShardedOptimizer::save: {} of {} ranks could not write their shard to {} (this rank: "
        "{}); the previous checkpoint there is untouched",
        n, m.ranks, dir.string(), error.empty() ? "written" : error));
  }
  // Every shard is on disk; the index records each one's checksum, which binds it to this
  // save. Test hook: a save killed here must leave the previous checkpoint loadable.
  const std::vector<std::string> digests = gather_digests(m.comm, digest);
  if (m.rank == 0 && std::getenv("FUSEDOPT_TEST_KILL_SHARDED_SAVE") != nullptr) {
    std::raise(SIGKILL);
  }
  if (m.rank == 0) {
    try {
      std::vector<std::pair<std::int64_t, DType>> sizes;
      std::vector<std::string> names;
      for (const Tensor& p : m.params) {
        sizes.emplace_back(p.numel, p.dtype);
        names.push_back(p.name);
      }
      write_index(dir, tag, m.ranks, m.options.stage, m.local->step_count(), names, sizes, digests);
      // The previous sets' files are garbage now.
      for (const auto& f : std::filesystem::directory_iterator(dir)) {
        const std::string name = f.path().filename().string();
        if (name.rfind("shard-", 0) == 0 && name.rfind("shard-" + tag + "-", 0) != 0) {
          std::error_code ec;
          std::filesystem::remove(f.path(), ec);
        }
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  if (failures(m.comm, !error.empty())) {
    throw IoError(fmt::format("ShardedOptimizer::save: rank 0 could not commit {}/{}: {}",
                              dir.string(), kIndexFile, m.rank == 0 ? error : "see rank 0"));
  }
}

void ShardedOptimizer::load(const std::filesystem::path& dir) {
  Impl& m = live("load");
  auto fail = [&](const std::string& what) {
    throw UsageError(fmt::format("cannot load sharded checkpoint {}: {}", dir.string(), what));
  };
  std::exception_ptr error;
  std::filesystem::path staged;
  try {
    const Index index = read_index(dir);
    auto meta = [&](const char* key) -> const std::string& { return index.meta(key); };
    // The parameters must be ours.
    const std::vector<std::string> saved = lines(meta("params"));
    if (saved.size() != m.params.size()) {
      fail(fmt::format("it holds {} parameters, this optimizer has {}", saved.size(),
                       m.params.size()));
    }
    for (std::size_t i = 0; i < saved.size(); ++i) {
      const std::vector<std::string> f = fields(saved[i]);
      const std::string mine = fmt::format("{}\t{}\t{}", m.params[i].name, m.params[i].numel,
                                           to_string(m.params[i].dtype));
      if (f.size() != 3 || saved[i] != mine) {
        fail(fmt::format("parameter {} was '{}', here it is '{}'", i, saved[i], mine));
      }
    }
    std::vector<std::string> files;
    for (const auto& [name, digest] : index.files) files.push_back(name);
    const auto old_ranks = to_int(meta("world_size"), "world_size");
    if (old_ranks < 1 || static_cast<std::size_t>(old_ranks) != files.size()) {
      fail(fmt::format("world size {} with {} files", old_ranks, files.size()));
    }
    // Every shard is checked whole before anything is read from it: those this rank reads,
    // and every (this rank + k * ranks)-th, so that each is checked by some rank.
    std::map<std::size_t, std::unique_ptr<SafetensorsReader>> readers;
    auto reader = [&](std::size_t f) -> SafetensorsReader& {
      auto& r = readers[f];
      if (!r) r = open_shard(dir, index, f);
      return *r;
    };
    for (std::size_t f = static_cast<std::size_t>(m.rank); f < files.size();
         f += static_cast<std::size_t>(m.ranks)) {
      reader(f);
    }
    // Old pieces per parameter: (file, begin, end).
    struct Old {
      std::size_t file;
      std::int64_t begin, end;
    };
    std::vector<std::vector<Old>> old(m.params.size());
    for (const std::string& line : lines(meta("pieces"))) {
      const std::vector<std::string> f = fields(line);
      if (f.size() != 4) fail(fmt::format("piece '{}' is malformed", line));
      const auto file = to_int(f[0], "piece file"), param = to_int(f[1], "piece param");
      const auto begin = to_int(f[2], "piece begin"), end = to_int(f[3], "piece end");
      if (file < 0 || file >= old_ranks || param < 0 ||
          static_cast<std::size_t>(param) >= m.params.size() || begin < 0 || end < begin ||
          end > m.params[static_cast<std::size_t>(param)].numel) {
        fail(fmt::format("piece '{}' is out of range", line));
      }
      old[static_cast<std::size_t>(param)].push_back({static_cast<std::size_t>(file), begin, end});
    }
    // This rank's pieces, assembled from the ranges of the old pieces they overlap.
    std::vector<std::vector<char>> buffers;
    std::vector<SafetensorsTensor> tensors;
    for (std::size_t i = 0; i < m.params.size(); ++i) {
      const auto [a, b] = m.owned[i];
      if (a == b) continue;
      const std::string& name = m.params[i].name;
      // The tensors of a piece: "<name>/<state>" (and "/master"), as the saver wrote them.
      std::vector<std::pair<std::string, std::string>> kinds;  // (tensor name, st dtype)
      std::int64_t covered = 0;
      for (const Old& o : old[i]) {
        const std::int64_t lo = std::max(a, o.begin), hi = std::min(b, o.end);
        if (lo >= hi) continue;
        SafetensorsReader& r = reader(o.file);
        if (kinds.empty()) {
          for (const auto& [state, st] : states_of(r, name)) {
            kinds.emplace_back(name + "/" + state, st);
            buffers.emplace_back(static_cast<std::size_t>(b - a) * st_bytes(st));
          }
        }
        const std::size_t first = buffers.size() - kinds.size();
        for (std::size_t k = 0; k < kinds.size(); ++k) {
          const std::size_t es = st_bytes(kinds[k].second);
          const SafetensorsReader::Entry e = r.entry(kinds[k].first);  // IoError if absent
          if (e.dtype != kinds[k].second ||
              e.bytes != static_cast<std::uint64_t>(o.end - o.begin) * es) {
            fail(fmt::format("{}: tensor '{}' does not match its piece [{}, {})", files[o.file],
                             kinds[k].first, o.begin, o.end));
          }
          r.read(kinds[k].first, static_cast<std::uint64_t>(lo - o.begin) * es,
                 static_cast<std::uint64_t>(hi - lo) * es,
                 buffers[first + k].data() + static_cast<std::size_t>(lo - a) * es);
        }
        covered += hi - lo;
      }
      if (covered != b - a) {
        fail(fmt::format("the pieces of '{}' cover {} of its elements [{}, {})", name, covered, a,
                         b));
      }
      const std::size_t first = buffers.size() - kinds.size();
      for (std::size_t k = 0; k < kinds.size(); ++k) {
        const DType d = kinds[k].second == "F32"    ? DType::F32
                        : kinds[k].second == "BF16" ? DType::BF16
                                                    : DType::F16;
        tensors.push_back({kinds[k].first, d, b - a, buffers[first + k].data()});
      }
    }
    // The saver's metadata (rule, step, hypers: the same in every file) with this rank's
    // pieces, through Optimizer::load, which checks all of it.
    staged = std::filesystem::temp_directory_path() /
             fmt::format("fusedopt-sharded-load-{}-{}.safetensors", ::getpid(), m.rank);
    write_safetensors(staged, tensors, reader(0).metadata());
  } catch (...) {
    error = std::current_exception();
  }
  // Every rank has its pieces staged, or none loads.
  if (const int n = failures(m.comm, error != nullptr)) {
    std::error_code ec;
    if (!staged.empty()) std::filesystem::remove(staged, ec);
    if (error) std::rethrow_exception(error);
    throw UsageError(
        fmt::format("cannot load sharded checkpoint {}: {} of {} ranks failed "
                    "(their errors name the cause); nothing was loaded",
                    dir.string(), n, m.ranks));
  }
  try {
    m.local->load(staged);
  } catch (...) {
    std::error_code ec;
    std::filesystem::remove(staged, ec);
    throw;
  }
  std::error_code ec;
  std::filesystem::remove(staged, ec);
}

namespace {

/// A parameter list "name<TAB>numel<TAB>dtype" per line (the index's and Optimizer::save's).
void parse_params(const std::string& text, std::vector<std::string>* names,
                  std::vector<std::pair<std::int64_t, DType>>* sizes) {
  for (const std::string& line : lines(text)) {
    const std::vector<std::string> f = fields(line);
    if (f.size() != 3) throw UsageError(fmt::format("parameter line '{}' is malformed", line));
    DType d = DType::F32;
    bool known = false;
    for (DType c : {DType::F32, DType::BF16, DType::F16}) {
      if (to_string(c) == f[2]) {
        d = c;
        known = true;
      }
    }
    if (!known) throw UsageError(fmt::format("parameter line '{}': unknown dtype", line));
    names->push_back(f[0]);
    sizes->emplace_back(to_int(f[1], "parameter size"), d);
  }
}

DType dtype_of_st(const std::string& st) {
  return st == "F32" ? DType::F32 : st == "BF16" ? DType::BF16 : DType::F16;
}

}  // namespace

void ShardedOptimizer::merge_checkpoint(const std::filesystem::path& dir,
                                        const std::filesystem::path& file) {
  // Everything is checked whole before anything is written.
  const Index index = read_index(dir);
  auto meta = [&](const char* key) -> const std::string& { return index.meta(key); };
  std::vector<std::string> names;
  std::vector<std::pair<std::int64_t, DType>> sizes;
  parse_params(meta("params"), &names, &sizes);
  std::vector<std::unique_ptr<SafetensorsReader>> shards;
  for (std::size_t f = 0; f < index.files.size(); ++f) shards.push_back(open_shard(dir, index, f));
  const std::size_t world = index.files.size();
  const std::map<std::string, std::string>& saved = shards.front()->metadata();
  const bool masters = saved.count("master_weights") && saved.at("master_weights") == "true";
  const std::vector<std::vector<Piece>> cut = cut_into_shards(sizes, static_cast<int>(world));
  // The rule's states (and master) as the shard files hold them.
  std::vector<std::pair<std::string, std::string>> states;
  for (std::size_t i = 0; i < names.size() && states.empty(); ++i) {
    if (cut[i].empty()) continue;
    for (const auto& st : states_of(*shards[static_cast<std::size_t>(cut[i][0].rank)], names[i]))
      if (st.first != "master") states.push_back(st);
  }
  struct Out {
    std::size_t param;
    std::string state, st_dtype;
  };
  std::vector<Out> plan;
  std::vector<SafetensorsTensor> tensors;
  for (std::size_t i = 0; i < names.size(); ++i) {
    std::vector<std::pair<std::string, std::string>> own = states;
    if (masters && sizes[i].second != DType::F32) own.emplace_back("master", "F32");
    for (const auto& [state, st] : own) {
      plan.push_back({i, state, st});
      tensors.push_back({names[i] + "/" + state, dtype_of_st(st), sizes[i].first, nullptr});
    }
  }
  std::map<std::string, std::string> metadata = saved;
  metadata["params"] = meta("params");
  write_safetensors(file, tensors, metadata, [&](std::size_t k, void* out) {
    const Out& o = plan[k];
    const std::size_t es = st_bytes(o.st_dtype);
    for (const Piece& p : cut[o.param]) {
      shards[static_cast<std::size_t>(p.rank)]->read(
          names[o.param] + "/" + o.state, 0, static_cast<std::uint64_t>(p.end - p.begin) * es,
          static_cast<char*>(out) + static_cast<std::size_t>(p.begin) * es);
    }
  });
}

void ShardedOptimizer::split_checkpoint(const std::filesystem::path& file,
                                        const std::filesystem::path& dir, int world_size) {
  FUSEDOPT_CHECK_USAGE(world_size >= 1, "split_checkpoint: world size {} is not positive",
                       world_size);
  const SafetensorsReader in(file);
  verify_whole(in);  // before anything is written
  auto it = in.metadata().find("params");
  if (it == in.metadata().end()) {
    throw UsageError(fmt::format(
        "{}: no parameter list in its metadata (written by a fusedopt older than 2026-11): "
        "load it into an Optimizer and save it again",
        file.string()));
  }
  std::vector<std::string> names;
  std::vector<std::pair<std::int64_t, DType>> sizes;
  parse_params(it->second, &names, &sizes);
  const std::vector<std::vector<Piece>> cut = cut_into_shards(sizes, world_size);
  const std::string step = in.metadata().count("step") ? in.metadata().at("step") : "0";
  const std::string tag = fmt::format("{}-split{}", step, world_size);
  std::filesystem::create_directories(dir);
  std::vector<std::string> digests;
  for (int r = 0; r < world_size; ++r) {
    struct Out {
      std::string name;
      std::size_t bytes_begin;
      std::size_t bytes;
    };
    std::vector<Out> plan;
    std::vector<SafetensorsTensor> tensors;
    for (std::size_t i = 0; i < names.size(); ++i) {
      for (const Piece& p : cut[i]) {
        if (p.rank != r) continue;
        for (const auto& [state, st] : states_of(in, names[i])) {
          const std::size_t es = st_bytes(st);
          plan.push_back({names[i] + "/" + state, static_cast<std::size_t>(p.begin) * es,
                          static_cast<std::size_t>(p.end - p.begin) * es});
          tensors.push_back({names[i] + "/" + state, dtype_of_st(st), p.end - p.begin, nullptr});
        }
      }
    }
    const std::filesystem::path shard = dir / shard_file(tag, r, world_size);
    write_safetensors(shard, tensors, in.metadata(), [&](std::size_t k, void* out) {
      in.read(plan[k].name, plan[k].bytes_begin, plan[k].bytes, out);
    });
    digests.push_back(SafetensorsReader(shard).checksum());
  }
  write_index(dir, tag, world_size, 1, to_int(step, "step"), names, sizes, digests);
}

}  // namespace fusedopt::comm
