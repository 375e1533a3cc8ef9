// File naming inside the cache folder: which names are entries, lock files and temp files,
// and a scan of the folder that classifies everything it finds.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "cache/key.hpp"

namespace fusedopt::cache::detail {

/// Throws CacheError unless `ext` is 1-16 characters of [A-Za-z0-9_] and not "lock"/"tmp".
void check_ext(std::string_view ext);

/// `<32 hex>.<ext>.lock`, beside the entry.
std::filesystem::path lock_path_for(const std::filesystem::path& entry);

enum class FileKind {
  Entry,       ///< `<2 hex>/<32 hex>.<ext>` in the right sub-folder
  Lock,        ///< `<2 hex>/<32 hex>.<ext>.lock`
  Temp,        ///< `<2 hex>/.<...>.tmp`, a store in progress or an interrupted one
  Stray,       ///< an entry's, lock's or temp's name held by no regular file: a link, a
               ///< folder, a FIFO... (`reason` says which); ours to remove, never followed
  Unexpected,  ///< anything else (never deleted by the cache)
  Unsafe,      ///< a `<2 hex>` sub-folder we must not trust (`reason` says why); not entered
};

struct ScannedFile {
  std::filesystem::path path;
  FileKind kind = FileKind::Unexpected;
  Key key;          ///< Entry and Lock only
  std::string ext;  ///< Entry only
  struct stat st {};
  bool is_dir = false;
  std::string reason;  ///< Unsafe: "a symbolic link, not a folder", "owned by uid ..."; Stray:
                       ///< "a symbolic link", "a folder", "a FIFO"...
};

/// What a file that is not a regular file is: "a symbolic link", "a folder", "a FIFO"...
std::string not_a_file(const struct stat& st);

/// Every file in the cache folder's sub-folders, plus anything unexpected at the top.
/// Files that vanish during the scan (concurrent prune, store) are skipped. Sub-folders are
/// opened relative to the cache folder without following links; one that is a link, not
/// ours, or writable by group or others is reported as Unsafe and not entered.
std::vector<ScannedFile> scan(const std::filesystem::path& dir);

/// The sub-folders `<dir>/<2 hex>` that exist.
std::vector<std::filesystem::path> shard_dirs(const std::filesystem::path& dir);

}  // namespace fusedopt::cache::detail
