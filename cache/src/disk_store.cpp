// The disk tier's read and write paths: folder safety checks, load (every defect is a miss),
// atomic store (temp file, fsync, rename, fsync the folder) and the per-key file lock that
// makes one process compile a missing entry while the others wait and re-check.
#include "cache/disk_store.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>

#include "disk_layout.hpp"
#include "entry_format.hpp"
#include "file_lock.hpp"
#include "fusedopt/error.hpp"
#include "support/atomic_write.hpp"
#include "support/file_io.hpp"

namespace fusedopt::cache {

namespace {

using support::errno_text;

std::string octal_mode(mode_t mode) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "%04o", static_cast<unsigned>(mode & 07777));
  return buf;
}

/// mkdir -p with mode 0700 for every folder it creates (existing ones are left alone).
void create_folders(const std::filesystem::path& dir) {
  std::filesystem::path prefix;
  for (const auto& part : dir) {
    prefix /= part;
    struct stat st {};
    if (::stat(prefix.c_str(), &st) == 0) {
      if (!S_ISDIR(st.st_mode)) {
        throw CacheError("cannot create cache folder " + dir.string() + ": " + prefix.string() +
                         " exists and is not a folder; set FUSEDOPT_CACHE_DIR to another folder");
      }
      continue;
    }
    if (!support::make_dir(prefix, 0700)) {
      int err = errno;
      throw CacheError("cannot create cache folder " + dir.string() + ": mkdir " + prefix.string() +
                       ": " + errno_text(err) +
                       "; set FUSEDOPT_CACHE_DIR to a folder you can write");
    }
  }
}

/// Refuses a folder that someone else could plant entries in: cached shared objects are
/// dlopen'ed, so a writable-by-others cache is a code-injection hole. stat() follows
/// symbolic links, so a link is judged by the folder it points to.
void check_folder_is_private(const std::filesystem::path& dir) {
  struct stat st {};
  if (::stat(dir.c_str(), &st) != 0) {
    int err = errno;
    throw CacheError("cannot open cache folder " + dir.string() + ": " + errno_text(err));
  }
  if (!S_ISDIR(st.st_mode)) {
    throw CacheError("cache folder " + dir.string() +
                     " is not a folder: remove it or set FUSEDOPT_CACHE_DIR");
  }
  if (st.st_uid != ::geteuid()) {
    throw CacheError("cache folder " + dir.string() + " is owned by uid " +
                     std::to_string(st.st_uid) + ", not by you (uid " +
                     std::to_string(::geteuid()) +
                     "): use a folder you own by setting FUSEDOPT_CACHE_DIR");
  }
  if ((st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    throw CacheError("cache folder " + dir.string() + " is writable by group or others (mode " +
                     octal_mode(st.st_mode) + "): run `chmod go-w " + dir.string() +
                     "` or set FUSEDOPT_CACHE_DIR");
  }
}

}  // namespace

DiskStore::DiskStore(std::filesystem::path dir) : dir_(std::move(dir)) {
  if (dir_.empty()) {
    throw CacheError("the cache folder name is empty: set FUSEDOPT_CACHE_DIR to a folder");
  }
  std::error_code ec;
  std::filesystem::path absolute = std::filesystem::absolute(dir_, ec);
  if (!ec) dir_ = absolute.lexically_normal();
  if (!dir_.has_filename() && dir_ != dir_.root_path()) {
    dir_ = dir_.parent_path();  // drop a trailing separator so messages read cleanly
  }
  create_folders(dir_);
  check_folder_is_private(dir_);
}

std::filesystem::path DiskStore::entry_path(const Key& key, std::string_view ext) const {
  std::string hex = key.hex();
  return dir_ / hex.substr(0, 2) / (hex + "." + std::string(ext));
}

std::optional<std::string> DiskStore::load(const KeyRecord& record, std::string_view ext) const {
  detail::check_ext(ext);
  std::string record_bytes = record.serialize();
  Key key = detail::hash128(record_bytes);
  std::filesystem::path path = entry_path(key, ext);

  support::UniqueFd fd(support::open_retry(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOFOLLOW));
  if (!fd) {
    if (errno == ELOOP) ::unlink(path.c_str());  // a symbolic link is never one of ours
    return std::nullopt;
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;

  detail::EntryCheck check = detail::read_entry(fd.get(), static_cast<std::uint64_t>(st.st_size),
                                                key, detail::ReadDepth::Full);
  // Equal keys with different records is a hash collision: comparing the full record
  // bytes means it costs a recompile instead of returning the wrong binary.
  if (!check.problem.empty() || check.record_bytes != record_bytes) {
    support::unlink_if_same(path, st);
    return std::nullopt;
  }
  ::futimens(fd.get(), nullptr);  // LRU clock; failure (read-only cache) is harmless
  return std::move(check.payload);
}

void DiskStore::store(const KeyRecord& record, std::string_view ext,
                      std::string_view payload) const {
  detail::check_ext(ext);
  std::string record_bytes = record.serialize();
  Key key = detail::hash128(record_bytes);
  std::filesystem::path final_path = entry_path(key, ext);

  std::string header = detail::encode_header(record_bytes, payload);
  support::AtomicWriteOptions options;
  options.mode = 0600;
  options.create_folder = 0700;  // the shard; clear() may remove it at any time
  options.temp_stem = key.hex();
  support::AtomicWriteResult written = support::atomic_write(
      final_path,
      [&](int fd) {
        return support::write_all(fd, header.data(), header.size()) &&
               support::write_all(fd, payload.data(), payload.size());
      },
      options);
  if (written.ok()) return;
  const std::string_view step = written.step;
  const std::string why = errno_text(written.err);
  if (step == "mkdir") {
    throw CacheError("cannot create cache folder " + written.folder.string() + ": " + why);
  }
  if (step == "create") {
    throw CacheError("cannot create cache temp file " + written.temp.string() + ": " + why);
  }
  const std::filesystem::path& file = step == "fsync folder" ? written.folder : written.temp;
  throw CacheError("cannot write cache entry " + final_path.string() + " (" + written.step + " " +
                   file.string() + "): " + why);
}

std::pair<std::string, Origin> DiskStore::get_or_compile(
    const KeyRecord& record, std::string_view ext,
    const std::function<std::string()>& compile) const {
  if (auto hit = load(record, ext)) return {std::move(*hit), Origin::Disk};

  std::filesystem::path path = entry_path(record.key(), ext);
  if (!support::make_dir(path.parent_path(), 0700)) {
    int err = errno;
    throw CacheError("cannot create cache folder " + path.parent_path().string() + ": " +
                     errno_text(err));
  }
  detail::FileLock lock(detail::lock_path_for(path));
  // Whoever held the lock before us may have stored the entry while we waited.
  if (auto hit = load(record, ext)) return {std::move(*hit), Origin::Disk};
  std::string payload = compile();
  store(record, ext, payload);
  return {std::move(payload), Origin::Compiled};
}

}  // namespace fusedopt::cache
