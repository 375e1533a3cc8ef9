// The host side of the CUDA runtime on the fake driver (tests/cuda_fake/fake_libcuda.cpp,
// loaded through FUSEDOPT_CUDA_DRIVER_LIBRARY), so it is exercised on machines without a
// GPU: what an Optimizer loads (a CUBIN for the device, PTX when the driver refuses it, a
// clear error for an old driver), the launches of a step (one kernel per reduction pass,
// one wave of blocks), that a step issues no synchronisation, copy or allocation, and the
// public CudaEvent and CudaDeviceScope the comm module stands on.
// Kernels compile with the real NVRTC; nothing runs on a device.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/requirements.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/cuda.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

using namespace fusedopt;
namespace cu = fusedopt::runtime::cuda;

namespace {

/// The fake driver's own controls (the library the runtime loaded: same path, same handle).
struct Fake {
  const char* (*log)() = nullptr;
  void (*reset)() = nullptr;
  void (*set)(const char*, long long) = nullptr;
  Fake() {
    void* lib = dlopen(FUSEDOPT_FAKE_CUDA, RTLD_NOW);
    REQUIRE_MESSAGE(lib != nullptr, dlerror());
    log = reinterpret_cast<const char* (*)()>(dlsym(lib, "fake_cuda_log"));
    reset = reinterpret_cast<void (*)()>(dlsym(lib, "fake_cuda_reset"));
    set = reinterpret_cast<void (*)(const char*, long long)>(dlsym(lib, "fake_cuda_set"));
    const bool found = log != nullptr && reset != nullptr && set != nullptr;
    REQUIRE_MESSAGE(found, "the fake driver lacks its controls");
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

/// Params and grads in the fake device's memory.
struct Model {
  std::vector<std::int64_t> sizes;
  std::vector<cu::DeviceBuffer> p, g;
  explicit Model(std::vector<std::int64_t> s = {1000, 70000, 3}) : sizes(std::move(s)) {
    for (std::int64_t n : sizes) {
      p.emplace_back(n * 4);
      g.emplace_back(n * 4);
    }
  }
  ParamGroup group() {
    ParamGroup out;
    for (std::size_t i = 0; i < sizes.size(); ++i) {
      auto ptr = [](const cu::DeviceBuffer& b) {
        return reinterpret_cast<void*>(static_cast<std::uintptr_t>(b.get()));
      };
      out.params.push_back(
          {ptr(p[i]), sizes[i], DType::F32, Device::cuda(0), "p" + std::to_string(i)});
      out.grads.push_back(
          {ptr(g[i]), sizes[i], DType::F32, Device::cuda(0), "g" + std::to_string(i)});
    }
    return out;
  }
};

/// Runs `body(opt, preset)` over adamw (a separate grad check) and lamb (the check riding on
/// pass 0), capturable or not (which changes nothing on CUDA), each on a fresh Model.
template <typename Body>
void each_scaled_case(Body body) {
  for (bool capturable : {false, true}) {
    for (const char* preset : {"adamw", "lamb"}) {
      CAPTURE(capturable);
      CAPTURE(preset);
      Model m;
      OptimizerOptions options;
      options.capturable = capturable;
      Optimizer opt(Rule::preset(preset), {m.group()}, options);
      body(opt, std::string(preset));
    }
  }
}

}  // namespace

TEST_SUITE("cuda_fake") {
  TEST_CASE("an Optimizer loads a CUBIN for the device and a LAMB step is 6 launches, one wave" *
            testing::needs_nvrtc()) {
    Fake fake;
    Model m;
    fake.reset();
    Optimizer opt(Rule::preset("lamb"), {m.group()});
    CHECK(fake.count("cuModuleLoadData cubin") == 1);
    CHECK(fake.count("cuModuleLoadData ptx") == 0);
    cu::Stream stream = cu::stream_create();
    fake.reset();
    opt.step(stream);
    // 1000, 70000 and 3 elements in 64 K chunks: 4 chunks, far below one wave (2 blocks x
    // 132 SMs); finalize runs one block per tensor.
    const std::vector<std::string> want = {
        "cuLaunchKernel fusedopt_reduce_0 grid 4 block 512 stream",
        "cuLaunchKernel fusedopt_finalize grid 3 block 512 stream",
        "cuLaunchKernel fusedopt_reduce_1 grid 4 block 512 stream",
        "cuLaunchKernel fusedopt_finalize grid 3 block 512 stream",
        "cuLaunchKernel fusedopt_step grid 4 block 512 stream",
        "cuLaunchKernel fusedopt_advance_step grid 1 block 1 stream"};  // counts the step
    INFO(std::string(fake.log()));
    CHECK(fake.lines() == want);
    // 600 tensors: 600 chunks; the update runs a block per chunk, but a quantized one runs
    // one wave, the occupancy (2) times the SMs (132) (bench/gpu-notes.md: measured so).
    Model many(std::vector<std::int64_t>(600, 10));
    Optimizer wide(Rule::preset("sgd"), {many.group()});
    fake.reset();
    wide.step(stream);
    CHECK(fake.lines() ==
          std::vector<std::string>{"cuLaunchKernel fusedopt_step grid 600 block 512 stream",
                                   "cuLaunchKernel fusedopt_advance_step grid 1 block 1 stream"});
    Model large(std::vector<std::int64_t>(600, 4096));  // quantized (smaller ones stay fp32)
    Optimizer quantized(Rule::preset("adamw8bit"), {large.group()});
    fake.reset();
    quantized.step(stream);
    INFO(std::string(fake.log()));
    CHECK(fake.count("cuLaunchKernel fusedopt_step grid 264 block 512 stream") == 1);
    cu::stream_destroy(stream);
  }

  TEST_CASE("the public CUDA helpers share one backend per device: a copy is a copy") {
    Fake fake;
    cu::DeviceBuffer d(64);
    double x = 1.5, y = 0;
    fusedopt::cuda_copy_to_device(reinterpret_cast<void*>(static_cast<std::uintptr_t>(d.get())), &x,
                                  sizeof x);  // may make the process's backend, once
    fake.reset();
    for (int i = 0; i < 3; ++i) {
      fusedopt::cuda_copy_to_host(&y, reinterpret_cast<void*>(static_cast<std::uintptr_t>(d.get())),
                                  sizeof y);
      fusedopt::CudaBuffer b(16);
    }
    INFO(std::string(fake.log()));
    CHECK(y == 1.5);
    // One wait per copy (for the queued work), no allocation but the buffers' own: no backend
    // made and torn down (which waited for the device again) per call.
    CHECK(fake.count("cuCtxSynchronize") == 3);
    CHECK(fake.count("cuMemAlloc") == 3);
    CHECK(fake.count("cuMemcpyDtoH") == 3);
  }

  TEST_CASE("steps, capturable or not, issue no synchronisation, copy or allocation" *
            testing::needs_nvrtc()) {
    Fake fake;
    for (bool capturable : {false, true}) {
      CAPTURE(capturable);
      Model m;
      OptimizerOptions options;
      options.capturable = capturable;  // changes nothing: every CUDA step is capturable
      Optimizer opt(Rule::preset("adamw"), {m.group()}, options);
      cu::Stream stream = cu::stream_create();
      fake.reset();
      for (int i = 0; i < 3; ++i) opt.step(stream);
      INFO(std::string(fake.log()));
      // The update, then the device's count of steps (not skipped: no flag).
      const std::vector<std::string> want = {
          "cuLaunchKernel fusedopt_step grid 4 block 512 stream",
          "cuLaunchKernel fusedopt_advance_step grid 1 block 1 stream"};
      std::vector<std::string> three;
      for (int i = 0; i < 3; ++i) three.insert(three.end(), want.begin(), want.end());
      CHECK(fake.lines() == three);
      CHECK(opt.stats().launches_per_step == 2);
      // The step count is the device's: reading it is what waits.
      fake.reset();
      CHECK(opt.step_count() == 0);  // the fake runs no kernel: its count stays 0
      CHECK(fake.count("cuCtxSynchronize") >= 1);
      cu::stream_destroy(stream);
    }
  }

  TEST_CASE("set_hyper on a stream is ordered there and waits for nothing" *
            testing::needs_nvrtc()) {
    Fake fake;
    Model m;
    Model second({5, 6});
    ParamGroup other = second.group();
    for (Tensor& t : other.params) t.name = "other_" + t.name;
    Optimizer opt(Rule::preset("adamw"), {m.group(), other});
    cu::Stream stream = cu::stream_create();
    fake.reset();
    opt.step(stream);
    opt.set_hyper("lr", 0.5, std::nullopt, stream);  // an LR schedule, every step
    opt.step(stream);
    INFO(std::string(fake.log()));
    for (const char* banned :
         {"cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpyHtoD ", "cuMemAlloc", "cuMemFree"}) {
      CAPTURE(banned);
      CHECK(fake.count(banned) == 0);
    }
    // One copy per group (its 6 hyper values, 48 bytes), between the steps.
    const std::vector<std::string> lines = fake.lines();
    REQUIRE(lines.size() == 6);
    CHECK(lines[2] == "cuMemcpyHtoDAsync 48");
    CHECK(lines[3] == "cuMemcpyHtoDAsync 48");
    CHECK(opt.hyper("lr", 0) == 0.5);
    CHECK(opt.hyper("lr", 1) == 0.5);
    fake.reset();
    opt.set_hyper("lr", 0.25, 1, stream);
    CHECK(fake.count("cuMemcpyHtoDAsync") == 2);
    // Without a stream it waits for everything queued on the device.
    fake.reset();
    opt.set_hyper("lr", 0.125);
    CHECK(fake.count("cuCtxSynchronize") >= 1);
    CHECK_THROWS_WITH_AS(opt.set_hyper("lr", 1.0, 2, stream),
                         "set_hyper('lr'): there is no group 2 (the optimizer has 2 groups)",
                         UsageError);
    cu::stream_destroy(stream);
  }

  TEST_CASE("a step_scaled checks and skips on the device, capturable or not: nothing waits" *
            testing::needs_nvrtc()) {
    Fake fake;
    each_scaled_case([&](Optimizer& opt, const std::string& preset) {
      cu::Stream stream = cu::stream_create();
      fake.reset();
      std::vector<StepResult> results;
      for (int i = 0; i < 3; ++i) results.push_back(opt.step_scaled(0.5f, stream));
      INFO(std::string(fake.log()));
      for (const char* banned :
           {"cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpy", "cuMemAlloc", "cuMemFree"}) {
        CAPTURE(banned);
        CHECK(fake.count(banned) == 0);
      }
      for (const StepResult& r : results) CHECK_FALSE(r.known());
      std::vector<std::string> want;
      if (preset == "adamw") {
        // No pass before the update reads the gradients: the flag is zeroed, the check
        // sets it, and the update and the step's count do nothing when it is set.
        want = {"cuMemsetD8Async 8", "cuLaunchKernel fusedopt_check grid 4 block 512 stream",
                "cuLaunchKernel fusedopt_step grid 4 block 512 stream skip",
                "cuLaunchKernel fusedopt_advance_step grid 1 block 1 stream skip"};
      } else {
        // The check rides on pass 0, which reads the gradients and writes nothing; its
        // finalize writes the flag (the grad-check total); every later launch skips on it.
        want = {"cuLaunchKernel fusedopt_reduce_0 grid 4 block 512 stream check",
                "cuLaunchKernel fusedopt_finalize grid 3 block 512 stream",
                "cuLaunchKernel fusedopt_reduce_1 grid 4 block 512 stream skip",
                "cuLaunchKernel fusedopt_finalize grid 3 block 512 stream skip",
                "cuLaunchKernel fusedopt_step grid 4 block 512 stream skip",
                "cuLaunchKernel fusedopt_advance_step grid 1 block 1 stream skip"};
      }
      std::vector<std::string> three;
      for (int i = 0; i < 3; ++i) three.insert(three.end(), want.begin(), want.end());
      CHECK(fake.lines() == three);
      // An unscaled step after them skips on nothing.
      fake.reset();
      opt.step(stream);
      CHECK(std::string(fake.log()).find("skip") == std::string::npos);
      CHECK(std::string(fake.log()).find("check") == std::string::npos);
      // A verdict is read back when asked (the last step's only), and kept.
      StepResult last = opt.step_scaled(0.25f, stream);
      fake.reset();
      CHECK(last.taken());  // the fake's flag stays 0: taken
      CHECK(last.known());
      CHECK(fake.count("cuCtxSynchronize") == 1);
      CHECK(fake.count("cuMemcpyDtoH 8") == 1);
      fake.reset();
      CHECK(last);  // kept: no second read
      CHECK(fake.lines().empty());
      CHECK_THROWS_WITH_AS(results[0].taken(),
                           doctest::Contains("the optimizer has stepped again since"), UsageError);
      StepResult orphan = opt.step_scaled(0.25f, stream);
      { Optimizer gone = std::move(opt); }
      CHECK_THROWS_WITH_AS(orphan.taken(), doctest::Contains("the optimizer of this step is gone"),
                           UsageError);
      cu::stream_destroy(stream);
    });
  }

  TEST_CASE("scalar states: written once after the update, before the count, skipped with it" *
            testing::needs_nvrtc()) {
    Fake fake;
    Model m({1000, 0, 70000, 3});  // an empty tensor keeps its scalar too
    fake.reset();
    Optimizer opt(Rule::preset("nadam"), {m.group()});
    // Construction: the initial values of every tensor's scalars (one thread per tensor),
    // then the state tensors'.
    {
      INFO(std::string(fake.log()));
      CHECK(fake.count("cuLaunchKernel fusedopt_scalars grid 1 block 512 legacy") == 1);
      CHECK(fake.count("cuLaunchKernel fusedopt_init grid 4 block 512 legacy") == 1);
    }
    CHECK(opt.stats().launches_per_step == 3);
    cu::Stream stream = cu::stream_create();
    fake.reset();
    opt.step(stream);
    opt.step_scaled(0.5f, stream);
    INFO(std::string(fake.log()));
    CHECK(fake.lines() ==
          std::vector<std::string>{
              "cuLaunchKernel fusedopt_step grid 4 block 512 stream",
              "cuLaunchKernel fusedopt_scalars grid 1 block 512 stream",
              "cuLaunchKernel fusedopt_advance_step grid 1 block 1 stream",
              // Scaled: the check sets the flag, and the update, the scalars' write and the
              // count all do nothing when it is set (a skipped step changes no scalar).
              "cuMemsetD8Async 8", "cuLaunchKernel fusedopt_check grid 4 block 512 stream",
              "cuLaunchKernel fusedopt_step grid 4 block 512 stream skip",
              "cuLaunchKernel fusedopt_scalars grid 1 block 512 stream skip",
              "cuLaunchKernel fusedopt_advance_step grid 1 block 1 stream skip"});
    // The views are device memory of one double per tensor.
    const Tensor mu = opt.state("mu_prod", 1);
    CHECK(mu.dtype == DType::F64);
    CHECK(mu.numel == 1);
    CHECK(mu.device == Device::cuda(0));
    cu::stream_destroy(stream);
  }

  TEST_CASE("adafactor (row/column states): its passes, then the states' write, then the count" *
            testing::needs_nvrtc()) {
    Fake fake;
    Model m({1000, 70000, 3});
    ParamGroup group = m.group();
    group.params[1].shape = {700, 100};  // rows of 100: whole rows per chunk
    fake.reset();
    Optimizer opt(Rule::preset("adafactor"), {group});
    {
      INFO(std::string(fake.log()));
      // A block per tensor (its rows and columns across the threads).
      CHECK(fake.count("cuLaunchKernel fusedopt_scalars grid 3 block 512 legacy") == 1);
    }
    CHECK(opt.stats().launches_per_step == 7);
    CHECK(opt.state("r", 1).numel == 700);
    CHECK(opt.state("c", 1).numel == 100);
    CHECK(opt.state("r", 0).numel == 1000);  // 1-D: the full variance
    cu::Stream stream = cu::stream_create();
    fake.reset();
    opt.step(stream);
    INFO(std::string(fake.log()));
    // 1000 elements (1 chunk of whole 1-element rows), 70000 as 700 rows of 100 (65500
    // elements per chunk: 2 chunks), 3 elements: 4 chunks; nothing waits.
    CHECK(fake.lines() ==
          std::vector<std::string>{"cuLaunchKernel fusedopt_reduce_0 grid 4 block 512 stream",
                                   "cuLaunchKernel fusedopt_finalize grid 3 block 512 stream",
                                   "cuLaunchKernel fusedopt_reduce_1 grid 4 block 512 stream",
                                   "cuLaunchKernel fusedopt_finalize grid 3 block 512 stream",
                                   "cuLaunchKernel fusedopt_step grid 4 block 512 stream",
                                   "cuLaunchKernel fusedopt_scalars grid 3 block 512 stream",
                                   "cuLaunchKernel fusedopt_advance_step grid 1 block 1 stream"});
    cu::stream_destroy(stream);
  }

  TEST_CASE("a device GradScaler's step only launches; its state is read back on request" *
            testing::needs_nvrtc()) {
    Fake fake;
    each_scaled_case([&](Optimizer& opt, const std::string& preset) {
      GradScaler::Options so;
      so.init_scale = 1024.0;
      fake.reset();
      GradScaler scaler = GradScaler::on_device(opt, so);  // allocates and writes, once
      CHECK(fake.count("cuMemAlloc") == 1);
      CHECK(scaler.is_on_device());
      REQUIRE(scaler.device_scale() != nullptr);
      CHECK(scaler.scale() == 1024.0);  // the fake's device memory is host memory
      CHECK(scaler.growth_tracker() == 0);
      CHECK(scaler.last_step_taken());
      cu::Stream stream = cu::stream_create();
      fake.reset();
      for (int i = 0; i < 3; ++i) scaler.step(opt, stream);
      INFO(std::string(fake.log()));
      for (const char* banned :
           {"cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpy", "cuMemAlloc", "cuMemFree"}) {
        CAPTURE(banned);
        CHECK(fake.count(banned) == 0);
      }
      // Per step: the check (its own launch, or riding on pass 0), the passes and the
      // count, every one dividing by the device scale, then the scaler's update (one
      // thread, same stream).
      const bool folded = preset == "lamb";
      CHECK(fake.count("cuMemsetD8Async 8") == (folded ? 0 : 3));
      CHECK(fake.count("cuLaunchKernel fusedopt_check") == (folded ? 0 : 3));
      CHECK(fake.count("cuLaunchKernel fusedopt_reduce_0 grid 4 block 512 stream check scale") ==
            (folded ? 3 : 0));
      CHECK(fake.count("cuLaunchKernel fusedopt_step grid 4 block 512 stream skip scale") == 3);
      CHECK(fake.count("cuLaunchKernel fusedopt_update_scale grid 1 block 1 stream") == 3);
      const std::vector<std::string> lines = fake.lines();
      REQUIRE(lines.size() >= 2);
      CHECK(lines[lines.size() - 2].rfind("cuLaunchKernel fusedopt_advance_step ", 0) == 0);
      CHECK(lines.back().rfind("cuLaunchKernel fusedopt_update_scale ", 0) == 0);
      // Reading the state back is what waits, and only when asked.
      fake.reset();
      CHECK(scaler.scale() == 1024.0);
      CHECK(fake.count("cuCtxSynchronize") >= 1);
      CHECK(fake.count("cuMemcpyDtoH") == 1);
      // A copy shares the device state.
      const GradScaler copy = scaler;
      CHECK(copy.device_scale() == scaler.device_scale());
      cu::stream_destroy(stream);
    });
  }

  TEST_CASE("torch's AMP protocol (step_amp) and rebind only launch and copy on the stream" *
            testing::needs_nvrtc()) {
    Fake fake;
    for (const char* preset : {"adamw", "lamb"}) {
      CAPTURE(preset);
      Model m;
      Optimizer opt(Rule::preset(preset), {m.group()});
      cu::DeviceBuffer scale(4), found(4);
      // The fake's device memory is host memory: the test writes torch's tensors directly.
      auto* scale_f = reinterpret_cast<float*>(static_cast<std::uintptr_t>(scale.get()));
      auto* found_f = reinterpret_cast<float*>(static_cast<std::uintptr_t>(found.get()));
      *scale_f = 1024.0f;
      cu::Stream stream = cu::stream_create();
      for (const float inf : {0.0f, -0.0f, 1.0f, 3.0f}) {
        CAPTURE(inf);
        *found_f = inf;
        fake.reset();
        StepResult r = opt.step_amp(scale_f, found_f, stream);
        {
          INFO(std::string(fake.log()));
          for (const char* banned : {"cuCtxSynchronize", "cuStreamSynchronize", "cuMemcpyHtoD",
                                     "cuMemcpyDtoH", "cuMemAlloc", "cuMemFree"}) {
            CAPTURE(banned);
            CHECK(fake.count(banned) == 0);
          }
          CHECK_FALSE(r.known());
          // found_inf lands in the skip flag's high word, then every launch of the step (no
          // grad check of its own: the scaler made it) divides by the scale and skips on it.
          const std::vector<std::string> lines = fake.lines();
          REQUIRE(lines.size() >= 4);
          CHECK(lines[0] == "cuMemsetD8Async 8");
          CHECK(lines[1] == "cuMemcpyDtoDAsync 4");
          for (std::size_t i = 2; i < lines.size(); ++i) {
            CHECK(lines[i].find(" stream skip") != std::string::npos);
            CHECK(lines[i].find(" check") == std::string::npos);
          }
          CHECK(fake.count("cuLaunchKernel fusedopt_step grid 4 block 512 stream skip scale") == 1);
          CHECK(lines.back().rfind("cuLaunchKernel fusedopt_advance_step ", 0) == 0);
        }
        // The flag as the device would read it: zero exactly when found_inf is zero.
        CHECK(r.taken() == (inf == 0.0f));
      }
      // Without found_inf or scale: a plain step (no flag, no scale).
      fake.reset();
      CHECK(opt.step_amp(nullptr, nullptr, stream).taken());
      CHECK(std::string(fake.log()).find("skip") == std::string::npos);
      CHECK(std::string(fake.log()).find("scale") == std::string::npos);
      // rebind: the pointer and alignment tables are copied on the stream, nothing waits.
      Model other;
      std::vector<void*> grads;
      for (const cu::DeviceBuffer& g : other.g) {
        grads.push_back(reinterpret_cast<void*>(static_cast<std::uintptr_t>(g.get())));
      }
      fake.reset();
      opt.rebind({}, grads, stream);
      {
        INFO(std::string(fake.log()));
        CHECK(fake.count("cuMemcpyHtoDAsync") == 2);
        CHECK(fake.count("cuCtxSynchronize") == 0);
        CHECK(fake.count("cuStreamSynchronize") == 0);
      }
      cu::stream_destroy(stream);
    }
  }

  TEST_CASE("a CUBIN the driver refuses is loaded as PTX" * testing::needs_nvrtc()) {
    Fake fake;
    fake.set("refuse_cubin", 1);
    Model m;
    fake.reset();
    // A rule of its own: a kernel this process has not loaded yet.
    Optimizer opt(Rule::parse("param p\ngrad g\nhyper lr = 0.5\np = p - lr * g * 0.25\n", "r.rule"),
                  {m.group()});
    fake.set("refuse_cubin", 0);
    const std::vector<std::string> lines = fake.lines();
    std::vector<std::string> loads;
    for (const std::string& l : lines) {
      if (l.rfind("cuModuleLoadData", 0) == 0) loads.push_back(l);
    }
    CHECK(loads == std::vector<std::string>{"cuModuleLoadData cubin", "cuModuleLoadData ptx"});
  }

  TEST_CASE("a driver older than NVRTC is an error naming both versions" * testing::needs_nvrtc()) {
    Fake fake;
    fake.set("driver_version", 12090);
    Model m;
    try {
      Optimizer opt(Rule::preset("sgd"), {m.group()});
      FAIL("an Optimizer was built on a CUDA 12.9 driver with NVRTC 13");
    } catch (const UnavailableError& e) {
      CHECK(std::string(e.what()).find("driver CUDA 12.9, NVRTC 13.") != std::string::npos);
    }
    fake.set("driver_version", 13000);
  }

  TEST_CASE("a CudaEvent is made without timing, records on the caller's stream and polls") {
    Fake fake;
    // The calling thread's current context, as the fake driver keeps it.
    void* lib = dlopen(FUSEDOPT_FAKE_CUDA, RTLD_NOW);
    REQUIRE(lib != nullptr);
    auto current_fn = reinterpret_cast<int (*)(void**)>(dlsym(lib, "cuCtxGetCurrent"));
    const bool found = current_fn != nullptr;
    REQUIRE_MESSAGE(found, "the fake driver lacks cuCtxGetCurrent");
    auto current = [&] {
      void* ctx = reinterpret_cast<void*>(1);
      REQUIRE(current_fn(&ctx) == 0);
      return ctx;
    };
    const void* before = current();
    fake.reset();
    {
      CudaEvent event(0);
      CHECK(event.device() == 0);
      cu::Stream stream = nullptr;
      {
        CudaDeviceScope scope(0);
        CHECK(current() != before);  // the device's primary context, for the scope
        stream = cu::stream_create();
      }
      CHECK(current() == before);
      event.record(stream);
      event.record();  // the legacy default stream
      CHECK(event.query());
      event.synchronize();
      CudaEvent moved = std::move(event);
      CHECK(moved.query());
      cu::stream_destroy(stream);
    }
    CHECK(current() == before);  // no call left the thread bound to a context
    INFO(std::string(fake.log()));
    const std::vector<std::string> want = {
        "cuEventCreate 2",    "cuEventRecord stream", "cuEventRecord legacy", "cuEventQuery",
        "cuEventSynchronize", "cuEventQuery",         "cuEventDestroy"};
    CHECK(fake.lines() == want);
    CHECK_THROWS_AS(CudaEvent(1), UnavailableError);  // the fake driver has one device
  }
}

}  // namespace fusedopt::testing
