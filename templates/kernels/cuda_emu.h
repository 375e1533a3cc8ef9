// The CUDA emulation header: put before a CUDA translation unit (the kernel source NVRTC
// compiles, unchanged), it lets the host C++ compiler build that source into an image for
// fusedopt's emulating CUDA driver (libfusedopt-cuda-emu.so), which runs each CUDA thread as
// a fiber on the CPU. It maps CUDA's keywords, built-in variables, barriers and math to the
// host, and checks every memory access the kernel makes (the image is compiled with
// -fsanitize=kernel-address, whose calls land in the __asan_* functions below). Like the
// generated sources it includes no header. The driver includes this file too (with
// FO_EMU_DRIVER defined) for the ABI between the two: the structures below.
#ifndef FUSEDOPT_CUDA_EMU_H
#define FUSEDOPT_CUDA_EMU_H

// Bump when you change this: any structure below or the image's exported entry points.
#define FO_EMU_ABI_VERSION 2
/// An image starts with these 8 bytes, then the ABI version (uint32), 4 reserved bytes, the
/// shared object's size (uint64) and the shared object.
#define FO_EMU_IMAGE_MAGIC "FOEMUIMG"
#define FO_EMU_IMAGE_HEADER_BYTES 24

struct fo_emu_dim3 {
  unsigned x, y, z;
};

/// One CUDA thread as the kernel sees it. The driver keeps it at the top of the thread's
/// fiber stack, so the kernel's reads of it are accesses to its own stack.
struct fo_emu_thread {
  fo_emu_dim3 thread_idx, block_idx, block_dim, grid_dim;
  unsigned long stack_lo;  ///< the fiber's stack: [stack_lo, stack_lo + stack_len)
  unsigned long stack_len;
};

/// What an image shares with the driver: set by the driver, read by the kernel's code.
struct fo_emu_module {
  int abi_version;
  fo_emu_thread* current;   ///< the thread running now
  unsigned long shared_lo;  ///< the image's __shared__ variables: [shared_lo, +shared_len)
  unsigned long shared_len;
  unsigned long hit_lo;   ///< the device allocation the last checked access fell in
  unsigned long hit_len;  ///< (0: none yet this launch)
  /// An access the fast checks did not place: the driver finds its allocation, or reports
  /// it and abandons the launch (then it does not return).
  void (*slow_access)(unsigned long address, unsigned long bytes, int write);
  /// A vector access not aligned to its size: reported, and the launch abandoned.
  void (*misaligned)(unsigned long address, unsigned long bytes, int write);
  /// __syncthreads (predicate -1) and __syncthreads_or: waits for the block's other threads
  /// at the same barrier; returns whether any thread's predicate was non-zero.
  int (*barrier)(int line, int predicate);
  /// Non-zero while the driver records every device access (FUSEDOPT_EMU_ACCESS_REPORT):
  /// each one outside the thread's stack and shared memory goes to record_access first,
  /// with the address of the instruction that made it.
  int record;
  void (*record_access)(unsigned long address, unsigned long bytes, int write, unsigned long pc);
  /// A vector access being recorded (FO_VECTOR_ACCESS): the host compiler may split it into
  /// element accesses, which it covers ([vector_lo, vector_end), vector_left bytes to go).
  unsigned long vector_lo, vector_end, vector_left;
};

#ifndef FO_EMU_DRIVER

#define FO_EMU 1
#define __CUDACC__ 1
#define FO_EMU_HIDDEN __attribute__((visibility("hidden")))
#define FO_EMU_EXPORT extern "C" __attribute__((visibility("default")))
#define FO_EMU_NOSAN __attribute__((no_sanitize_address))
#define FO_EMU_UNCHECKED FO_EMU_NOSAN FO_EMU_HIDDEN

// ---- CUDA's keywords ---------------------------------------------------------------------
#define __device__
#define __host__
// The image's build preprocesses the source once with FO_EMU_GLOBAL_MARK defined as a word
// it looks for, to list the __global__ functions.
#define __global__ FO_EMU_GLOBAL_MARK
#ifndef FO_EMU_GLOBAL_MARK
#define FO_EMU_GLOBAL_MARK
#endif
#define __forceinline__ inline __attribute__((always_inline))
#define __noinline__ __attribute__((noinline))
#define __restrict__ __restrict
#define __launch_bounds__(...)
// Blocks run one at a time, so a block's shared memory can be a static variable. An image
// has no other zero-initialised data (fo_emu_state is initialised: it lives in .data), so
// its .bss is exactly its shared memory, which the driver fills with a NaN pattern before
// each block.
#define __shared__ static

static fo_emu_module fo_emu_state = {FO_EMU_ABI_VERSION};

// ---- built-in variables ------------------------------------------------------------------
#define threadIdx (fo_emu_state.current->thread_idx)
#define blockIdx (fo_emu_state.current->block_idx)
#define blockDim (fo_emu_state.current->block_dim)
#define gridDim (fo_emu_state.current->grid_dim)

// ---- barriers ----------------------------------------------------------------------------
#define __syncthreads() ((void)fo_emu_state.barrier(__LINE__, -1))
#define __syncthreads_or(predicate) fo_emu_state.barrier(__LINE__, (predicate) ? 1 : 0)

// ---- math (the host's; results may differ from the GPU's in the last bits) --------------
#define sqrtf __builtin_sqrtf
#define expf __builtin_expf
#define logf __builtin_logf
#define powf __builtin_powf
#define tanhf __builtin_tanhf
#define log1pf __builtin_log1pf
#define expm1f __builtin_expm1f
#define floorf __builtin_floorf
#define fmaf __builtin_fmaf
#define fabsf __builtin_fabsf
#define fminf __builtin_fminf
#define fmaxf __builtin_fmaxf
#define sqrt __builtin_sqrt
#define exp __builtin_exp
#define log __builtin_log
#define pow __builtin_pow
#define tanh __builtin_tanh
#define log1p __builtin_log1p
#define expm1 __builtin_expm1
#define floor __builtin_floor
#define fma __builtin_fma
#define fabs __builtin_fabs
#define fmin __builtin_fmin
#define fmax __builtin_fmax
#define isfinite __builtin_isfinite
inline float rsqrtf(float x) { return 1.0f / __builtin_sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / __builtin_sqrt(x); }
inline float __uint_as_float(unsigned int u) { return __builtin_bit_cast(float, u); }
inline unsigned int __float_as_uint(float f) { return __builtin_bit_cast(unsigned int, f); }

// ---- memory checks -----------------------------------------------------------------------
// The thread's own stack and the image's shared memory are always valid; the last device
// allocation hit is checked inline; everything else asks the driver.
// `pc`: the kernel's instruction that made the access (recorded accesses only).
FO_EMU_UNCHECKED inline void fo_emu_access(unsigned long a, unsigned long n, int write, void* pc) {
  fo_emu_module& s = fo_emu_state;
  const fo_emu_thread* t = s.current;
  if (a - t->stack_lo < t->stack_len) return;
  if (a - s.shared_lo < s.shared_len && n <= s.shared_len - (a - s.shared_lo)) return;
  if (s.record) {
    if (s.vector_left > 0 && a >= s.vector_lo && a + n <= s.vector_end) {
      s.vector_left = n < s.vector_left ? s.vector_left - n : 0;  // part of the vector access
    } else {
      s.record_access(a, n, write, (unsigned long)pc);
    }
  }
  if (a - s.hit_lo < s.hit_len && n <= s.hit_len - (a - s.hit_lo)) return;
  s.slow_access(a, n, write);
}
#define FO_EMU_CHECKS(N)                                                        \
  extern "C" FO_EMU_UNCHECKED void __asan_load##N##_noabort(unsigned long a) {  \
    fo_emu_access(a, N, 0, __builtin_return_address(0));                        \
  }                                                                             \
  extern "C" FO_EMU_UNCHECKED void __asan_store##N##_noabort(unsigned long a) { \
    fo_emu_access(a, N, 1, __builtin_return_address(0));                        \
  }
FO_EMU_CHECKS(1)
FO_EMU_CHECKS(2)
FO_EMU_CHECKS(4)
FO_EMU_CHECKS(8)
FO_EMU_CHECKS(16)
#undef FO_EMU_CHECKS
extern "C" FO_EMU_UNCHECKED void __asan_loadN_noabort(unsigned long a, unsigned long n) {
  fo_emu_access(a, n, 0, __builtin_return_address(0));
}
extern "C" FO_EMU_UNCHECKED void __asan_storeN_noabort(unsigned long a, unsigned long n) {
  fo_emu_access(a, n, 1, __builtin_return_address(0));
}
extern "C" FO_EMU_UNCHECKED void __asan_handle_no_return() {}

/// A vector load or store (the skeleton's 4-element staging): the GPU needs the address
/// aligned to the access size. Recorded as the one access the GPU makes.
FO_EMU_UNCHECKED __attribute__((noinline)) void fo_emu_vector_access(const void* p,
                                                                     unsigned long bytes,
                                                                     int write) {
  fo_emu_module& s = fo_emu_state;
  const unsigned long a = (unsigned long)p;
  if (a % bytes != 0) s.misaligned(a, bytes, write);
  if (s.record) {
    s.record_access(a, bytes, write, (unsigned long)__builtin_return_address(0));
    s.vector_lo = a;
    s.vector_end = a + bytes;
    s.vector_left = bytes;
  }
}
#define FO_VECTOR_ACCESS(address, bytes, write) fo_emu_vector_access((address), (bytes), (write))

// ---- entry points ------------------------------------------------------------------------
// The driver calls a kernel through fo_emu_entry_<name>(params): params[k] points at the
// k-th argument, as cuLaunchKernel's kernelParams; fo_emu_sizes_<name> gives the argument
// sizes (for stream capture, which copies them). The image's build lists the kernels (its
// __global__ functions) and appends FO_EMU_KERNEL(name) for each.
template <unsigned long... I>
struct fo_emu_indices {};
template <unsigned long N, unsigned long... I>
struct fo_emu_make_indices : fo_emu_make_indices<N - 1, N - 1, I...> {};
template <unsigned long... I>
struct fo_emu_make_indices<0, I...> {
  typedef fo_emu_indices<I...> type;
};
template <typename T>
struct fo_emu_value {
  typedef T type;
};
template <typename T>
struct fo_emu_value<const T> {
  typedef T type;
};
template <typename... A, unsigned long... I>
FO_EMU_UNCHECKED void fo_emu_call(void (*f)(A...), void** params, fo_emu_indices<I...>) {
  f(*(typename fo_emu_value<A>::type*)params[I]...);
}
template <typename... A>
FO_EMU_UNCHECKED void fo_emu_invoke(void (*f)(A...), void** params) {
  fo_emu_call(f, params, typename fo_emu_make_indices<sizeof...(A)>::type());
}
template <typename... A>
FO_EMU_UNCHECKED int fo_emu_param_sizes(void (*)(A...), unsigned long* sizes, int capacity) {
  const unsigned long s[] = {sizeof(A)..., 0};
  for (int k = 0; k < (int)sizeof...(A) && k < capacity; ++k) sizes[k] = s[k];
  return (int)sizeof...(A);
}
#define FO_EMU_KERNEL(name)                                                                \
  FO_EMU_EXPORT FO_EMU_NOSAN void fo_emu_entry_##name(void** params) {                     \
    fo_emu_invoke(name, params);                                                           \
  }                                                                                        \
  FO_EMU_EXPORT FO_EMU_NOSAN int fo_emu_sizes_##name(unsigned long* sizes, int capacity) { \
    return fo_emu_param_sizes(name, sizes, capacity);                                      \
  }

// The image's .bss, from the linker.
extern char __bss_start[] __attribute__((visibility("hidden")));
extern char _end[] __attribute__((visibility("hidden")));

/// The image's one initialisation: hands the driver the shared state it fills in.
FO_EMU_EXPORT FO_EMU_NOSAN fo_emu_module* fo_emu_module_init(int driver_abi_version) {
  if (driver_abi_version != FO_EMU_ABI_VERSION) return 0;
  fo_emu_state.abi_version = FO_EMU_ABI_VERSION;
  fo_emu_state.shared_lo = (unsigned long)__bss_start;
  fo_emu_state.shared_len = (unsigned long)(_end - __bss_start);
  return &fo_emu_state;
}

#endif  // FO_EMU_DRIVER
#endif  // FUSEDOPT_CUDA_EMU_H
