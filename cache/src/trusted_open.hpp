// Opening the cache's folders and entry files so that nothing another user planted is ever
// read: every step below the cache folder is an openat() relative to the parent's
// descriptor that does not follow symbolic links, and the checks (owner, mode, kind) are
// made with fstat() on the very descriptor that is then read. Threat model: docs/cache.md.
#pragma once

#include <sys/stat.h>

#include <filesystem>
#include <string>

#include "support/unique_fd.hpp"

namespace fusedopt::cache::detail {

/// Why a file or folder with status `st` must not be trusted ("owned by uid N, not by you
/// (uid M)", "writable by group or others (mode 0777)"), or "" when it is ours and private.
std::string untrusted_reason(const struct stat& st);

/// Opens the cache folder `dir` (following symbolic links: the path is the user's choice)
/// and checks the folder it reached. Throws CacheError, with the fix, when it is missing, not
/// a folder, owned by someone else or writable by group or others.
support::UniqueFd open_cache_folder(const std::filesystem::path& dir);

/// Opens the sub-folder `name` of the cache folder open on `dir_fd` (whose path is `dir`)
/// without following symbolic links. When it is missing: an empty descriptor, or, with
/// `create`, it is made with mode 0700 and then opened and checked like any other. Throws
/// CacheError naming the sub-folder and telling to remove it when it is a symbolic link,
/// not a folder, not ours, or writable by group or others.
support::UniqueFd open_sub_folder(int dir_fd, const std::filesystem::path& dir,
                                  const std::string& name, bool create);

/// The CacheError text for an unsafe sub-folder `path`: what is wrong and how to fix it.
std::string unsafe_sub_folder_message(const std::filesystem::path& path, const std::string& why);

/// An entry file opened (not following symbolic links) and examined with fstat().
struct OpenedEntry {
  support::UniqueFd fd;  ///< open when the file could be opened (also when untrusted)
  struct stat st {};     ///< valid when `fd` is open
  int err = 0;           ///< errno of the failed open (ENOENT: no such entry; ELOOP: a link)
  std::string problem;   ///< why the file must not be read; "" when it may be
};

/// Opens the entry `name` in the sub-folder open on `dir_fd`. `problem` is set for a file
/// that is not a regular file, not ours, or writable by group or others: such a file is
/// never read, only reported (verify) or deleted (a miss).
OpenedEntry open_entry(int dir_fd, const std::string& name);

/// Removes what sits at `name` in the sub-folder open on `dir_fd` (`path` names it too)
/// when it is not a regular file: a link (itself, never what it points to), a FIFO, a
/// socket, or a folder with everything in it (links in it removed, not followed). Only for
/// a name the cache produces, in a sub-folder of ours. Returns errno, or 0 when it is gone.
int remove_stray(int dir_fd, const std::string& name, const std::filesystem::path& path);

/// unlinkat(dir_fd, name) only if `name` still names the file described by `opened`.
void unlink_at_if_same(int dir_fd, const std::string& name, const struct stat& opened);

}  // namespace fusedopt::cache::detail
