// File naming inside the cache folder (see disk_layout.hpp and docs/cache.md).
#include "disk_layout.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "fusedopt/error.hpp"
#include "support/file_io.hpp"
#include "support/unique_fd.hpp"
#include "trusted_open.hpp"

namespace fusedopt::cache::detail {

namespace {

bool is_lower_hex(std::string_view s) {
  return std::all_of(s.begin(), s.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

bool ext_ok(std::string_view ext) {
  if (ext.empty() || ext.size() > 16 || ext == "lock" || ext == "tmp") return false;
  return std::all_of(ext.begin(), ext.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
}

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

/// Names in the folder open on `dir_fd`, without "." and "..". Empty when it cannot be read.
std::vector<std::string> names_in(int dir_fd) {
  std::vector<std::string> names;
  // fdopendir takes the descriptor it is given: hand it a second one.
  int own = ::openat(dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (own < 0) return names;
  DIR* d = ::fdopendir(own);
  if (d == nullptr) {
    ::close(own);
    return names;
  }
  while (dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<std::string> names_in(const std::filesystem::path& dir) {
  support::UniqueFd fd(support::open_retry(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!fd) return {};
  return names_in(fd.get());
}

void classify(std::string_view shard, std::string_view name, ScannedFile& file) {
  if (name.size() > 1 && name.front() == '.' && ends_with(name, ".tmp")) {
    file.kind = FileKind::Temp;
    return;
  }
  bool lock = ends_with(name, ".lock");
  std::string_view rest = lock ? name.substr(0, name.size() - 5) : name;
  if (rest.size() < 34 || rest[32] != '.') return;
  std::string_view hex = rest.substr(0, 32);
  std::string_view ext = rest.substr(33);
  if (!is_lower_hex(hex) || hex.substr(0, 2) != shard || !ext_ok(ext)) return;
  file.key = *Key::from_hex(hex);
  file.kind = lock ? FileKind::Lock : FileKind::Entry;
  if (!lock) file.ext = std::string(ext);
}

}  // namespace

void check_ext(std::string_view ext) {
  if (!ext_ok(ext)) {
    throw CacheError("invalid cache entry extension '" + std::string(ext) +
                     "': use 1-16 letters, digits or underscores (not 'lock' or 'tmp')");
  }
}

std::filesystem::path lock_path_for(const std::filesystem::path& entry) {
  std::filesystem::path lock = entry;
  lock += ".lock";
  return lock;
}

std::vector<std::filesystem::path> shard_dirs(const std::filesystem::path& dir) {
  std::vector<std::filesystem::path> shards;
  for (const std::string& name : names_in(dir)) {
    if (name.size() != 2 || !is_lower_hex(name)) continue;
    std::filesystem::path path = dir / name;
    struct stat st {};
    if (::lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) shards.push_back(path);
  }
  return shards;
}

std::string not_a_file(const struct stat& st) {
  if (S_ISLNK(st.st_mode)) return "a symbolic link";
  if (S_ISDIR(st.st_mode)) return "a folder";
  if (S_ISFIFO(st.st_mode)) return "a FIFO";
  if (S_ISSOCK(st.st_mode)) return "a socket";
  return S_ISREG(st.st_mode) ? "a regular file" : "a device file";
}

std::vector<ScannedFile> scan(const std::filesystem::path& dir) {
  std::vector<ScannedFile> files;
  support::UniqueFd top(support::open_retry(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!top) return files;
  for (const std::string& name : names_in(top.get())) {
    ScannedFile file;
    file.path = dir / name;
    if (::fstatat(top.get(), name.c_str(), &file.st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    file.is_dir = S_ISDIR(file.st.st_mode);
    if (name.size() != 2 || !is_lower_hex(name)) {
      files.push_back(std::move(file));  // unexpected at the top level
      continue;
    }
    file.kind = FileKind::Unsafe;
    if (!file.is_dir) {
      file.reason = S_ISLNK(file.st.st_mode) ? "a symbolic link, not a folder" : "not a folder";
      files.push_back(std::move(file));
      continue;
    }
    support::UniqueFd shard(
        ::openat(top.get(), name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
    if (!shard) {
      int err = errno;
      if (err == ENOENT) continue;  // removed by a concurrent clear()
      file.reason = err == ELOOP || err == ENOTDIR ? "not a folder"
                                                   : "unreadable: " + support::errno_text(err);
      files.push_back(std::move(file));
      continue;
    }
    if (::fstat(shard.get(), &file.st) != 0) continue;
    file.reason = untrusted_reason(file.st);
    if (!file.reason.empty()) {
      files.push_back(std::move(file));
      continue;
    }
    for (const std::string& inner : names_in(shard.get())) {
      ScannedFile f;
      f.path = file.path / inner;
      if (::fstatat(shard.get(), inner.c_str(), &f.st, AT_SYMLINK_NOFOLLOW) != 0) continue;
      f.is_dir = S_ISDIR(f.st.st_mode);
      classify(name, inner, f);
      if (!S_ISREG(f.st.st_mode) && f.kind != FileKind::Unexpected) {
        f.kind = FileKind::Stray;  // one of our names, but not a file we wrote
        f.reason = not_a_file(f.st);
      }
      files.push_back(std::move(f));
    }
  }
  return files;
}

}  // namespace fusedopt::cache::detail
