// AccessLog (access_log.hpp).
#include "emu/access_log.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace fusedopt::emu {

namespace {
/// The most accesses of one block kept (about 100 MB); the rest are counted as dropped.
constexpr std::size_t kMaxPerBlock = std::size_t{4} << 20;
}  // namespace

void AccessLog::refresh() {
  const char* p = std::getenv("FUSEDOPT_EMU_ACCESS_REPORT");
  path_ = p != nullptr ? p : "";
}

void AccessLog::begin_launch(const std::string& kernel, unsigned long long blocks,
                             unsigned threads) {
  kernel_ = kernel;
  blocks_ = blocks;
  threads_ = threads;
  dropped_ = 0;
  loads_ = stores_ = Totals{};
}

void AccessLog::begin_block(unsigned) {
  count_.clear();
  block_.clear();
}

void AccessLog::record(unsigned thread, unsigned long address, unsigned long bytes, bool write,
                       unsigned long pc) {
  if (block_.size() >= kMaxPerBlock) {
    ++dropped_;
    return;
  }
  const std::uint32_t k = count_[(std::uint64_t{pc} << 16) ^ thread]++;
  const std::uint64_t key = (std::uint64_t{write} << 63) | (std::uint64_t{thread / 32} << 32) | k;
  block_.push_back({pc, key, address, static_cast<std::uint32_t>(bytes)});
}

void AccessLog::end_block() {
  std::sort(block_.begin(), block_.end(), [](const Access& a, const Access& b) {
    if (a.pc != b.pc) return a.pc < b.pc;
    return a.key != b.key ? a.key < b.key : a.address < b.address;
  });
  std::vector<std::uint64_t> sectors;
  for (std::size_t i = 0; i < block_.size();) {
    std::size_t j = i;
    sectors.clear();
    std::uint64_t bytes = 0, last_end = 0;
    for (; j < block_.size() && block_[j].key == block_[i].key && block_[j].pc == block_[i].pc;
         ++j) {
      const Access& a = block_[j];
      for (std::uint64_t s = a.address / 32; s <= (a.address + a.bytes - 1) / 32; ++s)
        sectors.push_back(s);
      // Bytes asked for, each counted once (lanes reading one address share it).
      const std::uint64_t from = std::max<std::uint64_t>(a.address, last_end);
      if (a.address + a.bytes > from) bytes += a.address + a.bytes - from;
      last_end = std::max<std::uint64_t>(last_end, a.address + a.bytes);
    }
    std::sort(sectors.begin(), sectors.end());
    const auto distinct =
        static_cast<std::uint64_t>(std::unique(sectors.begin(), sectors.end()) - sectors.begin());
    Totals& t = (block_[i].key >> 63) ? stores_ : loads_;
    ++t.requests;
    t.sectors += distinct;
    t.ideal += std::max<std::uint64_t>(1, (bytes + 31) / 32);
    i = j;
  }
  block_.clear();
}

void AccessLog::end_launch() {
  std::FILE* f = std::fopen(path_.c_str(), "a");
  if (f == nullptr) return;
  std::fprintf(f,
               "kernel=%s blocks=%llu threads=%u load_requests=%llu load_sectors=%llu "
               "load_ideal=%llu store_requests=%llu store_sectors=%llu store_ideal=%llu "
               "dropped=%llu\n",
               kernel_.c_str(), blocks_, threads_, static_cast<unsigned long long>(loads_.requests),
               static_cast<unsigned long long>(loads_.sectors),
               static_cast<unsigned long long>(loads_.ideal),
               static_cast<unsigned long long>(stores_.requests),
               static_cast<unsigned long long>(stores_.sectors),
               static_cast<unsigned long long>(stores_.ideal),
               static_cast<unsigned long long>(dropped_));
  std::fclose(f);
}

}  // namespace fusedopt::emu
