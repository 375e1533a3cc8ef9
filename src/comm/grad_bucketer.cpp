// GradBucketer: DDP-style buckets over flat gradient buffers (views, no copies), started
// strictly in bucket order on every rank as their gradients become ready.
#include <fmt/format.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <utility>

#include "buckets.hpp"
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

/// Minor page faults of the calling thread so far (of the process where threads are not
/// counted apart).
std::int64_t thread_faults() {
  rusage u{};
#ifdef RUSAGE_THREAD
  getrusage(RUSAGE_THREAD, &u);
#else
  getrusage(RUSAGE_SELF, &u);
#endif
  return static_cast<std::int64_t>(u.ru_minflt);
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

struct GradBucketer::Impl {
  Impl(Communicator comm, std::vector<Tensor> grads, BucketOptions options)
      : comm_(std::move(comm)), grads_(std::move(grads)), options_(options) {}
  void start_ready(void* stream);
  void advance();
  std::string report() const;

  Communicator comm_;
  std::vector<Tensor> grads_;
  BucketOptions options_;
  std::vector<Bucket> buckets_;
  std::vector<int> bucket_of_;
  std::vector<char> marked_;
  std::vector<int> waiting_;  ///< per bucket: gradients not ready yet this step
  std::vector<Work> work_;
  std::size_t next_ = 0;  ///< the next bucket to start
  std::size_t done_ = 0;  ///< buckets before it are complete
  std::int64_t collectives_ = 0;
  std::int64_t steps_ = 0;
  double wait_seconds_ = 0, last_wait_seconds_ = 0;
  std::int64_t step_faults_ = -1;  ///< the thread's page faults at this step's first call
  std::int64_t faults_later_ = 0;  ///< faults of every step after the first
};

GradBucketer::GradBucketer(Communicator comm, std::vector<Tensor> grads, BucketOptions options)
    : GradBucketer(std::move(comm), std::move(grads), options, {}) {}

GradBucketer::GradBucketer(Communicator comm, std::vector<Tensor> grads, BucketOptions options,
                           std::vector<int> roots)
    : impl_(std::make_unique<Impl>(std::move(comm), std::move(grads), options)) {
  Impl& m = *impl_;
  m.buckets_ = detail::bucket_layout(m.grads_, m.options_, roots);
  m.bucket_of_.assign(m.grads_.size(), -1);
  for (std::size_t b = 0; b < m.buckets_.size(); ++b) {
    for (int g : m.buckets_[b].grads)
      m.bucket_of_[static_cast<std::size_t>(g)] = static_cast<int>(b);
    FUSEDOPT_CHECK_USAGE(m.buckets_[b].device == m.comm_.device(),
                         "GradBucketer: gradient {} ('{}') lives on {}, the {} communicator "
                         "reduces memory of {}",
                         m.buckets_[b].grads.front(),
                         grad_name(m.grads_, m.buckets_[b].grads.front()),
                         describe_device(m.buckets_[b].device), m.comm_.backend(),
                         describe_device(m.comm_.device()));
  }
  // Every rank must start the same collectives in the same order: compare the plans.
  std::string plan = fmt::format("gradients {}\n", m.grads_.size());
  for (std::size_t i = 0; i < m.grads_.size(); ++i) {
    plan +=
        fmt::format("gradient {}: {} x {}\n", i, m.grads_[i].numel, to_string(m.grads_[i].dtype));
  }
  for (std::size_t b = 0; b < m.buckets_.size(); ++b) {
    plan += fmt::format("bucket {}: {} elements of {}, root {}\n", b, m.buckets_[b].count,
                        to_string(m.buckets_[b].dtype), m.buckets_[b].root);
  }
  m.comm_.check_same("GradBucketer plan", plan);
  m.marked_.assign(m.grads_.size(), 0);
  m.waiting_.resize(m.buckets_.size());
  for (std::size_t b = 0; b < m.buckets_.size(); ++b) {
    m.waiting_[b] = static_cast<int>(m.buckets_[b].grads.size());
  }
  m.work_.resize(m.buckets_.size());
  if (support::log_enabled(support::LogLevel::Info) && m.comm_.rank() == 0) {
    support::log(support::LogLevel::Info, m.report());
  }
}

int GradBucketer::bucket_of(int grad) const {
  const Impl& m = live("bucket_of");
  FUSEDOPT_CHECK_USAGE(grad >= 0 && static_cast<std::size_t>(grad) < m.grads_.size(),
                       "GradBucketer: there is no gradient {} (there are {})", grad,
                       m.grads_.size());
  return m.bucket_of_[static_cast<std::size_t>(grad)];
}

void GradBucketer::mark_ready(int grad, void* stream) {
  Impl& m = live("mark_ready");
  const int b = bucket_of(grad);
  if (m.step_faults_ < 0) m.step_faults_ = thread_faults();
  auto& marked = m.marked_[static_cast<std::size_t>(grad)];
  FUSEDOPT_CHECK_USAGE(!marked,
                       "GradBucketer::mark_ready: gradient {} ('{}') is already ready in this step",
                       grad, grad_name(m.grads_, grad));
  marked = 1;
  if (b >= 0) {
    --m.waiting_[static_cast<std::size_t>(b)];
    m.start_ready(stream);
  }
  m.advance();
}

void GradBucketer::Impl::advance() {
  while (done_ < next_ && work_[done_].test()) ++done_;
}

void GradBucketer::mark_all_ready(void* stream) {
  Impl& m = live("mark_all_ready");
  for (std::size_t g = 0; g < m.grads_.size(); ++g) {
    if (!m.marked_[g]) mark_ready(static_cast<int>(g), stream);
  }
}

void GradBucketer::Impl::start_ready(void* stream) {
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
  Impl& m = live("finish");
  for (std::size_t g = 0; g < m.grads_.size(); ++g) {
    FUSEDOPT_CHECK_USAGE(
        m.marked_[g], "GradBucketer::finish: gradient {} ('{}') was not marked ready in this step",
        g, grad_name(m.grads_, static_cast<int>(g)));
  }
  if (m.step_faults_ < 0) m.step_faults_ = thread_faults();
  const auto t0 = std::chrono::steady_clock::now();
  for (Work& w : m.work_) {
    if (w.valid()) w.wait();
  }
  m.last_wait_seconds_ =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  m.wait_seconds_ += m.last_wait_seconds_;
  if (m.steps_ > 0) m.faults_later_ += thread_faults() - m.step_faults_;
  m.step_faults_ = -1;
  ++m.steps_;
  // The next step.
  std::fill(m.marked_.begin(), m.marked_.end(), 0);
  for (std::size_t b = 0; b < m.buckets_.size(); ++b) {
    m.waiting_[b] = static_cast<int>(m.buckets_[b].grads.size());
    m.work_[b] = Work();
  }
  m.next_ = 0;
  m.done_ = 0;
}

BucketStats GradBucketer::stats() const {
  const Impl& m = live("stats");
  BucketStats s;
  s.gradients = static_cast<int>(m.grads_.size());
  s.buckets = static_cast<int>(m.buckets_.size());
  for (const Bucket& b : m.buckets_) {
    s.bytes_per_step += b.bytes;
    s.largest_bucket = std::max(s.largest_bucket, b.bytes);
  }
  s.steps = m.steps_;
  s.collectives = m.collectives_;
  s.wait_seconds = m.wait_seconds_;
  s.last_wait_seconds = m.last_wait_seconds_;
  if (m.steps_ > 1)
    s.page_faults_per_step =
        static_cast<double>(m.faults_later_) / static_cast<double>(m.steps_ - 1);
  s.transport = m.comm_.transport();
  s.report = report();
  return s;
}

float GradBucketer::grad_scale() const {
  const Impl& m = live("grad_scale");
  return 1.0f / static_cast<float>(m.comm_.size());
}

std::string GradBucketer::Impl::report() const {
  const bool to_owners = !buckets_.empty() && buckets_.front().root >= 0;
  return fmt::format(
      "{} gradients -> {} {}{} per step ({} buckets, first {}{})", grads_.size(), buckets_.size(),
      to_owners ? "reduce" : "all-reduce", buckets_.size() == 1 ? "" : "s",
      mib(options_.bucket_bytes), mib(options_.first_bucket_bytes),
      options_.max_tensors > 0 ? fmt::format(", at most {} gradients each", options_.max_tensors)
                               : "");
}

GradBucketer::~GradBucketer() = default;
GradBucketer::GradBucketer(GradBucketer&&) noexcept = default;
GradBucketer& GradBucketer::operator=(GradBucketer&&) noexcept = default;

GradBucketer::Impl& GradBucketer::live(const char* method) const {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr, "GradBucketer::{}: this GradBucketer was moved from",
                       method);
  return *impl_;
}

const std::vector<Bucket>& GradBucketer::buckets() const { return live("buckets").buckets_; }

std::int64_t GradBucketer::collectives() const { return live("collectives").collectives_; }

std::string GradBucketer::report() const { return live("report").report(); }

}  // namespace fusedopt::comm
