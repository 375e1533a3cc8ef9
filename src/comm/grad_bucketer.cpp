// GradBucketer: DDP-style buckets over flat gradient buffers (views, no copies), started
// strictly in bucket order on every rank as their gradients become ready.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include "comm/buckets.hpp"
#include "fusedopt/comm.hpp"
#include "support/check.hpp"
#include "support/log.hpp"

namespace fusedopt::comm {

namespace {

/// Padding allowed between consecutive gradients of one buffer (FlatArena aligns each view
/// to 64 bytes; 256 covers cuMemAlloc-style alignment too).
constexpr std::size_t kMaxGap = 256;

std::string grad_name(const std::vector<Tensor>& grads, int i) {
  const std::string& n = grads[static_cast<std::size_t>(i)].name;
  return n.empty() ? fmt::format("grad{}", i) : n;
}

std::string mib(std::size_t bytes) {
  if (bytes % (std::size_t{1} << 20) == 0) return fmt::format("{} MiB", bytes >> 20);
  if (bytes % (std::size_t{1} << 10) == 0) return fmt::format("{} KiB", bytes >> 10);
  return fmt::format("{} bytes", bytes);
}

std::string describe_device(const Device& d) {
  return d.kind == Device::Kind::Host ? "host" : fmt::format("cuda:{}", d.index);
}

/// Gradient `next` (after `i` in parameter order, of the same dtype and device) must follow
/// gradient `i` (of `bytes` bytes) in the same buffer, at most kMaxGap bytes on.
void check_follows(const std::vector<Tensor>& grads, int i, std::size_t bytes, int next) {
  const Tensor& g = grads[static_cast<std::size_t>(i)];
  const auto end = reinterpret_cast<std::uintptr_t>(g.data) + bytes;
  const auto next_start =
      reinterpret_cast<std::uintptr_t>(grads[static_cast<std::size_t>(next)].data);
  if (next_start >= end && next_start - end <= kMaxGap) return;
  throw UsageError(fmt::format(
      "GradBucketer: gradient {} ('{}') does not follow gradient {} ('{}') in one buffer "
      "({}): keep the gradients of each dtype in one flat buffer in parameter order "
      "(FlatArena does), at most {} bytes apart",
      next, grad_name(grads, next), i, grad_name(grads, i),
      next_start < end ? "they overlap or are out of order"
                       : fmt::format("{} bytes apart", next_start - end),
      kMaxGap));
}

/// Gradient `i` (of `bytes` bytes) into bucket `b`, whose range then runs from it (the
/// lowest address so far) to the end of the bucket's first gradient.
void add_to_bucket(const std::vector<Tensor>& grads, int i, std::size_t bytes, Bucket& b) {
  const Tensor& g = grads[static_cast<std::size_t>(i)];
  b.grads.push_back(i);
  b.bytes += bytes;
  const Tensor& top = grads[static_cast<std::size_t>(b.grads.front())];
  const auto top_end = reinterpret_cast<std::uintptr_t>(top.data) +
                       static_cast<std::size_t>(top.numel) * dtype_size(top.dtype);
  b.data = g.data;
  b.count = static_cast<std::int64_t>((top_end - reinterpret_cast<std::uintptr_t>(g.data)) /
                                      static_cast<std::size_t>(dtype_size(g.dtype)));
}

}  // namespace

namespace detail {

std::vector<Bucket> bucket_layout(const std::vector<Tensor>& grads, const BucketOptions& options,
                                  const std::vector<int>& roots) {
  FUSEDOPT_CHECK_INTERNAL(roots.empty() || roots.size() == grads.size(),
                          "bucket_layout: {} roots for {} tensors", roots.size(), grads.size());
  FUSEDOPT_CHECK_USAGE(options.bucket_bytes > 0 && options.first_bucket_bytes > 0,
                       "GradBucketer: bucket_bytes and first_bucket_bytes must be positive");
  FUSEDOPT_CHECK_USAGE(options.max_tensors >= 0, "GradBucketer: max_tensors {} is negative",
                       options.max_tensors);
  struct Open {
    Bucket bucket;
    bool first = true;  // this key has closed no bucket yet
    int order = 0;      // reverse position of the bucket's first gradient
    int last = -1;      // the gradient added last (the next must lie just below it)
  };
  using Key = std::pair<int, std::pair<int, int>>;  // dtype, device kind, device index
  std::map<Key, Open> open;
  std::vector<std::pair<int, Bucket>> closed;  // (order, bucket)
  auto close = [&](Open& o) {
    if (o.bucket.grads.empty()) return;
    closed.emplace_back(o.order, std::move(o.bucket));
    o.bucket = Bucket{};
    o.first = false;
  };
  const int n = static_cast<int>(grads.size());
  for (int i = n - 1, position = 0; i >= 0; --i, ++position) {
    const Tensor& g = grads[static_cast<std::size_t>(i)];
    FUSEDOPT_CHECK_USAGE(g.numel >= 0, "GradBucketer: gradient {} ('{}') has {} elements", i,
                         grad_name(grads, i), g.numel);
    if (g.numel == 0) continue;
    FUSEDOPT_CHECK_USAGE(g.data != nullptr, "GradBucketer: gradient {} ('{}') has no data", i,
                         grad_name(grads, i));
    const std::size_t bytes =
        static_cast<std::size_t>(g.numel) * static_cast<std::size_t>(dtype_size(g.dtype));
    Open& o = open[{static_cast<int>(g.dtype), {static_cast<int>(g.device.kind), g.device.index}}];
    if (o.last >= 0) check_follows(grads, i, bytes, o.last);
    const std::size_t cap = o.first ? options.first_bucket_bytes : options.bucket_bytes;
    const int root = roots.empty() ? -1 : roots[static_cast<std::size_t>(i)];
    Bucket& b = o.bucket;
    const bool full_by_bytes = !b.grads.empty() && b.bytes + bytes > cap;
    // A bucket goes to one rank: a new root closes it.
    if (full_by_bytes || (!b.grads.empty() && b.root != root)) {
      close(o);
    }
    if (o.bucket.grads.empty()) {
      o.order = position;
      o.bucket.dtype = g.dtype;
      o.bucket.device = g.device;
      o.bucket.root = root;
    }
    Bucket& cur = o.bucket;
    add_to_bucket(grads, i, bytes, cur);
    o.last = i;
    const bool full =
        cur.bytes >= (o.first ? options.first_bucket_bytes : options.bucket_bytes) ||
        (options.max_tensors > 0 && static_cast<int>(cur.grads.size()) >= options.max_tensors);
    if (full) close(o);
  }
  for (auto& [key, o] : open) close(o);
  std::stable_sort(closed.begin(), closed.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<Bucket> out;
  out.reserve(closed.size());
  for (auto& c : closed) out.push_back(std::move(c.second));
  return out;
}

}  // namespace detail

std::vector<Bucket> GradBucketer::layout(const std::vector<Tensor>& grads,
                                         const BucketOptions& options) {
  return detail::bucket_layout(grads, options, {});
}

GradBucketer::GradBucketer(Communicator comm, std::vector<Tensor> grads, BucketOptions options)
    : GradBucketer(std::move(comm), std::move(grads), options, {}) {}

GradBucketer::GradBucketer(Communicator comm, std::vector<Tensor> grads, BucketOptions options,
                           std::vector<int> roots)
    : comm_(std::move(comm)), grads_(std::move(grads)), options_(options) {
  buckets_ = detail::bucket_layout(grads_, options_, roots);
  bucket_of_.assign(grads_.size(), -1);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    for (int g : buckets_[b].grads) bucket_of_[static_cast<std::size_t>(g)] = static_cast<int>(b);
    FUSEDOPT_CHECK_USAGE(buckets_[b].device == comm_.device(),
                         "GradBucketer: gradient {} ('{}') lives on {}, the {} communicator "
                         "reduces memory of {}",
                         buckets_[b].grads.front(), grad_name(grads_, buckets_[b].grads.front()),
                         describe_device(buckets_[b].device), comm_.backend(),
                         describe_device(comm_.device()));
  }
  // Every rank must start the same collectives in the same order: compare the plans.
  std::string plan = fmt::format("gradients {}\n", grads_.size());
  for (std::size_t i = 0; i < grads_.size(); ++i) {
    plan += fmt::format("gradient {}: {} x {}\n", i, grads_[i].numel, to_string(grads_[i].dtype));
  }
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    plan += fmt::format("bucket {}: {} elements of {}, root {}\n", b, buckets_[b].count,
                        to_string(buckets_[b].dtype), buckets_[b].root);
  }
  comm_.check_same("GradBucketer plan", plan);
  marked_.assign(grads_.size(), 0);
  waiting_.resize(buckets_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    waiting_[b] = static_cast<int>(buckets_[b].grads.size());
  }
  work_.resize(buckets_.size());
  if (support::log_enabled(support::LogLevel::Info) && comm_.rank() == 0) {
    support::log(support::LogLevel::Info, report());
  }
}

int GradBucketer::bucket_of(int grad) const {
  FUSEDOPT_CHECK_USAGE(grad >= 0 && static_cast<std::size_t>(grad) < grads_.size(),
                       "GradBucketer: there is no gradient {} (there are {})", grad, grads_.size());
  return bucket_of_[static_cast<std::size_t>(grad)];
}

void GradBucketer::mark_ready(int grad, void* stream) {
  const int b = bucket_of(grad);
  auto& m = marked_[static_cast<std::size_t>(grad)];
  FUSEDOPT_CHECK_USAGE(!m,
                       "GradBucketer::mark_ready: gradient {} ('{}') is already ready in this step",
                       grad, grad_name(grads_, grad));
  m = 1;
  if (b < 0) return;
  --waiting_[static_cast<std::size_t>(b)];
  start_ready(stream);
}

void GradBucketer::mark_all_ready(void* stream) {
  for (std::size_t g = 0; g < grads_.size(); ++g) {
    if (!marked_[g]) mark_ready(static_cast<int>(g), stream);
  }
}

void GradBucketer::start_ready(void* stream) {
  while (next_ < buckets_.size() && waiting_[next_] == 0) {
    Bucket& b = buckets_[next_];
    work_[next_] = b.root < 0
                       ? comm_.all_reduce(b.data, b.count, b.dtype, ReduceOp::Sum, stream)
                       : comm_.reduce(b.data, b.count, b.dtype, b.root, ReduceOp::Sum, stream);
    ++collectives_;
    ++next_;
  }
}

void GradBucketer::finish() {
  for (std::size_t g = 0; g < grads_.size(); ++g) {
    FUSEDOPT_CHECK_USAGE(
        marked_[g], "GradBucketer::finish: gradient {} ('{}') was not marked ready in this step", g,
        grad_name(grads_, static_cast<int>(g)));
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (Work& w : work_) {
    if (w.valid()) w.wait();
  }
  wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ++steps_;
  // The next step.
  std::fill(marked_.begin(), marked_.end(), 0);
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    waiting_[b] = static_cast<int>(buckets_[b].grads.size());
    work_[b] = Work();
  }
  next_ = 0;
}

BucketStats GradBucketer::stats() const {
  BucketStats s;
  s.gradients = static_cast<int>(grads_.size());
  s.buckets = static_cast<int>(buckets_.size());
  for (const Bucket& b : buckets_) {
    s.bytes_per_step += b.bytes;
    s.largest_bucket = std::max(s.largest_bucket, b.bytes);
  }
  s.steps = steps_;
  s.collectives = collectives_;
  s.wait_seconds = wait_seconds_;
  s.report = report();
  return s;
}

float GradBucketer::grad_scale() const { return 1.0f / static_cast<float>(comm_.size()); }

std::string GradBucketer::report() const {
  const bool to_owners = !buckets_.empty() && buckets_.front().root >= 0;
  return fmt::format(
      "{} gradients -> {} {}{} per step ({} buckets, first {}{})", grads_.size(), buckets_.size(),
      to_owners ? "reduce" : "all-reduce", buckets_.size() == 1 ? "" : "s",
      mib(options_.bucket_bytes), mib(options_.first_bucket_bytes),
      options_.max_tensors > 0 ? fmt::format(", at most {} gradients each", options_.max_tensors)
                               : "");
}

}  // namespace fusedopt::comm
