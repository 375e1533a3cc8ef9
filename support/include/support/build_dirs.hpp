// The private folders compilers run in: `fusedopt-build-<pid>-XXXXXX` in the temporary
// folder (TMPDIR), one per compile, removed when it ends. A process killed mid-compile
// leaves its folder behind; the name's pid and the folder's owner tell such a stale folder
// from one in use, so that the kernel cache can remove them at start-up and show them in
// `fusedopt-cache verify` (and `prune` and `clear` remove them).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace fusedopt::support {

/// The temporary folder: the first of TMPDIR, TMP, TEMP and TEMPDIR that is set and not
/// empty (an empty TMPDIR means /tmp, by convention), else /tmp. `ec` is set when it is not
/// a folder.
std::filesystem::path temp_folder(std::error_code& ec);

/// A private (0700) build folder for this process in `base` (default: the temporary folder).
/// Throws fusedopt::IoError naming the folder and the reason.
std::filesystem::path make_build_dir(const std::filesystem::path& base = {});

/// Removes a build folder and everything in it (links are removed, never followed); best
/// effort.
void remove_build_dir(const std::filesystem::path& dir);

struct StaleBuildDir {
  std::filesystem::path path;
  pid_t pid = 0;            ///< the process that made it (0: a name of fusedopt before 2026-11)
  std::uint64_t bytes = 0;  ///< what its files take
};

/// The build folders in `base` (default: the temporary folder) that this user owns and whose
/// process is gone from this host: real folders (not links) named by make_build_dir whose
/// pid is not a live process (a zombie counts as gone), and folders of the older name
/// `fusedopt-build-XXXXXX` untouched for a day. None when `base` cannot be read.
std::vector<StaleBuildDir> stale_build_dirs(const std::filesystem::path& base = {});

/// Whether process `pid` is alive on this host (not a zombie).
bool process_alive(pid_t pid);

}  // namespace fusedopt::support
