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
#include "support/log.hpp"
#include "trusted_open.hpp"

namespace fusedopt::cache {

namespace {

using support::errno_text;

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
  (void)detail::open_cache_folder(dir_);  // refuses a folder others could plant entries in
}

std::filesystem::path DiskStore::entry_path(const Key& key, std::string_view ext) const {
  std::string hex = key.hex();
  return dir_ / hex.substr(0, 2) / (hex + "." + std::string(ext));
}

std::optional<std::string> DiskStore::load(const KeyRecord& record, std::string_view ext,
                                           const PayloadCheck& payload_check) const {
  detail::check_ext(ext);
  std::string record_bytes = record.serialize();
  Key key = detail::hash128(record_bytes);
  const std::string hex = key.hex();
  const std::string name = hex + "." + std::string(ext);

  // Every step below the cache folder is opened relative to its parent, without following
  // links, and checked on the descriptor that is then read (no check-then-open race).
  support::UniqueFd top = detail::open_cache_folder(dir_);
  support::UniqueFd shard = detail::open_sub_folder(top.get(), dir_, hex.substr(0, 2), false);
  if (!shard) return std::nullopt;
  detail::OpenedEntry entry = detail::open_entry(shard.get(), name);
  if (!entry.fd) {
    // A symbolic link is never one of ours; the sub-folder is, so it may be removed.
    if (entry.err == ELOOP) ::unlinkat(shard.get(), name.c_str(), 0);
    return std::nullopt;
  }
  if (!S_ISREG(entry.st.st_mode)) {
    // A folder, FIFO or socket at the entry's name would fail every store's rename, and the
    // key would never be cached: ours to remove (a folder with what is in it).
    entry.fd.reset();
    (void)detail::remove_stray(shard.get(), name, entry_path(key, ext));
    return std::nullopt;
  }
  if (!entry.problem.empty()) {
    // Not ours or writable by others: never read. The sub-folder is ours and private, so
    // deleting what someone else left in it is ours to do; the caller stores a good entry.
    detail::unlink_at_if_same(shard.get(), name, entry.st);
    return std::nullopt;
  }

  detail::EntryCheck check = detail::read_entry(
      entry.fd.get(), static_cast<std::uint64_t>(entry.st.st_size), key, detail::ReadDepth::Full);
  // Equal keys with different records is a hash collision: comparing the full record
  // bytes means it costs a recompile instead of returning the wrong binary.
  if (!check.problem.empty() || check.record_bytes != record_bytes) {
    detail::unlink_at_if_same(shard.get(), name, entry.st);
    return std::nullopt;
  }
  if (payload_check) {
    if (const std::string why = payload_check(ext, check.payload); !why.empty()) {
      // Stored whole, but not a binary anyone can load: what a compiler that exited 0 with
      // bad output left, before stores were checked. Dropped, so the caller compiles again.
      support::log(support::LogLevel::Warn,
                   "dropped cache entry " + entry_path(key, ext).string() + ": " + why +
                       " (a compiler that reported success wrote it); compiling it again");
      detail::unlink_at_if_same(shard.get(), name, entry.st);
      return std::nullopt;
    }
  }
  ::futimens(entry.fd.get(), nullptr);  // LRU clock; failure (read-only cache) is harmless
  return std::move(check.payload);
}

std::string DiskStore::entry_problem(const Key& key, std::string_view ext) const {
  detail::check_ext(ext);
  const std::string hex = key.hex();
  const std::string name = hex + "." + std::string(ext);
  const std::string missing =
      "there is no entry file (removed after it was stored: by a prune to keep the cache "
      "within FUSEDOPT_CACHE_MAX_BYTES, or by another process)";
  try {
    support::UniqueFd top = detail::open_cache_folder(dir_);
    support::UniqueFd shard = detail::open_sub_folder(top.get(), dir_, hex.substr(0, 2), false);
    if (!shard) return missing;
    detail::OpenedEntry entry = detail::open_entry(shard.get(), name);
    if (!entry.fd && entry.err == ENOENT) return missing;
    if (!entry.problem.empty()) return entry_path(key, ext).string() + ": " + entry.problem;
    detail::EntryCheck check = detail::read_entry(
        entry.fd.get(), static_cast<std::uint64_t>(entry.st.st_size), key, detail::ReadDepth::Full);
    if (!check.problem.empty()) return entry_path(key, ext).string() + ": " + check.problem;
    return "";
  } catch (const CacheError& e) {
    return e.what();
  }
}

void DiskStore::store(const KeyRecord& record, std::string_view ext, std::string_view payload,
                      const PayloadCheck& check) const {
  detail::check_ext(ext);
  std::string record_bytes = record.serialize();
  Key key = detail::hash128(record_bytes);
  std::filesystem::path final_path = entry_path(key, ext);
  if (check) {
    if (const std::string why = check(ext, payload); !why.empty()) {
      throw CacheError("refusing to store cache entry " + final_path.string() + ": " + why);
    }
  }

  {
    // Creates the sub-folder (0700) if needed and refuses one that is not ours and private.
    support::UniqueFd top = detail::open_cache_folder(dir_);
    (void)detail::open_sub_folder(top.get(), dir_, key.hex().substr(0, 2), true);
  }
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
    const KeyRecord& record, std::string_view ext, const std::function<std::string()>& compile,
    const PayloadCheck& check) const {
  if (auto hit = load(record, ext, check)) return {std::move(*hit), Origin::Disk};

  std::filesystem::path path = entry_path(record.key(), ext);
  {
    support::UniqueFd top = detail::open_cache_folder(dir_);
    (void)detail::open_sub_folder(top.get(), dir_, path.parent_path().filename().string(), true);
  }
  detail::FileLock lock(detail::lock_path_for(path));
  // Whoever held the lock before us may have stored the entry while we waited.
  if (auto hit = load(record, ext, check)) return {std::move(*hit), Origin::Disk};
  std::string payload = compile();
  store(record, ext, payload, check);
  return {std::move(payload), Origin::Compiled};
}

}  // namespace fusedopt::cache
