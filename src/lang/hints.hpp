// Helpers that make diagnostics useful: "did you mean" suggestions by edit distance, and
// readable names for control characters.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace fusedopt::lang {

/// Optimal-string-alignment distance (Levenshtein plus adjacent transpositions), or
/// `limit + 1` as soon as the distance is known to exceed `limit`.
int edit_distance(std::string_view a, std::string_view b, int limit);

/// The candidate closest to `name` when it is close enough to be a likely typo, else empty.
/// Ties go to the earliest candidate.
std::string nearest_name(std::string_view name, const std::vector<std::string_view>& candidates);

/// "did you mean 'x'?" for the nearest candidate, or empty.
std::string did_you_mean(std::string_view name, const std::vector<std::string_view>& candidates);

/// The ASCII abbreviation of control character `c` ("NUL", "CR", "ESC", "DEL").
const char* control_name(unsigned char c);

}  // namespace fusedopt::lang
