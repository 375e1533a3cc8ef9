// Normalising values that people type into environment variables and command lines.
#pragma once

#include <string>
#include <string_view>

namespace fusedopt::support {

/// `text` without leading and trailing white space, in lower case (ASCII).
std::string trimmed_lower(std::string_view text);

}  // namespace fusedopt::support
