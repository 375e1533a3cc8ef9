// A sharded save killed halfway leaves the previous checkpoint loadable. Run under mpiexec
// by tests/comm/sharded_kill.cmake in two jobs:
//   sharded_kill save DIR   3 AdamW steps, save (checkpoint A), 1 more step, then a second
//                           save in which rank 0 is killed (SIGKILL) after every shard is
//                           written and before the index commits it: the job dies.
//   sharded_kill check DIR  loads DIR into a fresh optimizer and checks that it is A: step
//                           count 3 and the state of 3 steps recomputed here, bit for bit.
// Exit code 0 when the check holds, 1 when it does not, 2 for bad arguments.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/sharded.hpp"

using namespace fusedopt;

namespace {

const std::vector<std::int64_t> kSizes = {1009, 17, 8191, 3};

struct Model {
  FlatArena arena;
  std::unique_ptr<comm::ShardedOptimizer> opt;

  explicit Model(comm::Communicator& c) {
    for (std::size_t i = 0; i < kSizes.size(); ++i)
      arena.add("w" + std::to_string(i), kSizes[i], DType::F32);
    arena.finalize();
    ParamGroup g;
    for (std::size_t i = 0; i < arena.size(); ++i) {
      float* p = static_cast<float*>(arena.param(i).data);
      for (std::int64_t k = 0; k < kSizes[i]; ++k) p[k] = 0.001f * static_cast<float>(k % 97);
      g.params.push_back(arena.param(i));
      g.grads.push_back(arena.grad(i));
    }
    opt = std::make_unique<comm::ShardedOptimizer>(c, Rule::preset("adamw"),
                                                   std::vector<ParamGroup>{g});
  }
  void step(int rank, int t) {
    for (std::size_t i = 0; i < arena.size(); ++i) {
      float* g = static_cast<float*>(arena.grad(i).data);
      for (std::int64_t k = 0; k < kSizes[i]; ++k)
        g[k] = 0.01f * static_cast<float>((k * 7 + t * 13 + rank * 5) % 23) - 0.1f;
    }
    if (!opt->step()) throw std::runtime_error("a step was skipped");
  }
  /// This rank's state "m" and "v" of every piece.
  std::vector<float> state() const {
    std::vector<float> out;
    const Optimizer& local = opt->local();
    for (int i = 0; i < static_cast<int>(local.stats().tensors); ++i) {
      for (const char* s : {"m", "v"}) {
        const Tensor t = local.state(s, i);
        const float* d = static_cast<const float*>(t.data);
        out.insert(out.end(), d, d + t.numel);
      }
    }
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3 || (std::strcmp(argv[1], "save") != 0 && std::strcmp(argv[1], "check") != 0)) {
    std::fprintf(stderr, "usage: sharded_kill save|check DIR\n");
    return 2;
  }
  const std::string dir = argv[2];
  try {
    comm::Communicator c = comm::Communicator::mpi();
    Model model(c);
    for (int t = 0; t < 3; ++t) model.step(c.rank(), t);
    if (std::strcmp(argv[1], "save") == 0) {
      model.opt->save(dir);  // checkpoint A
      model.step(c.rank(), 3);
      // tests/comm/kill_at_index.cpp, preloaded, kills rank 0 as it commits the index.
      setenv("FUSEDOPT_TEST_KILL_ON_INDEX", "1", 1);
      model.opt->save(dir);  // rank 0 dies inside
      std::fprintf(stderr, "rank %d: the second save returned; it should have been killed\n",
                   c.rank());
      return 1;
    }
    const std::vector<float> expected = model.state();  // A, recomputed
    Model fresh(c);
    fresh.opt->load(dir);
    const bool ok = fresh.opt->step_count() == 3 && fresh.state() == expected;
    std::printf("rank %d: %s\n", c.rank(),
                ok ? "the previous checkpoint loaded (step 3, state bit for bit)"
                   : "MISMATCH: the loaded checkpoint is not the previous one");
    return ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "sharded_kill: %s\n", e.what());
    return 1;
  }
}
