// The emulated device's memory: host allocations tracked by address, so that every access a
// kernel makes, and every copy, can be checked against the live allocations. Freed blocks
// stay in a bounded quarantine (not reused), so a use after free is named as such.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>

namespace fusedopt::emu {

struct Allocation {
  std::uintptr_t base = 0;
  std::size_t size = 0;
};

class DeviceMemory {
 public:
  /// A fresh allocation of `bytes` (> 0), 256-byte aligned as cuMemAlloc's, filled with
  /// 0xff bytes (a NaN in every floating-point format), so a read before a write shows.
  /// Returns 0 when the host is out of memory.
  std::uintptr_t allocate(std::size_t bytes);
  /// False when `base` is not the start of a live allocation.
  bool free(std::uintptr_t base);
  /// Frees every live allocation (the context that owned them was destroyed).
  void free_all();
  /// The live allocation holding all of [address, address + bytes), or null.
  const Allocation* find(std::uintptr_t address, std::size_t bytes) const;
  /// Where `address` lies, for an error message: past or before the nearest allocation,
  /// inside a freed one, ...
  std::string describe(std::uintptr_t address, std::size_t bytes) const;
  std::size_t live_count() const { return live_.size(); }

 private:
  std::map<std::uintptr_t, Allocation> live_;
  std::deque<Allocation> quarantine_;  // freed, not yet given back, newest last
  std::size_t quarantined_bytes_ = 0;
};

}  // namespace fusedopt::emu
