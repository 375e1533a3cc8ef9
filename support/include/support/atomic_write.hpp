// Atomic publish of a whole file: a temp file in the target's folder is written, fsynced and
// renamed over the target, then the folder is fsynced. Readers see the old file or the new
// one, never a half-written one, and a failure removes the temp file. A file that is
// overwritten keeps its permission bits.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace fusedopt::support {

struct AtomicWriteOptions {
  /// Permissions of a new file, before the umask (0666: as for any ordinary new file). A
  /// file that already exists at the target keeps its own permission bits instead.
  mode_t mode = 0666;
  /// When set, the target's folder is created with this mode if it is missing, also when it
  /// vanishes (a concurrent clean-up) between the mkdir and the temp file's creation.
  std::optional<mode_t> create_folder;
  /// Temp files are named `.<temp_stem>.<pid>.<16 hex>.tmp` beside the target; the default
  /// stem is the target's file name. The pid separates processes, the random part threads.
  /// Only the stem's first kMaxTempStemBytes bytes are used, so that the temp name of any
  /// valid target name (up to 255 bytes) is itself valid.
  std::string temp_stem;
  /// Before writing, removes temp files of this shape in the target's folder that are stale:
  /// their pid is not a live process on this host (a writer that crashed) and they are at
  /// least kDeadWriterGraceSeconds old, or they are kStaleTempSeconds old whoever wrote
  /// them. The grace spares a write in progress on another host sharing the folder (a
  /// sharded save's ranks on several nodes), whose pid means nothing here: such a writer
  /// keeps its temp's modification time fresh while it writes.
  bool remove_stale_temps = false;
  /// Refuses a target that exists and is not a regular file (lstat: a symbolic link, FIFO,
  /// device node, socket or folder), checked before writing and again just before the
  /// rename: the step is "target" and err EEXIST. Without it the rename replaces whatever
  /// is there (a link itself, not the file it points to).
  bool regular_target_only = false;
};

/// A temp file whose pid is gone from this host is stale once this old (the kernel cache's
/// rule too, docs/cache.md).
inline constexpr long kDeadWriterGraceSeconds = 60;
/// A temp file this old is stale whoever wrote it (a dead writer on another host).
inline constexpr long kStaleTempSeconds = 3600;

/// The longest temp stem used (longer stems are cut): the temp name stays under 70 bytes.
inline constexpr std::size_t kMaxTempStemBytes = 32;

/// Whether `name` is a temp name atomic_write() makes, `.<stem>.<pid>.<16 hex>.tmp`; if so,
/// its pid goes to `*pid`.
bool parse_temp_name(const std::string& name, pid_t* pid);

/// What atomic_write() did: ok(), or the step that failed and its errno.
struct AtomicWriteResult {
  int err = 0;                 ///< errno of the failed step; 0 on success
  const char* step = "";       ///< "target", "mkdir", "create", "chmod", "write", "fsync", "close",
                               ///< "rename", "fsync folder"; "" on success
  std::filesystem::path temp;  ///< the temp file (removed again unless renamed)
  std::filesystem::path folder;  ///< the target's folder ("." for a bare file name)

  bool ok() const { return err == 0; }
  /// True once the rename happened: the new file is in place even if the folder fsync failed.
  bool published() const { return ok() || std::string_view(step) == "fsync folder"; }
  /// "cannot write PATH (STEP FILE): ERRNO TEXT", naming the folder or the temp file.
  std::string message(const std::filesystem::path& target) const;
};

/// Writes the file's contents to `fd`; returns false with errno set on failure.
using FileWriter = std::function<bool(int fd)>;

/// Publishes `bytes` at `path` atomically (see the top of this file).
[[nodiscard]] AtomicWriteResult atomic_write(const std::filesystem::path& path,
                                             std::string_view bytes,
                                             const AtomicWriteOptions& options = {});
/// Same, with the contents produced by `writer` (which may also throw: the temp file is
/// removed and the exception passes through).
[[nodiscard]] AtomicWriteResult atomic_write(const std::filesystem::path& path,
                                             const FileWriter& writer,
                                             const AtomicWriteOptions& options = {});

}  // namespace fusedopt::support
