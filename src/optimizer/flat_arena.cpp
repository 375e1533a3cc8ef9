// FlatArena: params and grads contiguous, one 64-byte aligned buffer per dtype for each
// (Bagua's do_flatten), so a bucketer or a flat copy can treat a dtype's params as one span.
#include <fmt/format.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <optional>

#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"
#include "support/check.hpp"
#include "support/checked_math.hpp"

namespace fusedopt {

namespace {
constexpr std::size_t kAlign = 64;
struct Free {
  bool owned = true;  ///< false: memory the caller lent (finalize(grad_memory))
  void operator()(std::byte* p) const {
    if (owned) std::free(p);
  }
};
using Buffer = std::unique_ptr<std::byte[], Free>;
}  // namespace

struct FlatArena::Impl {
  struct Entry {
    std::string name;
    std::int64_t numel;
    DType dtype;
    std::size_t offset;  ///< bytes into its dtype's buffers
  };
  std::vector<Entry> entries;
  std::map<DType, std::size_t> bytes;  ///< per dtype, each view rounded up to kAlign
  std::map<DType, Buffer> params, grads;
  bool finalized = false;

  Tensor view(std::size_t i, bool grad) const {
    if (!finalized) throw UsageError("FlatArena: call finalize() before taking views");
    FUSEDOPT_CHECK_USAGE(i < entries.size(), "FlatArena: no tensor {} (the arena holds {})", i,
                         entries.size());
    const Entry& e = entries[i];
    Tensor t;
    t.numel = e.numel;
    t.dtype = e.dtype;
    t.name = grad ? e.name + ".grad" : e.name;
    const auto& buffers = grad ? grads : params;
    t.data = e.numel > 0 ? buffers.at(e.dtype).get() + e.offset : nullptr;
    return t;
  }
};

FlatArena::FlatArena() : impl_(std::make_unique<Impl>()) {}
FlatArena::~FlatArena() = default;
FlatArena::FlatArena(FlatArena&&) noexcept = default;
FlatArena& FlatArena::operator=(FlatArena&&) noexcept = default;

FlatArena::Impl& FlatArena::live(const char* method) const {
  FUSEDOPT_CHECK_USAGE(impl_ != nullptr, "FlatArena::{}: this FlatArena was moved from", method);
  return *impl_;
}

void FlatArena::add(const std::string& name, std::int64_t numel, DType dtype) {
  live("add");
  if (impl_->finalized) throw UsageError("FlatArena: add('" + name + "') after finalize()");
  FUSEDOPT_CHECK_USAGE(numel >= 0, "FlatArena: '{}' has a negative size ({})", name, numel);
  const int value = static_cast<int>(dtype);  // refused now, not where its views are used
  FUSEDOPT_CHECK_USAGE(
      value >= static_cast<int>(DType::F32) && value <= static_cast<int>(DType::U8),
      "FlatArena: '{}' has an invalid dtype (value {}, not a DType)", name, value);
  std::size_t& cursor = impl_->bytes[dtype];
  // Checked: 2^62 + 16 fp32 elements wrapped to 64 bytes, and a view past its buffer.
  const std::optional<std::size_t> size = support::checked_mul(
      static_cast<std::size_t>(numel), static_cast<std::size_t>(dtype_size(dtype)));
  const std::optional<std::size_t> rounded =
      size ? support::checked_round_up(*size, kAlign) : std::nullopt;
  const std::optional<std::size_t> end =
      rounded ? support::checked_add(cursor, *rounded) : std::nullopt;
  FUSEDOPT_CHECK_USAGE(end.has_value() && *end <= static_cast<std::size_t>(PTRDIFF_MAX),
                       "FlatArena: '{}' of {} {} elements does not fit in memory (its bytes, "
                       "with the views before it, overflow)",
                       name, numel, to_string(dtype));
  impl_->entries.push_back({name, numel, dtype, cursor});
  cursor = *end;
}

void FlatArena::finalize() { finalize(nullptr, nullptr); }

void FlatArena::finalize(const std::function<void*(std::size_t bytes)>& grad_memory,
                         const std::function<void*(std::size_t bytes)>& param_memory) {
  live("finalize");
  if (impl_->finalized) throw UsageError("FlatArena: finalize() called twice");
  auto lent = [](const std::function<void*(std::size_t)>& memory, const char* what, DType dtype,
                 std::size_t bytes) {
    // A dtype whose tensors are all empty needs no memory: nothing is asked for (an
    // allocator may return null for 0 bytes, as malloc may), and its views hold null.
    if (bytes == 0) return Buffer(nullptr, Free{false});
    auto* p = static_cast<std::byte*>(memory(bytes));
    FUSEDOPT_CHECK_USAGE(p != nullptr && reinterpret_cast<std::uintptr_t>(p) % kAlign == 0,
                         "FlatArena::finalize: the {} memory for {} ({} bytes) is {}", what,
                         to_string(dtype), bytes, p == nullptr ? "null" : "not 64-byte aligned");
    std::memset(p, 0, bytes);
    return Buffer(p, Free{false});
  };
  auto allocate = [](std::size_t bytes) {
    Buffer b(static_cast<std::byte*>(std::aligned_alloc(kAlign, std::max(bytes, kAlign))));
    if (!b)
      throw Error(fmt::format("FlatArena: cannot allocate {} bytes", bytes));  // out of memory
    std::memset(b.get(), 0, bytes);
    return b;
  };
  // Gradients first, then params, each dtype in order: every rank calls a collective
  // allocator in the same order.
  for (const auto& [dtype, bytes] : impl_->bytes)
    impl_->grads[dtype] =
        grad_memory ? lent(grad_memory, "gradient", dtype, bytes) : allocate(bytes);
  for (const auto& [dtype, bytes] : impl_->bytes)
    impl_->params[dtype] =
        param_memory ? lent(param_memory, "param", dtype, bytes) : allocate(bytes);
  impl_->finalized = true;
}

Tensor FlatArena::param(std::size_t i) const { return live("param").view(i, false); }
Tensor FlatArena::grad(std::size_t i) const { return live("grad").view(i, true); }
std::size_t FlatArena::size() const { return live("size").entries.size(); }

}  // namespace fusedopt
