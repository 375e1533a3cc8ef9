// Edit-distance suggestions and control-character names for diagnostics.
#include "lang/hints.hpp"

#include <algorithm>
#include <cstdlib>

namespace fusedopt::lang {
namespace {

// Names longer than this get no suggestion: the distance is quadratic and such a name is
// no typo of a short one anyway.
constexpr std::size_t kMaxHintLength = 64;

// One-letter names would "match" every other short name, so they get no suggestion.
int allowed_distance(std::string_view name) {
  if (name.size() <= 1) return 0;
  return name.size() <= 3 ? 1 : 2;
}

}  // namespace

int edit_distance(std::string_view a, std::string_view b, int limit) {
  const int n = static_cast<int>(a.size());
  const int m = static_cast<int>(b.size());
  if (std::abs(n - m) > limit) return limit + 1;
  // Three rolling rows: the transposition step looks two rows back.
  std::vector<int> prev2(m + 1), prev(m + 1), cur(m + 1);
  for (int j = 0; j <= m; ++j) prev[j] = j;
  for (int i = 1; i <= n; ++i) {
    cur[0] = i;
    int row_min = cur[0];
    for (int j = 1; j <= m; ++j) {
      int cost = a[i - 1] == b[j - 1] ? 0 : 1;
      int d = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost});
      if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
        d = std::min(d, prev2[j - 2] + 1);
      }
      cur[j] = d;
      row_min = std::min(row_min, d);
    }
    if (row_min > limit) return limit + 1;
    std::swap(prev2, prev);
    std::swap(prev, cur);
  }
  return std::min(prev[m], limit + 1);
}

std::string nearest_name(std::string_view name, const std::vector<std::string_view>& candidates) {
  if (name.size() > kMaxHintLength) return {};
  const int limit = allowed_distance(name);
  if (limit == 0) return {};
  int best = limit + 1;
  std::string_view best_name;
  for (std::string_view c : candidates) {
    if (c == name || c.size() > kMaxHintLength) continue;
    int d = edit_distance(name, c, limit);
    if (d < best) {
      best = d;
      best_name = c;
    }
  }
  return std::string(best_name);
}

std::string did_you_mean(std::string_view name, const std::vector<std::string_view>& candidates) {
  std::string best = nearest_name(name, candidates);
  return best.empty() ? std::string() : "did you mean '" + best + "'?";
}

const char* control_name(unsigned char c) {
  static const char* const kNames[32] = {"NUL", "SOH", "STX", "ETX", "EOT", "ENQ", "ACK", "BEL",
                                         "BS",  "TAB", "LF",  "VT",  "FF",  "CR",  "SO",  "SI",
                                         "DLE", "DC1", "DC2", "DC3", "DC4", "NAK", "SYN", "ETB",
                                         "CAN", "EM",  "SUB", "ESC", "FS",  "GS",  "RS",  "US"};
  if (c < 32) return kNames[c];
  if (c == 0x7F) return "DEL";
  return "?";
}

}  // namespace fusedopt::lang
