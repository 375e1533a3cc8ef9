// The host side of the NCCL transport on the fake driver and the fake NCCL
// (tests/cuda_fake/fake_libcuda.cpp and fake_libnccl.cpp, loaded through
// FUSEDOPT_CUDA_DRIVER_LIBRARY and FUSEDOPT_NCCL_LIBRARY), so it is exercised on machines
// without a GPU: rank 0's unique id reaching ncclCommInitRank whole over an MPI singleton,
// what each collective launches (type, op, stream), one event per operation recorded on its
// stream and reused, errors at launch, in the background, on the device and at the
// deadline as CommErrors that name them, and who destroys or aborts which communicator.
//
// The cases run in the order they are written (doctest's default): the old-version case
// comes first, because a library that loaded stays loaded for the process's life.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

#include "common/comm_requirements.hpp"
#include "common/requirements.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/sharded.hpp"

namespace fusedopt::testing {

using fusedopt::DType;
using fusedopt::comm::CommError;
using fusedopt::comm::Communicator;
using fusedopt::comm::ReduceOp;
using fusedopt::comm::Work;
namespace testing = fusedopt::testing;

namespace {

/// A fake library's controls (the library the transport loaded: same path, same handle).
struct Controls {
  const char* (*log)() = nullptr;
  void (*reset)() = nullptr;
  void (*set)(const char*, long long) = nullptr;
  void* lib = nullptr;

  Controls(const char* path, const std::string& prefix) {
    lib = dlopen(path, RTLD_NOW);
    REQUIRE_MESSAGE(lib != nullptr, dlerror());
    log = reinterpret_cast<const char* (*)()>(dlsym(lib, (prefix + "_log").c_str()));
    reset = reinterpret_cast<void (*)()>(dlsym(lib, (prefix + "_reset").c_str()));
    set = reinterpret_cast<void (*)(const char*, long long)>(dlsym(lib, (prefix + "_set").c_str()));
    const bool found = log != nullptr && reset != nullptr && set != nullptr;
    REQUIRE_MESSAGE(found, path << " lacks its controls");
  }
  std::vector<std::string> lines() const {
    std::vector<std::string> out;
    std::istringstream in(log());
    for (std::string l; std::getline(in, l);) out.push_back(l);
    return out;
  }
  int count(const std::string& prefix) const {
    int n = 0;
    for (const std::string& l : lines()) n += l.rfind(prefix, 0) == 0;
    return n;
  }
};

struct FakeNccl : Controls {
  int (*live)() = nullptr;
  int (*init_all)(void**, int, const int*) = nullptr;
  FakeNccl() : Controls(FUSEDOPT_FAKE_NCCL, "fake_nccl") {
    live = reinterpret_cast<int (*)()>(dlsym(lib, "fake_nccl_live"));
    init_all = reinterpret_cast<int (*)(void**, int, const int*)>(dlsym(lib, "ncclCommInitAll"));
    const bool found = live != nullptr && init_all != nullptr;
    REQUIRE_MESSAGE(found, "the fake NCCL lacks fake_nccl_live or ncclCommInitAll");
    for (const char* name : {"launch_error", "async_error", "init_error", "device", "in_progress",
                             "launch_in_progress"})
      set(name, 0);
    set("version", 22809);
    reset();
  }
  /// A communicator of the test's own (what a framework would hand to nccl_wrap).
  void* make_comm(int device = 0) {
    set("device", device);
    void* comm = nullptr;
    const int devices[1] = {0};
    REQUIRE(init_all(&comm, 1, devices) == 0);
    set("device", 0);
    return comm;
  }
};

struct FakeCuda : Controls {
  FakeCuda() : Controls(FUSEDOPT_FAKE_CUDA, "fake_cuda") {
    set("event_not_ready", 0);
    set("event_error", 0);
    reset();
  }
};

/// `n` floats 0, 1, 2, ... in the fake device's memory (host memory).
fusedopt::CudaBuffer counting(std::size_t n) {
  std::vector<float> host(n);
  for (std::size_t i = 0; i < n; ++i) host[i] = static_cast<float>(i);
  fusedopt::CudaBuffer b(n * 4);
  b.copy_from_host(host.data(), n * 4);
  return b;
}

std::vector<float> read(const fusedopt::CudaBuffer& b, std::size_t n) {
  std::vector<float> host(n);
  b.copy_to_host(host.data(), n * 4);
  return host;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("an NCCL older than 2.10 is an UnavailableError; the next attempt loads again") {
    FakeNccl nccl;
    FakeCuda cuda;
    void* raw = nccl.make_comm();
    nccl.set("version", 2708);  // 2.7.8, coded as before 2.9
    try {
      (void)Communicator::nccl_wrap(raw, 0);
      FAIL("an NCCL 2.7.8 was used");
    } catch (const fusedopt::UnavailableError& e) {
      INFO(e.what());
      CHECK(contains(e.what(), "is NCCL 2.7.8, older than 2.10.0"));
      CHECK(contains(e.what(), "FUSEDOPT_NCCL_LIBRARY"));
    }
    std::string why;
    CHECK_FALSE(Communicator::available("nccl", &why));
    CHECK(contains(why, "older than 2.10.0"));
    nccl.set("version", 22809);
    CHECK(Communicator::available("nccl", &why));
    CHECK(Communicator::nccl_wrap(raw, 0).size() == 1);
  }

  TEST_CASE("a one-rank communicator over an MPI singleton: the id, the launches, the events" *
            testing::needs_mpi()) {
    FakeNccl nccl;
    FakeCuda cuda;
    const int live = nccl.live();  // the wrapped ones of other cases
    Communicator bootstrap = Communicator::mpi();
    bootstrap.set_timeout(std::chrono::seconds(30));
    {
      Communicator comm = Communicator::nccl(0, bootstrap);
      CHECK(comm.backend() == "nccl");
      CHECK(comm.size() == 1);
      CHECK(comm.rank() == 0);
      CHECK(comm.device() == fusedopt::Device::cuda(0));
      CHECK(comm.timeout() == std::chrono::seconds(30));  // the bootstrap's
      {
        // Every byte of rank 0's id (the last is 0xff) reached ncclCommInitRank;
        // NCCL 2.14 and later: a non-blocking join (ncclCommInitRankConfig).
        const std::vector<std::string> lines = nccl.lines();
        REQUIRE(lines.size() == 3);
        CHECK(lines[0].rfind("ncclGetUniqueId fake-id-", 0) == 0);
        const std::string id = lines[0].substr(std::strlen("ncclGetUniqueId "));
        CHECK(lines[1] == "ncclCommInitRankConfig non-blocking");
        CHECK(lines[2] == "ncclCommInitRank 1 0 " + id);
      }
      nccl.reset();
      cuda.reset();

      fusedopt::CudaBuffer data = counting(1000);
      comm.all_reduce(data.data(), 1000, DType::F32).wait();
      comm.all_reduce(data.data(), 500, DType::BF16, ReduceOp::Max).wait();
      comm.all_reduce(data.data(), 500, DType::F16).wait();
      fusedopt::CudaBuffer out(4000);
      comm.reduce_scatter(data.data(), out.data(), 1000, DType::F32, ReduceOp::Max).wait();
      CHECK(read(out, 1000) == read(data, 1000));  // one rank: its own block
      fusedopt::CudaBuffer gathered(4000);
      comm.all_gather(data.data(), gathered.data(), 1000, DType::F32).wait();
      CHECK(read(gathered, 1000) == read(data, 1000));
      comm.broadcast(data.data(), 1000, DType::F32, 0).wait();
      comm.barrier().wait();
      void* stream = nullptr;
      {
        fusedopt::CudaDeviceScope scope(0);
        stream = fusedopt::runtime::cuda::stream_create();
      }
      comm.all_reduce(data.data(), 7, DType::F32, ReduceOp::Sum, stream).wait();
      CHECK(nccl.lines() == std::vector<std::string>{
                                "ncclAllReduce 1000 f32 sum legacy in-place",
                                "ncclAllReduce 500 bf16 max legacy in-place",
                                "ncclAllReduce 500 f16 sum legacy in-place",
                                "ncclReduceScatter 1000 f32 max legacy",
                                "ncclAllGather 1000 f32 legacy",
                                "ncclBroadcast 1000 f32 root 0 legacy in-place",
                                "ncclAllReduce 1 f32 sum legacy in-place",  // the barrier
                                "ncclAllReduce 7 f32 sum stream in-place",
                            });
      // One event, made once and recorded after each launch on its stream.
      CHECK(cuda.count("cuEventCreate") == 1);
      CHECK(cuda.count("cuEventRecord legacy") == 7);
      CHECK(cuda.count("cuEventRecord stream") == 1);
      CHECK(cuda.count("cuEventQuery") == 8);

      // Operations in flight together each have their own event.
      cuda.reset();
      cuda.set("event_not_ready", 1);
      std::vector<Work> works;
      for (int i = 0; i < 3; ++i) works.push_back(comm.all_reduce(data.data(), 10, DType::F32));
      CHECK_FALSE(works[0].test());
      cuda.set("event_not_ready", 0);
      for (Work& w : works) w.wait();
      CHECK(cuda.count("cuEventCreate") == 2);  // one was free

      comm.check_same("plan", "buckets 3\n");  // over the bootstrap
      fusedopt::runtime::cuda::stream_destroy(stream);
      nccl.reset();
    }
    // Owned and healthy: destroyed, not aborted.
    CHECK(nccl.lines() == std::vector<std::string>{"ncclCommDestroy"});
    CHECK(nccl.live() == live);
  }

  TEST_CASE("a wrapped ncclComm_t: its device checked, no host channel, never destroyed") {
    FakeNccl nccl;
    FakeCuda cuda;
    void* raw = nccl.make_comm();
    const int live = nccl.live();
    {
      Communicator comm = Communicator::nccl_wrap(raw, 0);
      fusedopt::CudaBuffer data = counting(16);
      comm.all_reduce(data.data(), 16, DType::F32).wait();
      CHECK_THROWS_WITH_AS(comm.check_same("plan", "x"), doctest::Contains("no host-side channel"),
                           fusedopt::UsageError);
    }
    CHECK(nccl.count("ncclCommDestroy") == 0);
    CHECK(nccl.count("ncclCommAbort") == 0);
    CHECK(nccl.live() == live);

    void* elsewhere = nccl.make_comm(/*device=*/1);
    CHECK_THROWS_WITH_AS((void)Communicator::nccl_wrap(elsewhere, 0),
                         doctest::Contains("the ncclComm_t is on cuda:1, not cuda:0"),
                         fusedopt::UsageError);

    // abort() aborts even a wrapped one (NCCL has no other way to stop its operations).
    Communicator comm = Communicator::nccl_wrap(raw, 0);
    const int before_abort = nccl.live();
    comm.abort();
    CHECK(comm.broken());
    CHECK(nccl.count("ncclCommAbort") == 1);
    CHECK(nccl.live() == before_abort - 1);
    fusedopt::CudaBuffer data = counting(4);
    CHECK_THROWS_AS(comm.all_reduce(data.data(), 4, DType::F32), CommError);
  }

  TEST_CASE("an asynchronous NCCL error is a CommError naming it; the communicator is aborted") {
    FakeNccl nccl;
    FakeCuda cuda;
    Communicator comm = Communicator::nccl_wrap(nccl.make_comm(), 0);
    fusedopt::CudaBuffer data = counting(100);
    cuda.set("event_not_ready", 1);
    Work w = comm.all_reduce(data.data(), 100, DType::F32);
    nccl.set("async_error", 6);  // ncclRemoteError: a peer went away
    try {
      w.wait(std::chrono::seconds(10));
      FAIL("the wait outlived NCCL's error");
    } catch (const CommError& e) {
      INFO(e.what());
      CHECK(e.operation() == "all_reduce(sum, fp32)");
      CHECK(e.bytes() == 400);
      CHECK(contains(e.cause(), "ncclRemoteError (code 6): the fake NCCL refused"));
      CHECK(contains(e.cause(), "the communicator was aborted"));
    }
    CHECK(nccl.count("ncclCommAbort") == 1);
    CHECK(comm.broken());
    CHECK_THROWS_WITH_AS(comm.all_reduce(data.data(), 100, DType::F32),
                         doctest::Contains("the communicator is broken"), CommError);
  }

  TEST_CASE("a launch NCCL refuses is a CommError with NCCL's description and last error") {
    FakeNccl nccl;
    FakeCuda cuda;
    Communicator comm = Communicator::nccl_wrap(nccl.make_comm(), 0);
    fusedopt::CudaBuffer data = counting(8);
    nccl.set("launch_error", 4);  // ncclInvalidArgument
    try {
      (void)comm.broadcast(data.data(), 8, DType::BF16, 0);
      FAIL("a refused launch returned a Work");
    } catch (const CommError& e) {
      CHECK(e.operation() == "broadcast(bf16, root 0)");
      CHECK(e.cause() ==
            "ncclInvalidArgument (code 4): the fake NCCL refused; last error: fake last error");
    }
    CHECK(comm.broken());
  }

  TEST_CASE("a device error while polling is a CommError naming the driver's error") {
    FakeNccl nccl;
    FakeCuda cuda;
    Communicator comm = Communicator::nccl_wrap(nccl.make_comm(), 0);
    fusedopt::CudaBuffer data = counting(8);
    cuda.set("event_error", 719);  // CUDA_ERROR_LAUNCH_FAILED
    try {
      comm.all_gather(data.data(), data.data(), 8, DType::F32).wait();
      FAIL("a failed device passed");
    } catch (const CommError& e) {
      INFO(e.what());
      CHECK(contains(e.cause(), "the device reported an error"));
      CHECK(contains(e.cause(), "cuEventQuery"));
      CHECK(contains(e.cause(), "CUDA_ERROR_LAUNCH_FAILED"));
    }
    CHECK(comm.broken());
    cuda.set("event_error", 0);
  }

  TEST_CASE("an owned communicator past a deadline, or with work abandoned, is aborted at the end" *
            testing::needs_mpi()) {
    FakeNccl nccl;
    FakeCuda cuda;
    const int live = nccl.live();
    Communicator bootstrap = Communicator::mpi();
    fusedopt::CudaBuffer data = counting(8);
    SUBCASE("a missed deadline breaks it") {
      Communicator comm = Communicator::nccl(0, bootstrap);
      cuda.set("event_not_ready", 1);
      Work w = comm.all_reduce(data.data(), 8, DType::F32);
      const auto t0 = std::chrono::steady_clock::now();
      CHECK_THROWS_WITH_AS(w.wait(std::chrono::milliseconds(50)),
                           doctest::Contains("not complete after 0.05 s"), CommError);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
      CHECK(comm.broken());
    }
    SUBCASE("an abandoned operation still running one timeout later") {
      Communicator comm = Communicator::nccl(0, bootstrap);
      comm.set_timeout(std::chrono::milliseconds(100));
      cuda.set("event_not_ready", 1);
      (void)comm.all_reduce(data.data(), 8, DType::F32);  // its Work dropped at once
      CHECK_FALSE(comm.broken());
    }
    cuda.set("event_not_ready", 0);
    CHECK(nccl.count("ncclCommAbort") == 1);
    CHECK(nccl.count("ncclCommDestroy") == 0);
    CHECK(nccl.live() == live);
  }

  TEST_CASE("a failed ncclCommInitRank is a CommError naming it" * testing::needs_mpi()) {
    FakeNccl nccl;
    FakeCuda cuda;
    const int live = nccl.live();
    Communicator bootstrap = Communicator::mpi();
    nccl.set("init_error", 2);  // ncclSystemError
    CHECK_THROWS_WITH_AS((void)Communicator::nccl(0, bootstrap),
                         doctest::Contains("ncclCommInitRank(1 ranks, cuda:0) (0 bytes): "
                                           "ncclSystemError (code 2)"),
                         CommError);
    nccl.set("init_error", 0);
    CHECK(nccl.live() == live);
  }

  TEST_CASE("ranks join without blocking, within the bootstrap's deadline" * testing::needs_mpi()) {
    FakeNccl nccl;
    FakeCuda cuda;
    const int live = nccl.live();
    Communicator bootstrap = Communicator::mpi();
    bootstrap.set_timeout(std::chrono::milliseconds(200));
    SUBCASE("a join that takes a few polls") {
      nccl.set("in_progress", 5);
      Communicator comm = Communicator::nccl(0, bootstrap);
      CHECK(nccl.count("ncclCommInitRankConfig non-blocking") == 1);
      CHECK(comm.size() == 1);
    }
    SUBCASE("a join that never ends is a CommError at the deadline, the communicator aborted") {
      nccl.set("in_progress", -1);
      const auto t0 = std::chrono::steady_clock::now();
      CHECK_THROWS_WITH_AS((void)Communicator::nccl(0, bootstrap),
                           doctest::Contains("ncclCommInitRank(1 ranks, cuda:0) (0 bytes): not "
                                             "every rank joined within the deadline of 0.2 s"),
                           CommError);
      CHECK(std::chrono::steady_clock::now() - t0 < std::chrono::seconds(5));
      CHECK(nccl.count("ncclCommAbort") == 1);
    }
    SUBCASE("a launch still enqueueing is waited for, then tracked by its event") {
      Communicator comm = Communicator::nccl(0, bootstrap);
      fusedopt::CudaBuffer data = counting(4);
      nccl.set("launch_in_progress", 1);
      nccl.set("in_progress", 3);
      comm.all_reduce(data.data(), 4, DType::F32).wait();
      CHECK(read(data, 4) == std::vector<float>{0, 1, 2, 3});
      CHECK(cuda.count("cuEventRecord") >= 1);
      CHECK_FALSE(comm.broken());
    }
    SUBCASE("a launch that never finishes enqueueing is a CommError at the deadline") {
      Communicator comm = Communicator::nccl(0, bootstrap);
      fusedopt::CudaBuffer data = counting(4);
      nccl.set("launch_in_progress", 1);
      nccl.set("in_progress", -1);
      CHECK_THROWS_WITH_AS((void)comm.all_reduce(data.data(), 4, DType::F32),
                           doctest::Contains("did not finish enqueueing it within the deadline "
                                             "of 0.2 s"),
                           CommError);
      CHECK(comm.broken());
      CHECK(nccl.count("ncclCommAbort") == 1);
    }
    nccl.set("in_progress", 0);
    nccl.set("launch_in_progress", 0);
    CHECK(nccl.live() == live);
  }

  TEST_CASE("a ShardedOptimizer over NCCL on CUDA tensors: its collectives in the step's stream" *
            testing::needs_mpi() * testing::needs_nvrtc()) {
    FakeNccl nccl;
    FakeCuda cuda;
    Communicator bootstrap = Communicator::mpi();
    Communicator comm = Communicator::nccl(0, bootstrap);
    // Parameters and gradients: one buffer per dtype, in parameter order.
    const std::vector<std::int64_t> sizes = {1000, 70001, 0, 3};
    std::int64_t total = 0;
    for (std::int64_t n : sizes) total += n;
    fusedopt::CudaBuffer params = counting(static_cast<std::size_t>(total));
    fusedopt::CudaBuffer grads = counting(static_cast<std::size_t>(total));
    fusedopt::ParamGroup group;
    std::int64_t at = 0;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto view = [&](const fusedopt::CudaBuffer& b) {
        return static_cast<void*>(static_cast<char*>(b.data()) + at * 4);
      };
      const std::string name = "w" + std::to_string(i);
      group.params.push_back({view(params), sizes[i], DType::F32, fusedopt::Device::cuda(0), name});
      group.grads.push_back({view(grads), sizes[i], DType::F32, fusedopt::Device::cuda(0), name});
      at += sizes[i];
    }
    void* stream = nullptr;
    {
      fusedopt::CudaDeviceScope scope(0);
      stream = fusedopt::runtime::cuda::stream_create();
    }
    for (int stage : {1, 2}) {
      CAPTURE(stage);
      fusedopt::comm::ShardOptions options;
      options.stage = stage;
      fusedopt::comm::ShardedOptimizer opt(comm, fusedopt::Rule::preset("lamb"), {group}, options);
      nccl.reset();
      CHECK(opt.step(stream));  // the fake runs no kernel: nothing non-finite, taken
      CHECK(opt.step_scaled(0.5f, stream));
      INFO(std::string(nccl.log()));
      // Per step, all in the step's stream: the gradients reduced (one rank: one bucket of
      // everything, all-reduced or reduced to its owner); pass 0's global totals combined in
      // place (the clipping norm by sum, the grad check by max); pass 1's per-tensor norms
      // (4 parameters x 2 columns, one row per parameter whatever the pieces) staged and
      // combined; the parameters gathered from their owner.
      const std::vector<std::string> step = {
          stage == 1 ? "ncclAllReduce 71004 f32 sum stream in-place"
                     : "ncclReduce 71004 f32 sum root 0 stream in-place",
          "ncclAllReduce 1 f64 sum stream in-place", "ncclAllReduce 1 f64 max stream in-place",
          "ncclAllReduce 8 f64 sum stream in-place",
          "ncclBroadcast 71004 f32 root 0 stream in-place"};
      std::vector<std::string> two = step;
      two.insert(two.end(), step.begin(), step.end());
      CHECK(nccl.lines() == two);
    }
    // Tensors of another device than the communicator's are refused, naming them.
    fusedopt::ParamGroup host;
    std::vector<float> hp(10), hg(10);
    host.params.push_back({hp.data(), 10, DType::F32, fusedopt::Device::host(), "h"});
    host.grads.push_back({hg.data(), 10, DType::F32, fusedopt::Device::host(), "h"});
    CHECK_THROWS_WITH_AS(
        fusedopt::comm::ShardedOptimizer(comm, fusedopt::Rule::preset("sgd"), {host}),
        "ShardedOptimizer: param 0 ('h') and its grad live on host and host; the nccl "
        "communicator reduces memory of cuda:0",
        fusedopt::UsageError);
    {
      fusedopt::CudaDeviceScope scope(0);
      fusedopt::runtime::cuda::stream_destroy(stream);
    }
  }
}

}  // namespace fusedopt::testing
