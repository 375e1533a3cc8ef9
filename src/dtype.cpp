// DType, DTypeBinding and Target text forms.
#include "fusedopt/dtype.hpp"

#include <fmt/format.h>

#include <cctype>

#include "fusedopt/error.hpp"
#include "fusedopt/target.hpp"
#include "support/check.hpp"

namespace fusedopt {

namespace {

/// Every DType's names and size: the one table to_string, dtype_size and the safetensors
/// names read (checkpoints, the sharded checkpoints and fusedopt-ckpt go through them).
struct DTypeInfo {
  DType dtype;
  const char* name;         ///< to_string
  const char* safetensors;  ///< safetensors_name
  int bytes;
};
constexpr DTypeInfo kDTypes[] = {
    {DType::F32, "fp32", "F32", 4},   {DType::F16, "fp16", "F16", 2},
    {DType::BF16, "bf16", "BF16", 2}, {DType::F64, "fp64", "F64", 8},
    {DType::U8, "uint8", "U8", 1},
};

const DTypeInfo& info_of(DType dtype) {
  static constexpr DTypeInfo kUnknown = {DType::F32, "?", "?", 4};  // not a DType's value
  for (const DTypeInfo& d : kDTypes) {
    if (d.dtype == dtype) return d;
  }
  return kUnknown;
}

}  // namespace

const char* to_string(DType dtype) { return info_of(dtype).name; }

int dtype_size(DType dtype) { return info_of(dtype).bytes; }

const char* safetensors_name(DType dtype) { return info_of(dtype).safetensors; }

std::optional<DType> dtype_of_safetensors_name(std::string_view name) {
  for (const DTypeInfo& d : kDTypes) {
    if (name == d.safetensors) return d.dtype;
  }
  return std::nullopt;
}

const char* to_string(Quant quant) {
  switch (quant) {
    case Quant::None:
      return "-";
    case Quant::Q8S:
      return "q8s";
    case Quant::Q8U:
      return "q8u";
    case Quant::Q4S:
      return "q4s";
    case Quant::Q4U:
      return "q4u";
  }
  return "?";
}

int quant_bits(Quant quant) {
  switch (quant) {
    case Quant::None:
      return 0;
    case Quant::Q8S:
    case Quant::Q8U:
      return 8;
    case Quant::Q4S:
    case Quant::Q4U:
      return 4;
  }
  return 0;
}

bool DTypeBinding::quantized() const {
  for (Quant q : quant) {
    if (q != Quant::None) return true;
  }
  return false;
}

int DTypeBinding::block() const {
  if (!quantized()) return 0;
  if (quant_block != 0) return quant_block;
  for (Quant q : quant) {
    if (quant_bits(q) == 4) return 128;
  }
  return 256;
}

bool DTypeBinding::operator==(const DTypeBinding& o) const {
  if (param != o.param || grad != o.grad || state != o.state || master != o.master ||
      stochastic != o.stochastic || quantized() != o.quantized()) {
    return false;
  }
  return !quantized() || (quant == o.quant && block() == o.block() && quant_sr == o.quant_sr);
}

namespace {

/// The "+q=Q/Q/...@B" suffix's parts, checked.
void parse_quant(std::string_view spec, std::string_view whole, DTypeBinding& b) {
  const std::size_t at = spec.find('@');
  std::string_view list = spec.substr(0, at);
  if (at != std::string_view::npos) {
    const std::string_view digits = spec.substr(at + 1);
    int block = 0;
    bool ok = !digits.empty() && digits.size() <= 4;
    for (char c : digits) {
      ok = ok && std::isdigit(static_cast<unsigned char>(c));
      block = block * 10 + (c - '0');
    }
    FUSEDOPT_CHECK_USAGE(ok && block >= 32 && block <= 512 && (block & (block - 1)) == 0,
                         "bad quantization block '{}' in '{}': a power of two from 32 to 512",
                         digits, whole);
    b.quant_block = block;
  }
  while (true) {
    const std::size_t slash = list.find('/');
    std::string_view q = list.substr(0, slash);
    constexpr std::string_view kSr = "+sr";
    const bool sr = q.size() > kSr.size() && q.substr(q.size() - kSr.size()) == kSr;
    if (sr) q.remove_suffix(kSr.size());
    Quant v = Quant::None;
    if (q == "q8s") {
      v = Quant::Q8S;
    } else if (q == "q8u") {
      v = Quant::Q8U;
    } else if (q == "q4s") {
      v = Quant::Q4S;
    } else if (q == "q4u") {
      v = Quant::Q4U;
    }
    if (v == Quant::None && (q != "-" || sr)) {
      throw UsageError(fmt::format(
          "bad state storage '{}{}' in '{}': expected one of -, q8s, q8u, q4s, q4u per state "
          "(the quantized ones with \"+sr\" for stochastic rounding), separated by '/'",
          q, sr ? "+sr" : "", whole));
    }
    FUSEDOPT_CHECK_USAGE(b.quant.size() < 64, "bad state storage in '{}': more than 64 states",
                         whole);
    if (sr) b.quant_sr |= 1ull << b.quant.size();
    b.quant.push_back(v);
    if (slash == std::string_view::npos) break;
    list.remove_prefix(slash + 1);
  }
}

DType parse_dtype(std::string_view s, std::string_view whole) {
  if (s == "fp32" || s == "f32" || s == "float32") return DType::F32;
  if (s == "fp16" || s == "f16" || s == "float16" || s == "half") return DType::F16;
  if (s == "bf16" || s == "bfloat16") return DType::BF16;
  if (s == "fp64" || s == "f64" || s == "float64" || s == "double") return DType::F64;
  throw UsageError(
      fmt::format("bad dtype '{}' in '{}': expected fp32, fp16, bf16 or fp64", s, whole));
}

}  // namespace

std::string DTypeBinding::str() const {
  std::string q;
  if (quantized()) {
    for (std::size_t k = 0; k < quant.size(); ++k) {
      q += (q.empty() ? "+q=" : "/") + std::string(to_string(quant[k]));
      if (k < 64 && (quant_sr >> k & 1) != 0) q += "+sr";
    }
    q += fmt::format("@{}", block());
  }
  return fmt::format("{}:{}:{}{}{}{}", to_string(param), to_string(grad), to_string(state),
                     master ? "+master" : "", stochastic ? "+sr" : "", q);
}

DTypeBinding DTypeBinding::parse(std::string_view text) {
  DTypeBinding b;
  std::string_view rest = text;
  if (const std::size_t q = rest.find("+q="); q != std::string_view::npos) {
    parse_quant(rest.substr(q + 3), text, b);
    rest = rest.substr(0, q);
  }
  constexpr std::string_view kMaster = "+master", kStochastic = "+sr";
  if (rest.size() >= kStochastic.size() &&
      rest.substr(rest.size() - kStochastic.size()) == kStochastic) {
    b.stochastic = true;
    rest.remove_suffix(kStochastic.size());
  }
  if (rest.size() >= kMaster.size() && rest.substr(rest.size() - kMaster.size()) == kMaster) {
    b.master = true;
    rest.remove_suffix(kMaster.size());
  }
  std::size_t c1 = rest.find(':');
  if (c1 == std::string_view::npos) {
    b.param = b.grad = b.state = parse_dtype(rest, text);
  } else {
    std::size_t c2 = rest.find(':', c1 + 1);
    if (c2 == std::string_view::npos || rest.find(':', c2 + 1) != std::string_view::npos) {
      throw UsageError(
          fmt::format("bad dtypes '{}': expected PARAM:GRAD:STATE[+master|+sr][+q=...], e.g. "
                      "bf16:bf16:fp32+master, or one dtype for all",
                      text));
    }
    b.param = parse_dtype(rest.substr(0, c1), text);
    b.grad = parse_dtype(rest.substr(c1 + 1, c2 - c1 - 1), text);
    b.state = parse_dtype(rest.substr(c2 + 1), text);
  }
  const bool f64 = b.param == DType::F64 || b.grad == DType::F64 || b.state == DType::F64;
  if (f64 && !(b.param == DType::F64 && b.grad == DType::F64 && b.state == DType::F64)) {
    throw UsageError(fmt::format(
        "bad dtypes '{}': fp64 binds params, grads and states together (fp64:fp64:fp64)", text));
  }
  if (f64 && (b.master || b.stochastic || b.quantized())) {
    throw UsageError(fmt::format(
        "bad dtypes '{}': fp64 params take no master copy, stochastic rounding or quantized "
        "states",
        text));
  }
  if (b.stochastic && (b.param == DType::F32 || b.master)) {
    throw UsageError(fmt::format(
        "bad dtypes '{}': stochastic rounding (+sr) stores fp16 or bf16 params without a "
        "master copy",
        text));
  }
  if (b.master && b.param == DType::F32) {
    throw UsageError(
        fmt::format("bad dtypes '{}': an fp32 master copy needs fp16 or bf16 params", text));
  }
  return b;
}

Target Target::parse(std::string_view text) {
  if (text == "host" || text == "cpu") return Target::host();
  if (text == "emu") return Target::emu();
  const bool ptx = text.size() > 8 && text.substr(0, 8) == "compute_";
  if ((text.size() > 3 && text.substr(0, 3) == "sm_") || ptx) {
    std::string_view digits = text.substr(ptx ? 8 : 3);
    bool arch_specific = false;
    if (!ptx && !digits.empty() && digits.back() == 'a') {
      arch_specific = true;
      digits.remove_suffix(1);
    }
    // At most three digits, so the value always fits (no overflow on "sm_99999999999").
    bool ok = !digits.empty() && digits.size() <= 3;
    int sm = 0;
    for (std::size_t i = 0; ok && i < digits.size(); ++i) {
      if (!std::isdigit(static_cast<unsigned char>(digits[i]))) ok = false;
      sm = sm * 10 + (digits[i] - '0');
    }
    if (ok && sm >= 50) return Target{Kind::Cuda, sm, arch_specific, ptx};
  }
  throw UsageError(
      fmt::format("bad target '{}': expected 'host', 'emu' (the CUDA emulator) or a CUDA "
                  "architecture like sm_80, sm_90, sm_90a or compute_90 (PTX)",
                  text));
}

std::string Target::str() const {
  if (kind == Kind::Host) return "host";
  if (kind == Kind::Emu) return "emu";
  if (ptx) return fmt::format("compute_{}", sm);
  return fmt::format("sm_{}{}", sm, arch_specific ? "a" : "");
}

}  // namespace fusedopt
