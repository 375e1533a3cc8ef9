// Keys and key records: the canonical encoding, its hash, and the hex form used in file
// names. The expected bytes are written out by hand, independently of the encoder.
#include <doctest/doctest.h>
#include <xxhash.h>

#include "cache/kernel_cache.hpp"

namespace fusedopt::testing {

using fusedopt::cache::Key;
using fusedopt::cache::KeyRecord;

namespace {

std::string u64le(std::uint64_t v) {
  std::string out;
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
  return out;
}

}  // namespace

TEST_SUITE("cache") {
  TEST_CASE("a key record serializes as length-prefixed little-endian names and values") {
    KeyRecord record;
    record.add("source", "x+1").add("rule", "");
    std::string expected =
        std::string("\x06\0\0\0\0\0\0\0", 8) + "source" + std::string("\x03\0\0\0\0\0\0\0", 8) +
        "x+1" + std::string("\x04\0\0\0\0\0\0\0", 8) + "rule" + std::string("\0\0\0\0\0\0\0\0", 8);
    CHECK(record.serialize() == expected);
    XXH128_hash_t h = XXH3_128bits(expected.data(), expected.size());
    CHECK(record.key().hi == h.high64);
    CHECK(record.key().lo == h.low64);
  }

  TEST_CASE("the same record always gives the same key and equal records equal keys") {
    auto build = [] {
      KeyRecord record;
      record.add("source", "__global__ void k() {}").add("options", "-O3").add("target", "sm_80");
      return record;
    };
    CHECK(build().key() == build().key());
    CHECK(build().key().hex() == build().key().hex());
    CHECK(KeyRecord().key() == KeyRecord().key());
  }

  TEST_CASE("length prefixes keep (ab, c) and (a, bc) apart") {
    KeyRecord a;
    a.add("ab", "c");
    KeyRecord b;
    b.add("a", "bc");
    CHECK(a.serialize() != b.serialize());
    CHECK(a.key() != b.key());

    // Splitting one value across two fields must not collide either.
    KeyRecord one;
    one.add("source", "ab");
    KeyRecord two;
    two.add("source", "a").add("b", "");
    CHECK(one.key() != two.key());
  }

  TEST_CASE("field order, names and values all change the key") {
    KeyRecord base;
    base.add("source", "s").add("target", "sm_90");
    KeyRecord swapped;
    swapped.add("target", "sm_90").add("source", "s");
    KeyRecord renamed;
    renamed.add("source", "s").add("arch", "sm_90");
    KeyRecord changed;
    changed.add("source", "s").add("target", "sm_80");
    CHECK(base.key() != swapped.key());
    CHECK(base.key() != renamed.key());
    CHECK(base.key() != changed.key());
    CHECK(base.key() != KeyRecord().key());
  }

  TEST_CASE("key hex is 32 lowercase digits with the high half first and parses back") {
    Key key{0x0123456789abcdefULL, 0xfedcba9876543210ULL};
    CHECK(key.hex() == "0123456789abcdeffedcba9876543210");
    auto parsed = Key::from_hex(key.hex());
    REQUIRE(parsed.has_value());
    CHECK(*parsed == key);
    CHECK(Key::from_hex("0123456789ABCDEFFEDCBA9876543210") == std::optional<Key>(key));
    CHECK(Key{}.hex() == std::string(32, '0'));

    KeyRecord record;
    record.add("source", "abc");
    CHECK(Key::from_hex(record.key().hex()) == std::optional<Key>(record.key()));
  }

  TEST_CASE("from_hex rejects wrong lengths and non-hex characters") {
    CHECK_FALSE(Key::from_hex("").has_value());
    CHECK_FALSE(Key::from_hex(std::string(31, 'a')).has_value());
    CHECK_FALSE(Key::from_hex(std::string(33, 'a')).has_value());
    CHECK_FALSE(Key::from_hex(std::string(31, 'a') + "g").has_value());
    CHECK_FALSE(Key::from_hex(std::string(31, 'a') + " ").has_value());
  }

  TEST_CASE("serialize and deserialize round-trip, binary and empty values included") {
    KeyRecord record;
    record.add("source", std::string("a\0b\xff", 4))
        .add("", "")
        .add("headers", std::string(70000, 'h'));
    auto back = KeyRecord::deserialize(record.serialize());
    REQUIRE(back.has_value());
    CHECK(back->fields() == record.fields());
    CHECK(back->key() == record.key());

    auto empty = KeyRecord::deserialize("");
    REQUIRE(empty.has_value());
    CHECK(empty->fields().empty());
  }

  TEST_CASE("deserialize rejects malformed bytes") {
    KeyRecord record;
    record.add("source", "abc");
    std::string good = record.serialize();

    CHECK_FALSE(KeyRecord::deserialize(good.substr(0, good.size() - 1)).has_value());
    CHECK_FALSE(KeyRecord::deserialize(good.substr(0, 4)).has_value());      // half a length
    CHECK_FALSE(KeyRecord::deserialize(good.substr(0, 8 + 6)).has_value());  // name, no value
    CHECK_FALSE(KeyRecord::deserialize(good + "x").has_value());             // trailing byte
    CHECK_FALSE(KeyRecord::deserialize(u64le(5) + "abc").has_value());       // length past end
    // A hostile length must be rejected, not allocated or overflowed.
    CHECK_FALSE(KeyRecord::deserialize(u64le(~0ULL) + "abc").has_value());
    CHECK_FALSE(KeyRecord::deserialize(u64le(0) + u64le(~0ULL - 7)).has_value());
  }

  TEST_CASE("get returns the first field with a name, or empty") {
    KeyRecord record;
    record.add("source", "first").add("source", "second").add("target", "sm_90");
    CHECK(record.get("source") == "first");
    CHECK(record.get("target") == "sm_90");
    CHECK(record.get("missing").empty());
  }

  TEST_CASE("origins have readable names") {
    using fusedopt::cache::Origin;
    CHECK(std::string(to_string(Origin::Memory)) == "memory");
    CHECK(std::string(to_string(Origin::Disk)) == "disk");
    CHECK(std::string(to_string(Origin::Compiled)) == "compiled");
  }

}  // TEST_SUITE

}  // namespace fusedopt::testing
