// A small, strict JSON reader and string writer for the safetensors header: objects, arrays,
// strings (with every escape, \uXXXX and surrogate pairs included) and integers, nothing
// else, so that a corrupt or hostile header is rejected instead of half understood.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fusedopt::io {

/// One parsed JSON value. Only the member matching `kind` is meaningful.
struct JsonValue {
  enum class Kind { kString, kInteger, kArray, kObject };
  Kind kind = Kind::kInteger;
  std::string string;
  std::int64_t integer = 0;
  std::vector<JsonValue> array;
  /// Members in file order; the parser guarantees the keys are unique.
  std::vector<std::pair<std::string, JsonValue>> object;
};

/// Parses one JSON value spanning all of `text` (surrounding JSON whitespace allowed).
/// Rejects floats, exponents, true/false/null, duplicate keys, invalid UTF-8, unescaped
/// control characters, lone surrogates and nesting deeper than 64. Throws fusedopt::Error
/// ("malformed JSON at byte N: WHAT").
JsonValue parse_json(std::string_view text);

/// Appends `s` as a quoted JSON string literal. Throws fusedopt::Error if `s` is not UTF-8.
void append_json_string(std::string& out, std::string_view s);

/// Whether `s` is well-formed UTF-8 (no overlongs, surrogates or code points past U+10FFFF).
bool is_valid_utf8(std::string_view s);

}  // namespace fusedopt::io
