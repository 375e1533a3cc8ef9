// What the disk tier's maintenance calls report: one listed entry (`list`), one bad file
// (`verify`) and what `prune` and `clear` removed and could not.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

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

/// A file `prune` or `clear` should have removed and could not.
struct Leftover {
  std::filesystem::path path;
  std::string reason;  ///< e.g. "Permission denied", or why the folder is not trusted
};

/// What `prune` and `clear` did.
struct Removal {
  std::uint64_t removed_bytes = 0;
  std::vector<Leftover> leftovers;  ///< empty when everything asked for went
};

}  // namespace fusedopt::cache
