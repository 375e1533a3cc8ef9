// The one parser for byte sizes typed by people: FUSEDOPT_CACHE_MAX_BYTES and the CLI's
// --max-bytes accept the same spellings.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace fusedopt::support {

/// Parses a byte count: digits, optionally followed by K, M or G (powers of 1024), each
/// optionally followed by B or iB ("512M", "512MB", "512MiB" are all 512 * 2^20); a bare B
/// means bytes. Case-insensitive; surrounding spaces are ignored. Returns nullopt for
/// anything else and, when `problem` is given, stores a short reason there: "is not a size
/// (e.g. 512M, 2G, 1048576)", "has an unknown unit (use K, M or G)" or "is too large".
std::optional<std::uint64_t> parse_size(std::string_view text, std::string* problem = nullptr);

}  // namespace fusedopt::support
