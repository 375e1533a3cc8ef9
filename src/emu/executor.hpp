// Runs one kernel launch of an emulator image on the CPU: each block's threads as fibers
// (glibc ucontext to create them, _setjmp/_longjmp to switch), switched at __syncthreads;
// blocks in a shuffled order and threads resumed in a varied order after each barrier, both
// from a seeded generator (FUSEDOPT_EMU_SEED replays). What a GPU or compute-sanitizer
// would catch is an error naming the kernel, block and thread: an access outside every live
// allocation, a misaligned vector access, a barrier not every thread reaches.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "emu/memory.hpp"

struct fo_emu_module;

namespace fusedopt::emu {

/// A kernel of a loaded image.
struct Kernel {
  std::string name;
  fo_emu_module* module = nullptr;
  void (*entry)(void** params) = nullptr;
  std::vector<std::size_t> param_sizes;
};

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
  unsigned long long count() const { return 1ULL * x * y * z; }
};

/// How a launch ended: 0 (CUDA_SUCCESS), or a CUresult with what happened in `message`.
struct LaunchResult {
  int code = 0;
  std::string message;
};

class Executor {
 public:
  explicit Executor(DeviceMemory& memory);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  /// Runs `kernel` over `grid` x `block` with cuLaunchKernel's `params`. The caller holds
  /// the driver's lock (one launch at a time) and checked the dimensions.
  LaunchResult run(const Kernel& kernel, Dim3 grid, Dim3 block, void** params);

  /// The seed of the block and thread orders (FUSEDOPT_EMU_SEED, else a fresh one).
  std::uint64_t seed() const { return seed_; }
  /// Restarts the orders from `seed` (FUSEDOPT_EMU_SEED's effect, for tests).
  void set_seed(std::uint64_t seed);

  struct Impl;  // the fibers and the launch in progress (executor.cpp)

 private:
  Impl* impl_;
  std::uint64_t seed_;
};

}  // namespace fusedopt::emu
