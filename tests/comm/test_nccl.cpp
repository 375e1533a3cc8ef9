// The NCCL transport in one process, without mpiexec. Everywhere: an NCCL library that
// cannot be loaded, a missing CUDA device and bad arguments are clear errors (never a crash
// or a hang), and a build or machine without NCCL still runs. On a CUDA device with NCCL:
// a one-rank communicator (bootstrapped by an MPI singleton) against host references, with
// the default stream and a stream of its own, and a wrapped ncclComm_t that fusedopt leaves
// to its owner.
//
// The cases run in the order they are written (doctest's default): the load failure comes
// first, because a library that loaded stays loaded for the process's life, and nothing is
// loaded through fusedopt while the cases are registered.
#include <dlfcn.h>
#include <doctest/doctest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/backend.hpp"
#include "common/comm_requirements.hpp"
#include "common/requirements.hpp"
#include "common/scoped_env.hpp"
#include "device/cuda_driver.hpp"
#include "fusedopt/comm.hpp"
#include "fusedopt/cuda.hpp"
#include "support/half.hpp"

namespace fusedopt::testing {

using fusedopt::DType;
using fusedopt::comm::Backend;
using fusedopt::comm::Communicator;
using fusedopt::comm::Pending;
using fusedopt::comm::ReduceOp;
namespace detail = fusedopt::comm::detail;
namespace half = fusedopt::support;
namespace testing = fusedopt::testing;

namespace {

/// A host-memory bootstrap of one rank (a broadcast over one rank changes nothing), so the
/// NCCL factory can be driven without MPI; `device` makes it look like a device one.
class Loopback final : public Backend {
 public:
  explicit Loopback(fusedopt::Device device = fusedopt::Device::host()) : device_(device) {}
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string name() const override { return "loopback"; }
  fusedopt::Device device() const override { return device_; }
  std::shared_ptr<Pending> start(const detail::Collective&) override {
    return std::make_shared<Pending>();
  }
  bool test(Pending&) override { return true; }
  void abort(bool) override {}

 private:
  fusedopt::Device device_;
};

/// The NCCL library, probed by the test itself (dlopen, then dlclose) and only where there
/// is a device, so that fusedopt's loader is untouched until the cases run.
const testing::Availability& nccl_library_availability() {
  static const testing::Availability a = [] {
    testing::Availability out;
#if !FUSEDOPT_HAVE_NCCL
    out.present = false;
    out.why = "this fusedopt was built without NCCL";
#else
    if (!fusedopt::cuda_device_available()) return out;  // the device decorator says why
    const char* env = std::getenv("FUSEDOPT_NCCL_LIBRARY");
    const std::string path = env && *env ? env : "libnccl.so.2";
    if (void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) {
      dlclose(h);
    } else {
      out.present = false;
      const char* e = dlerror();
      out.why = "NCCL is not installed: " + path + ": " + (e ? e : "dlopen failed");
    }
#endif
    return out;
  }();
  return a;
}

testing::Requires needs_nccl() { return testing::Requires(nccl_library_availability()); }

/// `n` values of `dtype` in device memory, with their host copy as doubles (exact in it).
struct DeviceValues {
  DType dtype;
  std::vector<double> host;
  fusedopt::CudaBuffer device;
  DeviceValues(DType d, std::int64_t n, std::uint32_t seed)
      : dtype(d),
        host(static_cast<std::size_t>(n)),
        device(static_cast<std::size_t>(n) * static_cast<std::size_t>(fusedopt::dtype_size(d))) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<unsigned char> bytes(device.size());
    for (std::size_t i = 0; i < host.size(); ++i) {
      const float f = normal(rng);
      if (d == DType::F32) {
        std::memcpy(bytes.data() + 4 * i, &f, 4);
        host[i] = f;
      } else {
        const std::uint16_t h = d == DType::BF16 ? half::float_to_bf16(f) : half::float_to_f16(f);
        std::memcpy(bytes.data() + 2 * i, &h, 2);
        host[i] = d == DType::BF16 ? half::bf16_to_float(h) : half::f16_to_float(h);
      }
    }
    device.copy_from_host(bytes.data(), bytes.size());
  }
  /// What device memory at `p` (n elements of dtype) holds now.
  std::vector<double> read(const fusedopt::CudaBuffer& from, std::size_t n) const {
    std::vector<unsigned char> bytes(n * static_cast<std::size_t>(fusedopt::dtype_size(dtype)));
    from.copy_to_host(bytes.data(), bytes.size());
    std::vector<double> out(n);
    for (std::size_t i = 0; i < n; ++i) {
      if (dtype == DType::F32) {
        float f;
        std::memcpy(&f, bytes.data() + 4 * i, 4);
        out[i] = f;
      } else {
        std::uint16_t h;
        std::memcpy(&h, bytes.data() + 2 * i, 2);
        out[i] = dtype == DType::BF16 ? half::bf16_to_float(h) : half::f16_to_float(h);
      }
    }
    return out;
  }
};

}  // namespace

TEST_SUITE("comm") {
  TEST_CASE("an NCCL library that cannot be loaded is an UnavailableError naming it") {
    const std::string path = "/nonexistent/fusedopt-test/libnccl.so.2";
    ScopedEnv env("FUSEDOPT_NCCL_LIBRARY", path);
    auto bootstrap = std::make_shared<Loopback>();
#if FUSEDOPT_HAVE_NCCL
    // Loading comes before the device is looked for: the same message with or without one.
    auto names_path_and_remedy = [&](const std::string& what) {
      CHECK(what.find(path) != std::string::npos);
      CHECK(what.find("FUSEDOPT_NCCL_LIBRARY") != std::string::npos);
      CHECK(what.find("apt-get install libnccl2") != std::string::npos);
      CHECK(what.find("CUDA toolkit") != std::string::npos);
    };
    try {
      (void)detail::make_nccl(0, *bootstrap);
      FAIL("make_nccl loaded a library that does not exist");
    } catch (const fusedopt::UnavailableError& e) {
      names_path_and_remedy(e.what());
    }
    // The same for a wrapped communicator, before the (bogus) handle is touched.
    int not_a_comm = 0;
    try {
      (void)Communicator::nccl_wrap(&not_a_comm, 0);
      FAIL("nccl_wrap loaded a library that does not exist");
    } catch (const fusedopt::UnavailableError& e) {
      names_path_and_remedy(e.what());
    }
    std::string why;
    CHECK_FALSE(Communicator::available("nccl", &why));
    names_path_and_remedy(why);
#else
    CHECK_THROWS_WITH_AS((void)detail::make_nccl(0, *bootstrap),
                         doctest::Contains("built without NCCL"), fusedopt::UnavailableError);
#endif
  }

  TEST_CASE("without a CUDA device NCCL is unavailable, saying why, and nothing crashes" *
            testing::needs_no_cuda_device()) {
    std::string why;
    CHECK_FALSE(Communicator::available("nccl", &why));
    INFO("why: " << why);
#if FUSEDOPT_HAVE_NCCL
    CHECK(why.find("there is no CUDA device") != std::string::npos);
#else
    CHECK(why.find("built without NCCL") != std::string::npos);
#endif
    auto bootstrap = std::make_shared<Loopback>();
    try {
      (void)detail::make_nccl(0, *bootstrap);
      FAIL("make_nccl made a communicator without a CUDA device");
    } catch (const fusedopt::UnavailableError& e) {
      INFO("what: " << e.what());
      const std::string what = e.what();
      // No device, or NCCL that cannot be loaded here: either is named.
      CHECK((what.find("needs a CUDA device") != std::string::npos ||
             what.find("NCCL could not be loaded") != std::string::npos ||
             what.find("built without NCCL") != std::string::npos));
    }
    int not_a_comm = 0;
    CHECK_THROWS_AS((void)Communicator::nccl_wrap(&not_a_comm, 0), fusedopt::UnavailableError);
    // The core's CUDA helpers the transport stands on say the same, as UnavailableError.
    CHECK_THROWS_AS(fusedopt::CudaEvent(0), fusedopt::UnavailableError);
    CHECK_THROWS_AS(fusedopt::CudaDeviceScope(0), fusedopt::UnavailableError);
  }

  TEST_CASE("bad arguments are UsageErrors") {
    CHECK_THROWS_WITH_AS((void)Communicator::nccl_wrap(nullptr, 0),
                         doctest::Contains("null ncclComm_t"), fusedopt::UsageError);
#if FUSEDOPT_HAVE_NCCL
    // A bootstrap must be a host (MPI) communicator: checked before anything is loaded.
    auto device_bootstrap = std::make_shared<Loopback>(fusedopt::Device::cuda(0));
    CHECK_THROWS_WITH_AS((void)detail::make_nccl(0, *device_bootstrap),
                         doctest::Contains("the bootstrap must be a host-memory (MPI)"),
                         fusedopt::UsageError);
#endif
  }

  TEST_CASE("a one-rank NCCL communicator reduces, scatters, gathers and broadcasts on cuda:0" *
            testing::needs_cuda_device() * needs_nccl() * testing::needs_mpi()) {
    // The bootstrap is an MPI singleton: one rank, no mpiexec.
    Communicator bootstrap = Communicator::mpi();
    bootstrap.set_timeout(std::chrono::seconds(60));
    Communicator comm = Communicator::nccl(0, bootstrap);
    CHECK(comm.backend() == "nccl");
    CHECK(comm.rank() == 0);
    CHECK(comm.size() == 1);
    CHECK(comm.device() == fusedopt::Device::cuda(0));
    CHECK(comm.timeout() == std::chrono::seconds(60));

    // Over one rank a sum and a max are the value itself, exactly, in every dtype.
    const std::int64_t n = 100003;  // not a multiple of anything NCCL chunks by
    std::uint32_t seed = 1;
    for (DType d : {DType::F32, DType::BF16, DType::F16}) {
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
        CAPTURE(fusedopt::to_string(d));
        CAPTURE(static_cast<int>(op));
        DeviceValues v(d, n, seed++);
        comm.all_reduce(v.device.data(), n, d, op).wait();
        CHECK(v.read(v.device, static_cast<std::size_t>(n)) == v.host);
      }
    }
    {
      DeviceValues v(DType::F32, n, seed++);
      fusedopt::CudaBuffer out(static_cast<std::size_t>(n) * 4);
      comm.reduce_scatter(v.device.data(), out.data(), n, DType::F32).wait();
      CHECK(v.read(out, static_cast<std::size_t>(n)) == v.host);
      fusedopt::CudaBuffer gathered(static_cast<std::size_t>(n) * 4);
      comm.all_gather(v.device.data(), gathered.data(), n, DType::F32).wait();
      CHECK(v.read(gathered, static_cast<std::size_t>(n)) == v.host);
      comm.broadcast(v.device.data(), n, DType::F32, 0).wait();
      CHECK(v.read(v.device, static_cast<std::size_t>(n)) == v.host);
    }
    comm.barrier().wait();
    comm.check_same("plan", "buckets 1\n");  // over the bootstrap

#if FUSEDOPT_HAVE_NCCL  // and so CUDA: the driver's streams are linked in
    // On a stream of the caller's: the Work completes when the device has done it.
    {
      fusedopt::CudaDeviceScope scope(0);
      void* stream = fusedopt::runtime::cuda::stream_create();
      DeviceValues v(DType::BF16, n, seed++);
      fusedopt::comm::Work w =
          comm.all_reduce(v.device.data(), n, DType::BF16, ReduceOp::Sum, stream);
      w.wait();
      CHECK(w.test());
      fusedopt::cuda_synchronize(stream);
      CHECK(v.read(v.device, static_cast<std::size_t>(n)) == v.host);
      fusedopt::runtime::cuda::stream_destroy(stream);
    }
#endif

    // Many operations in flight at once, waited for in reverse.
    {
      std::vector<DeviceValues> values;
      for (int i = 0; i < 8; ++i) values.emplace_back(DType::F32, 4096, seed++);
      std::vector<fusedopt::comm::Work> works;
      for (auto& v : values) works.push_back(comm.all_reduce(v.device.data(), 4096, DType::F32));
      for (auto it = works.rbegin(); it != works.rend(); ++it) it->wait();
      for (auto& v : values) CHECK(v.read(v.device, 4096) == v.host);
    }

    // After abort() every call is a CommError.
    comm.abort();
    CHECK(comm.broken());
    DeviceValues v(DType::F32, 16, seed++);
    CHECK_THROWS_AS(comm.all_reduce(v.device.data(), 16, DType::F32), fusedopt::comm::CommError);
  }

  TEST_CASE("a wrapped ncclComm_t works and is left to its owner" * testing::needs_cuda_device() *
            needs_nccl()) {
    // The test makes its own single-process communicator with NCCL's C API (ncclComm_t is
    // a pointer, ncclResult_t an int-sized enum: no nccl.h needed here).
    const char* env = std::getenv("FUSEDOPT_NCCL_LIBRARY");
    void* lib = dlopen(env && *env ? env : "libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(lib != nullptr);
    using InitAll = int (*)(void**, int, const int*);
    using Destroy = int (*)(void*);
    auto init_all = reinterpret_cast<InitAll>(dlsym(lib, "ncclCommInitAll"));
    auto destroy = reinterpret_cast<Destroy>(dlsym(lib, "ncclCommDestroy"));
    const bool resolved = init_all != nullptr && destroy != nullptr;
    REQUIRE_MESSAGE(resolved, "NCCL lacks ncclCommInitAll or ncclCommDestroy");
    void* raw = nullptr;
    const int devices[1] = {0};
    {
      fusedopt::CudaDeviceScope scope(0);
      REQUIRE(init_all(&raw, 1, devices) == 0);
    }
    {
      Communicator comm = Communicator::nccl_wrap(raw, 0);
      CHECK(comm.size() == 1);
      CHECK(comm.rank() == 0);
      DeviceValues v(DType::F16, 1000, 7);
      comm.all_reduce(v.device.data(), 1000, DType::F16, ReduceOp::Max).wait();
      CHECK(v.read(v.device, 1000) == v.host);
      comm.barrier().wait();
      // A wrapped communicator has no host-side channel.
      CHECK_THROWS_WITH_AS(comm.check_same("plan", "x"), doctest::Contains("no host-side channel"),
                           fusedopt::UsageError);
    }
    // Still the caller's: destroying it here must succeed (fusedopt did not).
    {
      fusedopt::CudaDeviceScope scope(0);
      CHECK(destroy(raw) == 0);
    }
    dlclose(lib);
  }

  TEST_CASE("a CudaEvent tells when the work before it is done" * testing::needs_cuda_device()) {
    fusedopt::CudaEvent event(0);
    CHECK(event.device() == 0);
    CHECK(event.query());  // nothing recorded yet
    fusedopt::CudaBuffer buffer(1 << 20);
    event.record(nullptr);
    event.synchronize();
    CHECK(event.query());
    fusedopt::CudaEvent moved = std::move(event);
    moved.record();
    moved.synchronize();
    CHECK(moved.query());
  }
}

}  // namespace fusedopt::testing
