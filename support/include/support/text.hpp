// Text helpers: normalising values that people type into environment variables and command
// lines, and quoting strings for JSON.
#pragma once

#include <string>
#include <string_view>

namespace fusedopt::support {

/// `text` without leading and trailing white space, in lower case (ASCII).
std::string trimmed_lower(std::string_view text);

/// Appends `s` as a quoted JSON string literal: quote, backslash and control characters
/// escaped; bytes from 0x7f too when `ascii_only` (as \u00XX: for byte strings such as
/// file paths that need not be UTF-8), else passed through (the caller checked UTF-8).
void append_json_string(std::string& out, std::string_view s, bool ascii_only);

}  // namespace fusedopt::support
