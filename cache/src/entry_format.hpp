// The byte layout of one disk-cache entry file (header + payload) and the checks a reader
// applies to it. Every field is little-endian; docs/cache.md is the written spec.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "cache/key.hpp"

namespace fusedopt::cache::detail {

/// First eight bytes of every entry file; anything else there is a foreign file.
inline constexpr std::string_view kMagic{"FOKCACHE", 8};
/// magic (8) + format version (u32) + flags (u32) + record length (u64).
inline constexpr std::size_t kPrefixBytes = 24;
/// payload length (u64) + payload XXH3-128 (16).
inline constexpr std::size_t kTrailerBytes = 24;

void put_u32(std::string& out, std::uint32_t v);
void put_u64(std::string& out, std::uint64_t v);
std::uint32_t get_u32(const char* p);
std::uint64_t get_u64(const char* p);

/// XXH3-128 of `bytes` (the key of a serialized record, or a payload's checksum).
Key hash128(std::string_view bytes);

/// The header that precedes `payload` in an entry file for a record serialized as
/// `record_bytes`.
std::string encode_header(std::string_view record_bytes, std::string_view payload);

/// What a reader found in an entry file.
struct EntryCheck {
  std::string problem;              ///< empty when the entry is good; else a human-readable reason
  std::string record_bytes;         ///< the header's record (when the header could be read)
  std::uint64_t payload_bytes = 0;  ///< the header's payload length
  std::string payload;              ///< filled only by a full read of a good entry
};

enum class ReadDepth {
  Header,  ///< the record and payload length only (for listing)
  Full,    ///< everything, including the record-to-key and payload-hash checks
};

/// Reads the entry open on `fd` (of `file_bytes` bytes) whose file name carries `name_key`.
/// Never throws for bad contents; the problem is described in the result.
EntryCheck read_entry(int fd, std::uint64_t file_bytes, const Key& name_key, ReadDepth depth);

}  // namespace fusedopt::cache::detail
