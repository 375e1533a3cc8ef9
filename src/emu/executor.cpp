// Executor: see executor.hpp. One launch runs at a time (the driver's lock), on the calling
// thread; the fibers of a block take turns on it, so the state of the running launch is
// process-wide (`active`), which is what the image's callbacks reach.
#undef _FORTIFY_SOURCE  // its longjmp check refuses jumps between fiber stacks
#include "emu/executor.hpp"

#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#define FO_EMU_DRIVER 1
#include "cuda_emu.h"
#include "emu/access_log.hpp"

namespace fusedopt::emu {
namespace {

constexpr int kSuccess = 0;
constexpr int kIllegalAddress = 700;     // CUDA_ERROR_ILLEGAL_ADDRESS
constexpr int kMisalignedAddress = 716;  // CUDA_ERROR_MISALIGNED_ADDRESS
constexpr int kLaunchFailed = 719;       // CUDA_ERROR_LAUNCH_FAILED
constexpr int kOutOfMemory = 2;          // CUDA_ERROR_OUT_OF_MEMORY

// Each fiber's stack: generous for kernel code (which keeps little on the stack), with a
// guard page below it, so an overflow faults instead of corrupting a neighbour.
constexpr std::size_t kStackBytes = std::size_t{128} << 10;

enum class State { Idle, Running, AtBarrier, Done };

struct Fiber {
  char* mapping = nullptr;  // guard page + stack + fo_emu_thread
  std::size_t mapping_bytes = 0;
  fo_emu_thread* info = nullptr;
  ucontext_t start{};
  jmp_buf context{};
  State state = State::Idle;
  bool parked = false;  // suspended in fiber_main, ready for work
  int line = 0;
  int predicate = -1;
  int barrier_result = 0;
  unsigned index = 0;  // linear thread index in the block
};

/// splitmix64: small, fast, and a full 64-bit state from any seed.
struct Rng {
  std::uint64_t s;
  std::uint64_t next() {
    std::uint64_t z = (s += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }
  std::size_t below(std::size_t n) { return static_cast<std::size_t>(next() % n); }
};

std::string dim_text(const fo_emu_dim3& d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

std::string hex(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}

}  // namespace

struct Executor::Impl {
  DeviceMemory& memory;
  Rng rng;
  AccessLog log;  ///< FUSEDOPT_EMU_ACCESS_REPORT
  std::vector<Fiber*> fibers;
  jmp_buf scheduler{};
  Fiber* current = nullptr;
  Fiber* starting = nullptr;
  // The launch in progress.
  const Kernel* kernel = nullptr;
  void** params = nullptr;
  fo_emu_module* module = nullptr;
  bool abandoned = false;
  LaunchResult failure;

  explicit Impl(DeviceMemory& m, std::uint64_t seed) : memory(m), rng{seed} {}
  ~Impl() {
    for (Fiber* f : fibers) {
      munmap(f->mapping, f->mapping_bytes);
      delete f;
    }
  }

  // ---- fibers --------------------------------------------------------------------------

  static void fiber_main();

  /// Back to the scheduler; returns when the scheduler resumes this fiber.
  void switch_out(Fiber* f) {
    if (_setjmp(f->context) == 0) _longjmp(scheduler, 1);
  }
  /// Runs `f` until it switches out (at a barrier, when done, or abandoned).
  void switch_in(Fiber* f) {
    current = f;
    module->current = f->info;
    if (_setjmp(scheduler) == 0) _longjmp(f->context, 1);
  }

  /// A fiber parked in fiber_main, its stack reused when it was abandoned mid-kernel.
  bool start(Fiber* f) {
    if (getcontext(&f->start) != 0) return false;
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    f->start.uc_stack.ss_sp = f->mapping + page;
    f->start.uc_stack.ss_size = reinterpret_cast<char*>(f->info) - (f->mapping + page);
    f->start.uc_link = nullptr;
    makecontext(&f->start, &Impl::fiber_main, 0);
    starting = f;
    if (_setjmp(scheduler) == 0) setcontext(&f->start);
    return f->parked;
  }

  Fiber* make_fiber(unsigned index) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    const std::size_t bytes = page + kStackBytes;
    void* m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (m == MAP_FAILED) return nullptr;
    mprotect(m, page, PROT_NONE);
    auto* f = new Fiber;
    f->mapping = static_cast<char*>(m);
    f->mapping_bytes = bytes;
    f->index = index;
    // The thread's record at the top of its stack: reading it is an access to the stack.
    const std::size_t record = (sizeof(fo_emu_thread) + 63) / 64 * 64;
    f->info = reinterpret_cast<fo_emu_thread*>(f->mapping + bytes - record);
    f->info->stack_lo = reinterpret_cast<unsigned long>(f->mapping + page);
    f->info->stack_len = bytes - page;
    return f;
  }

  /// At least `n` fibers, each parked and ready.
  bool ensure_fibers(unsigned n) {
    while (fibers.size() < n) {
      Fiber* f = make_fiber(static_cast<unsigned>(fibers.size()));
      if (!f) return false;
      fibers.push_back(f);
    }
    for (unsigned t = 0; t < n; ++t) {
      if (!fibers[t]->parked && !start(fibers[t])) return false;
    }
    return true;
  }

  // ---- what the image calls ------------------------------------------------------------

  /// Ends the launch from inside a fiber: this fiber and every other one not done stay
  /// where they are and are started afresh before their next use.
  [[noreturn]] void abandon(int code, std::string message) {
    failure.code = code;
    failure.message = std::move(message);
    abandoned = true;
    Fiber* f = current;
    f->parked = false;
    _longjmp(scheduler, 1);
  }

  std::string who() const {
    const fo_emu_thread& t = *current->info;
    return kernel->name + " block " + dim_text(t.block_idx) + " thread " + dim_text(t.thread_idx);
  }

  static void slow_access(unsigned long address, unsigned long bytes, int write);
  static void record_access(unsigned long address, unsigned long bytes, int write,
                            unsigned long pc);
  static void misaligned(unsigned long address, unsigned long bytes, int write);
  static int barrier(int line, int predicate);

  // ---- a launch ------------------------------------------------------------------------

  LaunchResult run(const Kernel& k, Dim3 grid, Dim3 block, void** p);
  bool run_block(const fo_emu_dim3& block_idx, Dim3 grid, Dim3 block);
  void fail_block(int code, std::string message, unsigned threads) {
    failure.code = code;
    failure.message = std::move(message);
    for (unsigned t = 0; t < threads; ++t) {
      if (fibers[t]->state != State::Done) fibers[t]->parked = false;
    }
  }
};

namespace {
Executor::Impl* active = nullptr;  // the launch in progress (the driver's lock is held)

// A fault inside a launch (an access the checks did not see, a fiber's stack overflowing
// into its guard page) is named before the process dies of it: kernel, block, thread and
// address on stderr, then the previous handler gets the fault.
struct sigaction previous_segv, previous_bus;

void on_fault(int sig, siginfo_t* info, void*) {
  const Executor::Impl* x = active;
  char buf[512];
  int n = 0;
  if (x != nullptr && x->kernel != nullptr && x->current != nullptr) {
    const fo_emu_thread& t = *x->current->info;
    const auto address = reinterpret_cast<unsigned long>(info->si_addr);
    const bool stack = address - (t.stack_lo - 4096) < 4096 + 256;
    n = std::snprintf(
        buf, sizeof buf, "fusedopt-cuda-emu: %s block (%u,%u,%u) thread (%u,%u,%u): %s at %p%s\n",
        x->kernel->name.c_str(), t.block_idx.x, t.block_idx.y, t.block_idx.z, t.thread_idx.x,
        t.thread_idx.y, t.thread_idx.z, sig == SIGSEGV ? "segmentation fault" : "bus error",
        info->si_addr, stack ? " (its stack overflowed)" : "");
  }
  if (n > 0) (void)!write(2, buf, static_cast<std::size_t>(n));
  sigaction(sig, sig == SIGSEGV ? &previous_segv : &previous_bus, nullptr);
}

/// The fault handler for the calling thread's launches, on a stack of its own (a fiber
/// whose stack overflowed has none left), unless the thread already has one.
void install_fault_handler() {
  thread_local bool alt_stack = false;
  if (!alt_stack) {
    stack_t old{};
    if (sigaltstack(nullptr, &old) == 0 && (old.ss_flags & SS_DISABLE) != 0) {
      static thread_local char memory[64 * 1024];
      stack_t ss{};
      ss.ss_sp = memory;
      ss.ss_size = sizeof memory;
      sigaltstack(&ss, nullptr);
    }
    alt_stack = true;
  }
  struct sigaction sa {};
  sa.sa_sigaction = &on_fault;
  sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGSEGV, &sa, &previous_segv);
  sigaction(SIGBUS, &sa, &previous_bus);
}

void remove_fault_handler() {
  sigaction(SIGSEGV, &previous_segv, nullptr);
  sigaction(SIGBUS, &previous_bus, nullptr);
}
}  // namespace

void Executor::Impl::fiber_main() {
  Impl& x = *active;
  Fiber* f = x.starting;
  f->parked = true;
  f->state = State::Idle;
  for (;;) {
    x.switch_out(f);  // parked: resumed with work
    x.kernel->entry(x.params);
    f->state = State::Done;
  }
}

void Executor::Impl::slow_access(unsigned long address, unsigned long bytes, int write) {
  Impl& x = *active;
  if (const Allocation* a = x.memory.find(address, bytes)) {
    x.module->hit_lo = a->base;
    x.module->hit_len = a->size;
    return;
  }
  x.abandon(kIllegalAddress, x.who() + ": " + std::to_string(bytes) + "-byte " +
                                 (write ? "store" : "load") + " at " + hex(address) + ", " +
                                 x.memory.describe(address, bytes));
}

void Executor::Impl::record_access(unsigned long address, unsigned long bytes, int write,
                                   unsigned long pc) {
  Impl& x = *active;
  x.log.record(x.current->index, address, bytes, write != 0, pc);
}

void Executor::Impl::misaligned(unsigned long address, unsigned long bytes, int write) {
  Impl& x = *active;
  std::string where;
  if (const Allocation* a = x.memory.find(address, 1)) {
    where = ", " + std::to_string(address - a->base) + " bytes into a " + std::to_string(a->size) +
            "-byte allocation at " + hex(a->base);
  }
  x.abandon(kMisalignedAddress, x.who() + ": " + std::to_string(bytes) + "-byte vector " +
                                    (write ? "store" : "load") + " at " + hex(address) +
                                    " is not aligned to " + std::to_string(bytes) + " bytes" +
                                    where);
}

int Executor::Impl::barrier(int line, int predicate) {
  Impl& x = *active;
  Fiber* f = x.current;
  f->state = State::AtBarrier;
  f->line = line;
  f->predicate = predicate;
  x.switch_out(f);
  f->state = State::Running;
  return f->barrier_result;
}

bool Executor::Impl::run_block(const fo_emu_dim3& block_idx, Dim3 grid, Dim3 block) {
  const auto threads = static_cast<unsigned>(block.count());
  if (!ensure_fibers(threads)) {
    failure = {kOutOfMemory, "the emulator could not make " + std::to_string(threads) +
                                 " fibers (stacks of " + std::to_string(kStackBytes) + " bytes)"};
    return false;
  }
  if (log.on()) log.begin_block(threads);
  // Shared memory starts as NaN bytes in every block, as fresh allocations do.
  if (module->shared_len)
    std::memset(reinterpret_cast<void*>(module->shared_lo), 0xff, module->shared_len);
  std::vector<Fiber*> order(fibers.begin(), fibers.begin() + threads);
  for (unsigned t = 0; t < threads; ++t) {
    Fiber* f = fibers[t];
    fo_emu_thread& info = *f->info;
    info.thread_idx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    info.block_idx = block_idx;
    info.block_dim = {block.x, block.y, block.z};
    info.grid_dim = {grid.x, grid.y, grid.z};
    f->state = State::Running;
  }
  for (;;) {
    // Each thread runs until its next barrier (or its end), in a fresh order each time.
    for (std::size_t i = order.size(); i > 1; --i) std::swap(order[i - 1], order[rng.below(i)]);
    for (Fiber* f : order) {
      if (f->state == State::Done) continue;
      switch_in(f);
      if (abandoned) {
        for (unsigned t = 0; t < threads; ++t) {
          if (fibers[t]->state != State::Done) fibers[t]->parked = false;
        }
        return false;
      }
    }
    const Fiber* waiting = nullptr;
    const Fiber* exited = nullptr;
    unsigned at_barrier = 0;
    int any = 0;
    for (unsigned t = 0; t < threads; ++t) {
      const Fiber* f = fibers[t];
      if (f->state == State::Done) {
        if (!exited) exited = f;
        continue;
      }
      ++at_barrier;
      if (!waiting) waiting = f;
      // Barriers are told apart by their source line (the kernel's __LINE__), not by the
      // call's return address: a compiler may copy one barrier into both arms of a branch
      // before it (tail duplication), which is still one barrier of the source.
      if (f->line != waiting->line) {
        fail_block(kLaunchFailed,
                   kernel->name + " block " + dim_text(block_idx) +
                       ": threads wait at different "
                       "barriers: thread " +
                       dim_text(waiting->info->thread_idx) + " at line " +
                       std::to_string(waiting->line) + ", thread " + dim_text(f->info->thread_idx) +
                       " at line " + std::to_string(f->line),
                   threads);
        return false;
      }
      any |= f->predicate > 0;
    }
    if (at_barrier == 0) {
      if (log.on()) log.end_block();
      return true;
    }
    if (exited) {
      fail_block(kLaunchFailed,
                 kernel->name + " block " + dim_text(block_idx) + ": the barrier at line " +
                     std::to_string(waiting->line) + " is reached by " +
                     std::to_string(at_barrier) + " of " + std::to_string(threads) +
                     " threads: thread " + dim_text(exited->info->thread_idx) +
                     " ended without reaching it",
                 threads);
      return false;
    }
    for (unsigned t = 0; t < threads; ++t) fibers[t]->barrier_result = any;
  }
}

LaunchResult Executor::Impl::run(const Kernel& k, Dim3 grid, Dim3 block, void** p) {
  kernel = &k;
  params = p;
  module = k.module;
  module->hit_lo = 0;
  module->hit_len = 0;
  module->slow_access = &Impl::slow_access;
  module->misaligned = &Impl::misaligned;
  module->barrier = &Impl::barrier;
  log.refresh();
  module->record = log.on() ? 1 : 0;
  module->record_access = &Impl::record_access;
  if (log.on()) log.begin_launch(k.name, grid.count(), static_cast<unsigned>(block.count()));
  abandoned = false;
  failure = {};
  active = this;
  install_fault_handler();
  // Blocks in a shuffled order.
  std::vector<std::uint64_t> blocks(static_cast<std::size_t>(grid.count()));
  for (std::size_t b = 0; b < blocks.size(); ++b) blocks[b] = b;
  for (std::size_t i = blocks.size(); i > 1; --i) std::swap(blocks[i - 1], blocks[rng.below(i)]);
  LaunchResult result;
  for (std::uint64_t b : blocks) {
    const fo_emu_dim3 idx = {static_cast<unsigned>(b % grid.x),
                             static_cast<unsigned>((b / grid.x) % grid.y),
                             static_cast<unsigned>(b / (1ULL * grid.x * grid.y))};
    if (!run_block(idx, grid, block)) {
      result = failure;
      break;
    }
  }
  remove_fault_handler();
  if (log.on() && result.code == kSuccess) log.end_launch();
  active = nullptr;
  kernel = nullptr;
  params = nullptr;
  module->current = nullptr;
  return result;
}

Executor::Executor(DeviceMemory& memory) {
  if (const char* s = std::getenv("FUSEDOPT_EMU_SEED"); s && *s) {
    seed_ = std::strtoull(s, nullptr, 10);
  } else {
    seed_ = std::random_device{}() ^
            static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    seed_ %= 1000000000ULL;
  }
  impl_ = new Impl(memory, seed_);
}

Executor::~Executor() { delete impl_; }

void Executor::set_seed(std::uint64_t seed) {
  seed_ = seed;
  impl_->rng.s = seed;
}

LaunchResult Executor::run(const Kernel& kernel, Dim3 grid, Dim3 block, void** params) {
  LaunchResult r = impl_->run(kernel, grid, block, params);
  if (r.code != kSuccess) r.message += " [FUSEDOPT_EMU_SEED=" + std::to_string(seed_) + "]";
  return r;
}

}  // namespace fusedopt::emu
