// The optimizer's params (params.hpp): each param/grad pair checked on its own and against
// the others, so that every error names the tensor, and the role pointers a kernel reads.
#include "optimizer/params.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <tuple>

#include "device/backend.hpp"
#include "exec/plan.hpp"
#include "fusedopt/error.hpp"
#include "io/json.hpp"
#include "optimizer/pieces.hpp"
#include "support/check.hpp"
#include "support/checked_math.hpp"

namespace fusedopt::runtime {

std::string describe(const ParamSlot& slot) {
  return fmt::format("group {}, param {} ('{}')", slot.group, slot.index_in_group, slot.name);
}

namespace {

bool valid_dtype(DType d) {
  return d == DType::F32 || d == DType::F16 || d == DType::BF16 || d == DType::F64;
}

/// Checks one param/grad pair on its own.
void validate_pair(const ParamSlot& s) {
  const std::string who = describe(s);
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
                       who, device_name(s.grad.device), device_name(s.param.device));
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
    (void)matrix_shape(s.param.shape, s.param.numel);  // rows and columns fit
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
                           describe(params[p]), grad ? "grad" : "param", t.numel);
      ranges.push_back({begin, *end, p, grad});
    }
  }
  return ranges;
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

void check_no_overlap(const std::vector<ParamSlot>& params) {
  // O(n log n): the ranges sorted by start, each compared with the furthest-reaching range
  // before it (which also catches one range nested in a longer one). Addresses only, so
  // host and device tensors alike.
  std::vector<ByteRange> ranges = byte_ranges(params);
  std::sort(ranges.begin(), ranges.end());
  const ByteRange* reach = nullptr;
  for (const ByteRange& r : ranges) {
    if (reach && r.begin < reach->end) {
      throw UsageError(fmt::format(
          "{}: {} overlaps the {} of {} in memory (params and grads must not share any byte)",
          describe(params[r.slot]), r.grad ? "grad" : "param", reach->grad ? "grad" : "param",
          describe(params[reach->slot])));
    }
    if (!reach || r.end > reach->end) reach = &r;
  }
}

std::vector<ParamSlot> take_params(std::vector<ParamGroup>& groups) {
  if (groups.empty()) throw UsageError("Optimizer: no param groups given");
  std::vector<ParamSlot> params;
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
    for (std::size_t i = 0; i < group.params.size(); ++i) {
      ParamSlot s;
      s.group = static_cast<int>(g);
      s.index_in_group = static_cast<int>(i);
      s.param = group.params[i];
      s.grad = group.grads[i];
      s.name = s.param.name.empty() ? fmt::format("param{}", params.size()) : s.param.name;
      infer_piece_shape(s.param);
      validate_pair(s);
      validate_piece(s.param, describe(s));
      check_param_name(s);
      const std::string who = describe(s);
      const auto [same_name, fresh_name] = by_name.emplace(s.name, params.size());
      FUSEDOPT_CHECK_USAGE(fresh_name, "{}: the name is already used by {} (names key checkpoints)",
                           who, describe(params[same_name->second]));
      if (s.param.numel > 0) {
        const auto [same_data, fresh_data] = by_data.emplace(s.param.data, params.size());
        FUSEDOPT_CHECK_USAGE(fresh_data, "{}: the same memory as {} (a param may appear only once)",
                             who, describe(params[same_data->second]));
      }
      if (!params.empty() && !(s.param.device == params.front().param.device)) {
        throw UsageError(
            fmt::format("{}: param is on {} but {} is on {} (one optimizer, one device)", who,
                        device_name(s.param.device), describe(params.front()),
                        device_name(params.front().param.device)));
      }
      params.push_back(std::move(s));
    }
  }
  if (params.empty()) throw UsageError("Optimizer: the param groups hold no parameters");
  check_no_overlap(params);
  return params;
}

std::vector<std::vector<void*>> role_pointers(const std::vector<ParamSlot>& params,
                                              const std::vector<int>& members, bool master) {
  std::vector<std::vector<void*>> out;
  out.reserve(members.size());
  for (int p : members) {
    const ParamSlot& s = params[static_cast<std::size_t>(p)];
    std::vector<void*> ptrs = {s.param.data, s.grad.data};
    ptrs.insert(ptrs.end(), s.states.begin(), s.states.end());
    if (master) ptrs.push_back(s.master);  // null for an empty tensor
    out.push_back(std::move(ptrs));
  }
  return out;
}

}  // namespace fusedopt::runtime
