// The checkpoint format's functions that are not inline (fusedopt/checkpoint_format.hpp).
#include "fusedopt/checkpoint_format.hpp"

#include <fmt/format.h>

#include "support/parse_number.hpp"

namespace fusedopt::checkpoint {

std::string format_params(const std::vector<ParamEntry>& params) {
  std::string out;
  for (const ParamEntry& p : params) {
    out += fmt::format("{}\t{}\t{}\n", p.name, p.numel, to_string(p.dtype));
  }
  return out;
}

std::vector<ParamEntry> parse_params(const std::string& text, const std::string& where) {
  std::vector<ParamEntry> out;
  for (const std::string& line : lines(text)) {
    const std::vector<std::string> f = fields(line);
    const std::optional<std::int64_t> numel =
        f.size() == 3 ? support::parse_int_strict(f[1]) : std::nullopt;
    std::optional<DType> dtype;
    for (DType d : {DType::F32, DType::F16, DType::BF16}) {
      if (f.size() == 3 && f[2] == to_string(d)) dtype = d;
    }
    if (f.size() != 3 || f[0].empty() || !numel || *numel < 0 || !dtype) {
      throw IoError(
          fmt::format("{}: parameter line '{}' is malformed (name<TAB>elements<TAB>"
                      "fp32|fp16|bf16)",
                      where, line));
    }
    out.push_back({f[0], *numel, *dtype});
  }
  return out;
}

}  // namespace fusedopt::checkpoint
