// The byte-size parser (see parse_size.hpp).
#include "support/parse_size.hpp"

#include <cctype>
#include <limits>

#include "support/text.hpp"

namespace fusedopt::support {

std::optional<std::uint64_t> parse_size(std::string_view text, std::string* problem) {
  auto fail = [&](const char* why) -> std::optional<std::uint64_t> {
    if (problem != nullptr) *problem = why;
    return std::nullopt;
  };
  constexpr const char* kTooLarge = "is too large";
  std::string value = trimmed_lower(text);
  std::size_t pos = 0;
  std::uint64_t number = 0;
  constexpr std::uint64_t kMax = std::numeric_limits<std::uint64_t>::max();
  while (pos < value.size() && std::isdigit(static_cast<unsigned char>(value[pos]))) {
    std::uint64_t digit = static_cast<std::uint64_t>(value[pos] - '0');
    if (number > (kMax - digit) / 10) return fail(kTooLarge);
    number = number * 10 + digit;
    ++pos;
  }
  if (pos == 0) return fail("is not a size (e.g. 512M, 2G, 1048576)");
  std::string suffix = value.substr(pos);
  // "512M", "512MB" and "512MiB" all mean 512 * 2^20; "10bb" and "10bib" are typos, not bytes.
  if (suffix.size() > 1 && suffix.find_first_of("kmg") == 0 &&
      (suffix.substr(1) == "b" || suffix.substr(1) == "ib")) {
    suffix = suffix.substr(0, 1);
  }
  int shift = 0;
  if (suffix.empty() || suffix == "b") {
    shift = 0;
  } else if (suffix == "k") {
    shift = 10;
  } else if (suffix == "m") {
    shift = 20;
  } else if (suffix == "g") {
    shift = 30;
  } else {
    return fail("has an unknown unit (use K, M or G)");
  }
  if (shift > 0 && number > (kMax >> shift)) return fail(kTooLarge);
  return number << shift;
}

}  // namespace fusedopt::support
