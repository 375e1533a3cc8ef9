// File naming inside the cache folder (see disk_layout.hpp and cache/README.md).
#include "disk_layout.hpp"

#include <dirent.h>

#include <algorithm>
#include <cerrno>

#include "fusedopt/error.hpp"

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

/// Names in a folder, without "." and "..". Empty when the folder cannot be read.
std::vector<std::string> names_in(const std::filesystem::path& dir) {
  std::vector<std::string> names;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = ::readdir(d)) {
    std::string_view name = e->d_name;
    if (name != "." && name != "..") names.emplace_back(name);
  }
  ::closedir(d);
  std::sort(names.begin(), names.end());
  return names;
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

std::vector<ScannedFile> scan(const std::filesystem::path& dir) {
  std::vector<ScannedFile> files;
  for (const std::string& name : names_in(dir)) {
    ScannedFile file;
    file.path = dir / name;
    if (::lstat(file.path.c_str(), &file.st) != 0) continue;
    file.is_dir = S_ISDIR(file.st.st_mode);
    if (file.is_dir && name.size() == 2 && is_lower_hex(name)) {
      for (const std::string& inner : names_in(file.path)) {
        ScannedFile f;
        f.path = file.path / inner;
        if (::lstat(f.path.c_str(), &f.st) != 0) continue;
        f.is_dir = S_ISDIR(f.st.st_mode);
        if (S_ISREG(f.st.st_mode)) classify(name, inner, f);
        files.push_back(std::move(f));
      }
      continue;
    }
    files.push_back(std::move(file));  // unexpected at the top level
  }
  return files;
}

}  // namespace fusedopt::cache::detail
