// What the disk tier's maintenance calls report: one listed entry (`list`) and one bad file
// (`verify`).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

#include "cache/key.hpp"

namespace fusedopt::cache {

/// What `list` reports about one entry.
struct EntryInfo {
  Key key;
  std::string ext;  ///< "cubin", "so", ...
  std::filesystem::path path;
  std::uint64_t file_bytes = 0;
  std::uint64_t payload_bytes = 0;
  std::int64_t last_used = 0;  ///< seconds since the epoch (file mtime; refreshed on hits)
  KeyRecord record;            ///< empty if the header could not be read
};

/// What `verify` found wrong with one file.
struct BadEntry {
  std::filesystem::path path;
  std::string reason;    ///< e.g. "truncated: payload is 812 bytes, header says 6960"
  bool removed = false;  ///< verify(true) deleted it (files and folders it does not own are left)
};

}  // namespace fusedopt::cache
