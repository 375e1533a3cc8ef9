// DeviceMemory: see memory.hpp.
#include "emu/memory.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>

namespace fusedopt::emu {
namespace {

// Freed blocks kept (unusable, so a stale pointer never meets a new allocation) before they
// go back to the host: at most this many bytes and blocks.
constexpr std::size_t kQuarantineBytes = std::size_t{256} << 20;
constexpr std::size_t kQuarantineBlocks = 4096;

std::string hex(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

std::string allocation_text(const Allocation& a) {
  return std::to_string(a.size) + "-byte allocation at " + hex(a.base);
}

}  // namespace

std::uintptr_t DeviceMemory::allocate(std::size_t bytes) {
  const std::size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (!p) return 0;
  std::memset(p, 0xff, rounded);
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  live_[base] = Allocation{base, bytes};
  return base;
}

bool DeviceMemory::free(std::uintptr_t base) {
  auto it = live_.find(base);
  if (it == live_.end()) return false;
  quarantine_.push_back(it->second);
  quarantined_bytes_ += it->second.size;
  live_.erase(it);
  while (quarantine_.size() > kQuarantineBlocks || quarantined_bytes_ > kQuarantineBytes) {
    std::free(reinterpret_cast<void*>(quarantine_.front().base));
    quarantined_bytes_ -= quarantine_.front().size;
    quarantine_.pop_front();
  }
  return true;
}

void DeviceMemory::free_all() {
  while (!live_.empty()) free(live_.begin()->first);
}

const Allocation* DeviceMemory::find(std::uintptr_t address, std::size_t bytes) const {
  auto it = live_.upper_bound(address);
  if (it == live_.begin()) return nullptr;
  --it;
  const Allocation& a = it->second;
  if (address - a.base < a.size && bytes <= a.size - (address - a.base)) return &a;
  return nullptr;
}

std::string DeviceMemory::describe(std::uintptr_t address, std::size_t bytes) const {
  for (auto q = quarantine_.rbegin(); q != quarantine_.rend(); ++q) {
    if (address - q->base < q->size) {
      return std::to_string(address - q->base) + " bytes into a freed " + allocation_text(*q) +
             " (use after free)";
    }
  }
  if (address < 4096) return "a null pointer plus " + std::to_string(address);
  const Allocation* before = nullptr;
  const Allocation* after = nullptr;
  auto it = live_.upper_bound(address);
  if (it != live_.end()) after = &it->second;
  if (it != live_.begin()) before = &std::prev(it)->second;
  if (before && address - before->base < before->size) {
    return std::to_string(address - before->base) + " bytes into a " + allocation_text(*before) +
           ", running " + std::to_string(address + bytes - (before->base + before->size)) +
           " bytes past its end";
  }
  const std::uintptr_t past = before ? address - (before->base + before->size) : ~std::uintptr_t{0};
  const std::uintptr_t ahead = after ? after->base - address : ~std::uintptr_t{0};
  if (before && past <= ahead) {
    return std::to_string(past) + " bytes past the end of a " + allocation_text(*before);
  }
  if (after) return std::to_string(ahead) + " bytes before a " + allocation_text(*after);
  return "outside every device allocation (there are none)";
}

}  // namespace fusedopt::emu
