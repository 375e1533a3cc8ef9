// Cache keys: the canonical record of everything that went into a binary, and the 128-bit
// hash (XXH3-128) of its bytes that names the binary. Byte layout: docs/cache.md.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace fusedopt::cache {

/// Version of the on-disk entry format and of the key record layout.
/// Bump when you change this: the header layout, the record encoding or the folder naming.
inline constexpr std::uint32_t kFormatVersion = 2;

/// A 128-bit key (XXH3-128).
struct Key {
  std::uint64_t hi = 0;
  std::uint64_t lo = 0;
  /// 32 lowercase hex digits, high half first.
  std::string hex() const;
  static std::optional<Key> from_hex(std::string_view hex);
  bool operator==(const Key& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const Key& o) const { return !(*this == o); }
};

/// The canonical record a key is computed from: ordered (name, value) fields, encoded
/// length-prefixed so that no two different records have the same bytes.
class KeyRecord {
 public:
  KeyRecord& add(std::string name, std::string value);
  const std::vector<std::pair<std::string, std::string>>& fields() const { return fields_; }
  /// The value of the first field called `name`, or "" when there is none.
  std::string get(std::string_view name) const;
  /// Canonical bytes: for each field, u64 LE length + name bytes, u64 LE length + value bytes.
  std::string serialize() const;
  /// Inverse of serialize(); nullopt for malformed bytes.
  static std::optional<KeyRecord> deserialize(std::string_view bytes);
  /// XXH3-128 of serialize().
  Key key() const;

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

}  // namespace fusedopt::cache
