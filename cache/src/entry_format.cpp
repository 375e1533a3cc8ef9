// Encoding and checking of disk-cache entry files. A reader trusts nothing in a file: every
// length is compared with the file's size before it is used, so a truncated, padded or
// foreign file is reported, never read past or allocated from.
#include "entry_format.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "support/file_io.hpp"

namespace fusedopt::cache::detail {

using support::errno_text;
using support::read_full;

void put_u32(std::string& out, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

void put_u64(std::string& out, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) out += static_cast<char>((v >> (8 * i)) & 0xff);
}

std::uint32_t get_u32(const char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

std::string encode_header(std::string_view record_bytes, std::string_view payload) {
  std::string out;
  out.reserve(kPrefixBytes + record_bytes.size() + kTrailerBytes);
  out += kMagic;
  put_u32(out, kFormatVersion);
  put_u32(out, 0);  // flags: none defined yet
  put_u64(out, record_bytes.size());
  out += record_bytes;
  put_u64(out, payload.size());
  Key sum = hash128(payload);
  put_u64(out, sum.hi);
  put_u64(out, sum.lo);
  return out;
}

namespace {

/// Reads exactly `n` bytes into `out`; returns a problem text on a short read or an error.
std::string read_exact(int fd, std::string& out, std::size_t n, const char* what) {
  out.resize(n);
  long got = read_full(fd, out.data(), n);
  if (got < 0) return "unreadable: " + errno_text(errno);
  if (static_cast<std::size_t>(got) != n) {
    return "truncated: the file ended inside the " + std::string(what);
  }
  return {};
}

}  // namespace

namespace {

/// Why a file shorter than the fixed prefix is not an entry: foreign or truncated.
std::string short_file_problem(int fd, std::uint64_t file_bytes) {
  // A short file that does not even start like an entry is foreign, not truncated.
  std::string head;
  read_exact(fd, head, static_cast<std::size_t>(file_bytes), "header");
  const std::size_t n = std::min(head.size(), kMagic.size());
  if (std::string_view(head).substr(0, n) != kMagic.substr(0, n)) {
    return "not a fusedopt cache entry (bad magic)";
  }
  return "truncated: file is " + std::to_string(file_bytes) + " bytes, shorter than the header";
}

/// Reads and checks the header (prefix, key record, trailer) into `check`; the stored
/// payload hash goes to `*stored_sum`. Returns the problem, or "" when the header holds.
std::string read_header(int fd, std::uint64_t file_bytes, EntryCheck& check, Key* stored_sum) {
  std::string prefix;
  if (auto problem = read_exact(fd, prefix, kPrefixBytes, "header"); !problem.empty()) {
    return problem;
  }
  if (std::string_view(prefix).substr(0, kMagic.size()) != kMagic) {
    return "not a fusedopt cache entry (bad magic)";
  }
  const std::uint32_t version = get_u32(prefix.data() + 8);
  if (version != kFormatVersion) {
    return "unsupported format version " + std::to_string(version) + " (this build reads version " +
           std::to_string(kFormatVersion) + ")";
  }
  const std::uint64_t record_length = get_u64(prefix.data() + 16);
  const std::uint64_t room = file_bytes - kPrefixBytes;
  if (record_length > room || room - record_length < kTrailerBytes) {
    return "truncated: file is " + std::to_string(file_bytes) +
           " bytes, header says the key record alone is " + std::to_string(record_length) +
           " bytes";
  }
  if (auto problem =
          read_exact(fd, check.record_bytes, static_cast<std::size_t>(record_length), "key record");
      !problem.empty()) {
    return problem;
  }
  std::string trailer;
  if (auto problem = read_exact(fd, trailer, kTrailerBytes, "header"); !problem.empty()) {
    return problem;
  }
  check.payload_bytes = get_u64(trailer.data());
  *stored_sum = Key{get_u64(trailer.data() + 8), get_u64(trailer.data() + 16)};
  const std::uint64_t actual_payload = room - record_length - kTrailerBytes;
  if (actual_payload < check.payload_bytes) {
    return "truncated: payload is " + std::to_string(actual_payload) + " bytes, header says " +
           std::to_string(check.payload_bytes);
  }
  if (actual_payload > check.payload_bytes) {
    return "extra bytes: file is " + std::to_string(file_bytes) + " bytes, header says " +
           std::to_string(file_bytes - (actual_payload - check.payload_bytes));
  }
  return {};
}

/// Checks the key record against the file's name and reads and checks the payload into
/// `check`. Returns the problem, or "" when the entry holds.
std::string read_payload(int fd, const Key& name_key, const Key& stored_sum, EntryCheck& check) {
  if (!KeyRecord::deserialize(check.record_bytes)) return "malformed key record in the header";
  const Key record_key = hash128(check.record_bytes);
  if (record_key != name_key) return "key mismatch: header record hashes to " + record_key.hex();
  if (auto problem =
          read_exact(fd, check.payload, static_cast<std::size_t>(check.payload_bytes), "payload");
      !problem.empty()) {
    return problem;
  }
  // A file that grew after fstat() is not what the header describes.
  char extra = 0;
  if (read_full(fd, &extra, 1) != 0) return "extra bytes: the file is longer than its header says";
  if (hash128(check.payload) != stored_sum) return "payload hash mismatch";
  return {};
}

}  // namespace

EntryCheck read_entry(int fd, std::uint64_t file_bytes, const Key& name_key, ReadDepth depth) {
  EntryCheck check;
  if (file_bytes < kPrefixBytes) {
    check.problem = short_file_problem(fd, file_bytes);
    return check;
  }
  Key stored_sum{};
  check.problem = read_header(fd, file_bytes, check, &stored_sum);
  if (!check.problem.empty() || depth == ReadDepth::Header) return check;
  check.problem = read_payload(fd, name_key, stored_sum, check);
  if (!check.problem.empty()) check.payload.clear();
  return check;
}

}  // namespace fusedopt::cache::detail
