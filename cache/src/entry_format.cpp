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

EntryCheck read_entry(int fd, std::uint64_t file_bytes, const Key& name_key, ReadDepth depth) {
  EntryCheck check;
  if (file_bytes < kPrefixBytes) {
    // A short file that does not even start like an entry is foreign, not truncated.
    std::string head;
    read_exact(fd, head, static_cast<std::size_t>(file_bytes), "header");
    std::size_t n = std::min(head.size(), kMagic.size());
    if (std::string_view(head).substr(0, n) != kMagic.substr(0, n)) {
      check.problem = "not a fusedopt cache entry (bad magic)";
    } else {
      check.problem =
          "truncated: file is " + std::to_string(file_bytes) + " bytes, shorter than the header";
    }
    return check;
  }
  std::string prefix;
  if (auto problem = read_exact(fd, prefix, kPrefixBytes, "header"); !problem.empty()) {
    check.problem = problem;
    return check;
  }
  if (std::string_view(prefix).substr(0, kMagic.size()) != kMagic) {
    check.problem = "not a fusedopt cache entry (bad magic)";
    return check;
  }
  std::uint32_t version = get_u32(prefix.data() + 8);
  if (version != kFormatVersion) {
    check.problem = "unsupported format version " + std::to_string(version) +
                    " (this build reads version " + std::to_string(kFormatVersion) + ")";
    return check;
  }
  std::uint64_t record_length = get_u64(prefix.data() + 16);
  std::uint64_t room = file_bytes - kPrefixBytes;
  if (record_length > room || room - record_length < kTrailerBytes) {
    check.problem = "truncated: file is " + std::to_string(file_bytes) +
                    " bytes, header says the key record alone is " + std::to_string(record_length) +
                    " bytes";
    return check;
  }
  if (auto problem =
          read_exact(fd, check.record_bytes, static_cast<std::size_t>(record_length), "key record");
      !problem.empty()) {
    check.problem = problem;
    return check;
  }
  std::string trailer;
  if (auto problem = read_exact(fd, trailer, kTrailerBytes, "header"); !problem.empty()) {
    check.problem = problem;
    return check;
  }
  check.payload_bytes = get_u64(trailer.data());
  Key stored_sum{get_u64(trailer.data() + 8), get_u64(trailer.data() + 16)};
  std::uint64_t actual_payload = room - record_length - kTrailerBytes;
  if (actual_payload < check.payload_bytes) {
    check.problem = "truncated: payload is " + std::to_string(actual_payload) +
                    " bytes, header says " + std::to_string(check.payload_bytes);
    return check;
  }
  if (actual_payload > check.payload_bytes) {
    check.problem = "extra bytes: file is " + std::to_string(file_bytes) + " bytes, header says " +
                    std::to_string(file_bytes - (actual_payload - check.payload_bytes));
    return check;
  }
  if (depth == ReadDepth::Header) return check;

  auto record = KeyRecord::deserialize(check.record_bytes);
  if (!record) {
    check.problem = "malformed key record in the header";
    return check;
  }
  Key record_key = hash128(check.record_bytes);
  if (record_key != name_key) {
    check.problem = "key mismatch: header record hashes to " + record_key.hex();
    return check;
  }
  if (auto problem =
          read_exact(fd, check.payload, static_cast<std::size_t>(check.payload_bytes), "payload");
      !problem.empty()) {
    check.problem = problem;
    check.payload.clear();
    return check;
  }
  // A file that grew after fstat() is not what the header describes.
  char extra = 0;
  if (read_full(fd, &extra, 1) != 0) {
    check.problem = "extra bytes: the file is longer than its header says";
    check.payload.clear();
    return check;
  }
  if (hash128(check.payload) != stored_sum) {
    check.problem = "payload hash mismatch";
    check.payload.clear();
    return check;
  }
  return check;
}

}  // namespace fusedopt::cache::detail
