// fusedopt-ckpt: converts optimizer checkpoints between the sharded layout of
// ShardedOptimizer::save (a folder: one file per rank and an index) and the single file of
// Optimizer::save, holding one tensor in memory at a time.
//
//   fusedopt-ckpt merge DIR FILE            a sharded checkpoint -> one file
//   fusedopt-ckpt split FILE DIR --ranks W  one file -> a sharded checkpoint for W ranks
//
// Exit codes: 0 success; 1 the conversion failed (unreadable, damaged or mismatched input,
// an unwritable output: nothing is left half-written, and a split that fails removes the
// shards it wrote); 2 bad usage (an output that is one of the inputs included).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "fusedopt/error.hpp"
#include "fusedopt/sharded.hpp"

namespace {

constexpr const char* kUsage =
    "usage: fusedopt-ckpt merge DIR FILE\n"
    "       fusedopt-ckpt split FILE DIR --ranks W\n"
    "\n"
    "Converts optimizer checkpoints between the sharded layout of ShardedOptimizer::save (DIR:\n"
    "one safetensors file per rank and index.safetensors) and the single file of\n"
    "Optimizer::save (FILE), one tensor in memory at a time. The output is written\n"
    "atomically; a split that fails removes the shards it wrote. An output that is one of\n"
    "the inputs (the index or a shard, FILE for split) is refused.\n"
    "\n"
    "exit codes: 0 success; 1 the conversion failed; 2 bad usage\n";

int usage(const char* why) {
  if (why) std::fprintf(stderr, "fusedopt-ckpt: %s\n", why);
  std::fputs(kUsage, stderr);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (argc < 2) return usage("no command");
  const std::string command = argv[1];
  try {
    if (command == "merge") {
      if (argc != 4) return usage("merge takes DIR and FILE");
      fusedopt::comm::ShardedOptimizer::merge_checkpoint(argv[2], argv[3]);
      std::printf("merged %s into %s\n", argv[2], argv[3]);
      return 0;
    }
    if (command == "split") {
      if (argc != 6 || std::strcmp(argv[4], "--ranks") != 0) {
        return usage("split takes FILE DIR --ranks W");
      }
      char* end = nullptr;
      const long ranks = std::strtol(argv[5], &end, 10);
      if (*argv[5] == '\0' || *end != '\0' || ranks < 1 || ranks > 1000000) {
        return usage("--ranks takes a positive integer");
      }
      fusedopt::comm::ShardedOptimizer::split_checkpoint(argv[2], argv[3], static_cast<int>(ranks));
      std::printf("split %s into %s for %ld ranks\n", argv[2], argv[3], ranks);
      return 0;
    }
    return usage(("unknown command '" + command + "'").c_str());
  } catch (const fusedopt::UsageError& e) {  // e.g. an output that is one of the inputs
    std::fprintf(stderr, "fusedopt-ckpt: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fusedopt-ckpt: %s\n", e.what());
    return 1;
  }
}
