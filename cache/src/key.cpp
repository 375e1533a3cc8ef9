// Keys and key records: the canonical, length-prefixed encoding of everything that went into
// a binary, and its XXH3-128 hash. See docs/cache.md for the byte layout.
#include "cache/key.hpp"

#include <xxhash.h>

#include "entry_format.hpp"

namespace fusedopt::cache {

namespace {

int hex_digit_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Key::hex() const {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (int i = 0; i < 16; ++i) {
    out[15 - i] = kDigits[(hi >> (4 * i)) & 0xf];
    out[31 - i] = kDigits[(lo >> (4 * i)) & 0xf];
  }
  return out;
}

std::optional<Key> Key::from_hex(std::string_view hex) {
  if (hex.size() != 32) return std::nullopt;
  Key key;
  for (std::size_t i = 0; i < 32; ++i) {
    int v = hex_digit_value(hex[i]);
    if (v < 0) return std::nullopt;
    std::uint64_t& half = i < 16 ? key.hi : key.lo;
    half = (half << 4) | static_cast<std::uint64_t>(v);
  }
  return key;
}

KeyRecord& KeyRecord::add(std::string name, std::string value) {
  fields_.emplace_back(std::move(name), std::move(value));
  return *this;
}

std::string KeyRecord::get(std::string_view name) const {
  for (const auto& [field_name, value] : fields_) {
    if (field_name == name) return value;
  }
  return {};
}

std::string KeyRecord::serialize() const {
  std::size_t total = 0;
  for (const auto& [name, value] : fields_) total += 16 + name.size() + value.size();
  std::string out;
  out.reserve(total);
  for (const auto& [name, value] : fields_) {
    detail::put_u64(out, name.size());
    out += name;
    detail::put_u64(out, value.size());
    out += value;
  }
  return out;
}

std::optional<KeyRecord> KeyRecord::deserialize(std::string_view bytes) {
  KeyRecord record;
  std::size_t pos = 0;
  // Reads one length-prefixed string; lengths are checked against what is left before any
  // arithmetic so that a hostile length cannot overflow or over-allocate.
  auto take = [&](std::string& out) {
    if (bytes.size() - pos < 8) return false;
    std::uint64_t length = detail::get_u64(bytes.data() + pos);
    pos += 8;
    if (length > bytes.size() - pos) return false;
    out.assign(bytes.data() + pos, static_cast<std::size_t>(length));
    pos += static_cast<std::size_t>(length);
    return true;
  };
  while (pos < bytes.size()) {
    std::string name;
    std::string value;
    if (!take(name) || !take(value)) return std::nullopt;
    record.fields_.emplace_back(std::move(name), std::move(value));
  }
  return record;
}

Key KeyRecord::key() const { return detail::hash128(serialize()); }

namespace detail {

Key hash128(std::string_view bytes) {
  XXH128_hash_t h = XXH3_128bits(bytes.data(), bytes.size());
  return Key{h.high64, h.low64};
}

}  // namespace detail

}  // namespace fusedopt::cache
