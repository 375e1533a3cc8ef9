// Shared by the fake libraries beside fusedopt's CUDA emulator (fake_libnccl.cpp,
// fake_libcublas.cpp): the emulator's streams run queued work only when something waits for
// it, so a fake call that touches "device" memory first waits for the work queued on its
// stream, as a real kernel runs after it in stream order. Under the fake driver (nothing
// queued) it does nothing.
#pragma once

#include <dlfcn.h>

#include <cstdlib>

namespace fake_cuda {

inline void wait_for_stream(void* stream) {
  using Sync = int (*)(void*);
  static const Sync sync = []() -> Sync {
    const char* path = std::getenv("FUSEDOPT_CUDA_DRIVER_LIBRARY");
    void* lib = path ? dlopen(path, RTLD_NOW | RTLD_NOLOAD) : nullptr;
    if (lib == nullptr || dlsym(lib, "fusedopt_cuda_emulator") == nullptr) return nullptr;
    return reinterpret_cast<Sync>(dlsym(lib, "cuStreamSynchronize"));
  }();
  if (sync) sync(stream);
}

}  // namespace fake_cuda
