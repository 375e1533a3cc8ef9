// The emulator's record of how a launch touches device memory, for FUSEDOPT_EMU_ACCESS_REPORT:
// the n-th execution of one instruction (the call site of the access check) by the lanes of a
// warp is one warp-wide request, as a GPU issues it (lanes that run a loop fewer times make
// the later requests partial), and each request is counted in 32-byte sectors against the
// fewest that could hold the bytes it asked for, as a GPU's memory system counts them. A coalesced
// fp32 load by a warp is 4 sectors for 4; a strided one up to 32. One line per launch is appended
// to the report file.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace fusedopt::emu {

class AccessLog {
 public:
  /// Reads FUSEDOPT_EMU_ACCESS_REPORT again (at each launch, so a test can set it): off
  /// (records nothing) when unset or empty.
  void refresh();
  bool on() const { return !path_.empty(); }
  void begin_launch(const std::string& kernel, unsigned long long blocks, unsigned threads);
  /// A block of `threads` threads starts (its requests are counted when it ends).
  void begin_block(unsigned threads);
  void record(unsigned thread, unsigned long address, unsigned long bytes, bool write,
              unsigned long pc);
  void end_block();
  /// Appends the launch's line to the report file.
  void end_launch();

 private:
  struct Access {
    std::uint64_t pc;   ///< the instruction
    std::uint64_t key;  ///< write, warp and the lane's execution number of the instruction
    std::uint64_t address;
    std::uint32_t bytes;
  };
  struct Totals {
    std::uint64_t requests = 0, sectors = 0, ideal = 0;
  };
  std::string path_;
  std::string kernel_;
  unsigned long long blocks_ = 0;
  unsigned threads_ = 0;
  /// Per (thread, instruction) of the block: how often the thread ran it so far.
  std::unordered_map<std::uint64_t, std::uint32_t> count_;
  std::vector<Access> block_;  ///< the running block's accesses
  std::uint64_t dropped_ = 0;  ///< accesses over the per-block cap, not counted
  Totals loads_, stores_;
};

}  // namespace fusedopt::emu
