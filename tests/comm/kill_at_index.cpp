// Fault injection for comm_sharded_kill, on the test's side (the library has no test hook):
// preloaded (LD_PRELOAD) into the save job, it kills rank 0 with SIGKILL the moment that
// rank would commit a sharded checkpoint, renaming a file onto ".../index.safetensors",
// while FUSEDOPT_TEST_KILL_ON_INDEX is set in its environment. Every shard is on disk by
// then and the previous index is still in place. Every other rename goes through.
#include <dlfcn.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>

extern "C" int rename(const char* from, const char* to) {
  using Rename = int (*)(const char*, const char*);
  static const Rename real = reinterpret_cast<Rename>(dlsym(RTLD_NEXT, "rename"));
  static constexpr char kIndex[] = "/index.safetensors";
  const std::size_t n = std::strlen(to), k = sizeof kIndex - 1;
  const char* rank = std::getenv("OMPI_COMM_WORLD_RANK");
  if (std::getenv("FUSEDOPT_TEST_KILL_ON_INDEX") != nullptr && rank != nullptr &&
      std::strcmp(rank, "0") == 0 && n >= k && std::strcmp(to + n - k, kIndex) == 0) {
    ::raise(SIGKILL);
  }
  return real(from, to);
}
