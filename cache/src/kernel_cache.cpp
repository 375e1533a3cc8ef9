// KernelCache: the memory tier (per-key once across threads, LRU-bounded) in front of the
// disk tier. Compiles run outside the memory tier's mutex, so different keys compile in
// parallel while callers of the same key share one shared_future.
#include "cache/kernel_cache.hpp"

#include <future>
#include <list>
#include <mutex>
#include <unordered_map>

#include "disk_layout.hpp"
#include "entry_format.hpp"
#include "fusedopt/error.hpp"

namespace fusedopt::cache {

namespace {

struct KeyHash {
  std::size_t operator()(const Key& key) const { return static_cast<std::size_t>(key.lo ^ key.hi); }
};

using Payload = std::shared_ptr<const std::string>;

}  // namespace

struct KernelCache::Impl {
  struct Slot {
    std::uint64_t id = 0;      ///< tells our slot from one re-created after clear_memory()
    std::string record_bytes;  ///< compared on every hit: a key collision must not alias
    std::shared_future<Payload> future;
    bool ready = false;
    std::uint64_t bytes = 0;
    std::list<Key>::iterator lru_position;
  };

  mutable std::mutex mutex;
  std::unordered_map<Key, Slot, KeyHash> slots;
  std::list<Key> lru;  ///< ready slots, most recently used first
  std::uint64_t bytes = 0;
  std::uint64_t next_id = 1;
  std::string last_disk_error;

  /// Drops least recently used ready slots until the tier fits `max_bytes`. Holds `mutex`.
  void evict_to(std::uint64_t max_bytes) {
    while (bytes > max_bytes && !lru.empty()) {
      auto it = slots.find(lru.back());
      bytes -= it->second.bytes;
      slots.erase(it);
      lru.pop_back();
    }
  }

  std::pair<std::string, Origin> from_disk(const DiskStore& disk, const KeyRecord& record,
                                           std::string_view ext,
                                           const std::function<std::string()>& compile,
                                           const PayloadCheck& check, std::uint64_t max_disk_bytes);

  void note_disk_error(const std::string& what) {
    std::lock_guard<std::mutex> lock(mutex);
    last_disk_error = what;
  }
};

/// The disk tier for one memory miss. A disk failure (unwritable folder, disk full) is
/// noted and worked around rather than failing the caller's program: a cache is an
/// optimisation. Exceptions from `compile` itself propagate untouched.
std::pair<std::string, Origin> KernelCache::Impl::from_disk(
    const DiskStore& disk, const KeyRecord& record, std::string_view ext,
    const std::function<std::string()>& compile, const PayloadCheck& check,
    std::uint64_t max_disk_bytes) {
  std::optional<std::string> compiled;  // kept in case storing it fails
  bool in_compile = false;
  auto tracked = [&]() -> std::string {
    in_compile = true;
    std::string payload = compile();
    in_compile = false;
    compiled = payload;
    return payload;
  };
  try {
    auto got = disk.get_or_compile(record, ext, tracked, check);
    // What prune cannot remove (a read-only folder) only leaves the cache over its bound.
    if (got.second == Origin::Compiled) (void)disk.prune(max_disk_bytes);
    return got;
  } catch (const CacheError& e) {
    if (in_compile) throw;
    note_disk_error(e.what());
    if (compiled) return {std::move(*compiled), Origin::Compiled};
    return {compile(), Origin::Compiled};
  }
}

KernelCache::KernelCache(Options options)
    : options_(std::move(options)), impl_(std::make_shared<Impl>()) {
  if (options_.mode == Mode::On) {
    disk_ = std::make_unique<DiskStore>(options_.dir);
    // What killed processes left (stale temps, compiler build folders): best effort, a
    // failure here only leaves them for the next start or `fusedopt-cache prune`.
    try {
      (void)disk_->remove_stale();
    } catch (const std::exception&) {
    }
  }
}

KernelCache& KernelCache::global() {
  // If the environment is invalid the constructor throws and the static stays
  // uninitialised, so the next call tries (and reports) again.
  static KernelCache cache(options_from_env());
  return cache;
}

namespace {

/// `compile`, its result refused (a CacheError) when `check` refuses it: what the check
/// refuses is never stored nor handed out, an error of the compile, so that every waiter
/// gets it and the next call compiles again.
std::function<std::string()> checked_compile(const std::function<std::string()>& compile,
                                             const PayloadCheck& check, std::string_view ext,
                                             const Key& key) {
  if (!check) return compile;
  return [&compile, &check, ext = std::string(ext), key]() -> std::string {
    std::string payload = compile();
    if (const std::string why = check(ext, payload); !why.empty()) {
      throw CacheError("refusing to cache the compiled " + ext + " for key " + key.hex() + ": " +
                       why);
    }
    return payload;
  };
}

}  // namespace

KernelCache::Result KernelCache::get_or_compile(const KeyRecord& record, std::string_view ext,
                                                const std::function<std::string()>& compile,
                                                const PayloadCheck& check) {
  detail::check_ext(ext);
  std::string record_bytes = record.serialize();
  Key key = detail::hash128(record_bytes);
  const std::function<std::string()> checked = checked_compile(compile, check, ext, key);
  auto below_memory = [&]() -> std::pair<std::string, Origin> {
    if (disk_) {
      return impl_->from_disk(*disk_, record, ext, checked, check, options_.max_disk_bytes);
    }
    return {checked(), Origin::Compiled};
  };
  if (options_.mode == Mode::Off) {
    return {std::make_shared<const std::string>(checked()), Origin::Compiled, key};
  }

  Impl& impl = *impl_;
  std::unique_lock<std::mutex> lock(impl.mutex);
  if (auto it = impl.slots.find(key); it != impl.slots.end()) {
    Impl::Slot& slot = it->second;
    if (slot.record_bytes != record_bytes) {
      // A 128-bit collision: correct but uncached in memory (the disk tier also compares).
      lock.unlock();
      auto got = below_memory();
      return {std::make_shared<const std::string>(std::move(got.first)), got.second, key};
    }
    if (slot.ready) {
      impl.lru.splice(impl.lru.begin(), impl.lru, slot.lru_position);
      return {slot.future.get(), Origin::Memory, key};
    }
    std::shared_future<Payload> in_flight = slot.future;
    lock.unlock();
    return {in_flight.get(), Origin::Memory, key};  // rethrows the compile's exception
  }

  std::promise<Payload> promise;
  std::uint64_t id = impl.next_id++;
  Impl::Slot fresh;
  fresh.id = id;
  fresh.record_bytes = record_bytes;
  fresh.future = promise.get_future().share();
  impl.slots.emplace(key, std::move(fresh));
  lock.unlock();

  std::pair<std::string, Origin> got;
  try {
    got = below_memory();
  } catch (...) {
    // Remove the slot before waking the waiters, so that the next call compiles again.
    lock.lock();
    if (auto it = impl.slots.find(key); it != impl.slots.end() && it->second.id == id) {
      impl.slots.erase(it);
    }
    lock.unlock();
    promise.set_exception(std::current_exception());
    throw;
  }

  auto payload = std::make_shared<const std::string>(std::move(got.first));
  lock.lock();
  if (auto it = impl.slots.find(key); it != impl.slots.end() && it->second.id == id) {
    Impl::Slot& slot = it->second;
    slot.ready = true;
    slot.bytes = payload->size() + slot.record_bytes.size();
    impl.lru.push_front(key);
    slot.lru_position = impl.lru.begin();
    impl.bytes += slot.bytes;
    // The value is set under the lock so that a ready slot's future never blocks.
    promise.set_value(payload);
    impl.evict_to(options_.max_memory_bytes);
  } else {
    promise.set_value(payload);
  }
  return {payload, got.second, key};
}

void KernelCache::clear_memory() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  for (const Key& key : impl_->lru) impl_->slots.erase(key);
  impl_->lru.clear();
  impl_->bytes = 0;
}

std::string KernelCache::last_disk_error() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  return impl_->last_disk_error;
}

}  // namespace fusedopt::cache
