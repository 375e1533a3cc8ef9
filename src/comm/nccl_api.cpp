// Loading NCCL (support::DynLib) and the words of its results. See nccl_api.hpp.
#include "nccl_api.hpp"

#if FUSEDOPT_HAVE_NCCL

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <type_traits>

#include "fusedopt/error.hpp"

namespace fusedopt::comm::detail {

namespace {

constexpr const char* kDefaultLibrary = "libnccl.so.2";
constexpr const char* kHowToGetNccl =
    "install NCCL (the CUDA toolkit's libnccl.so.2 on the loader's path, or apt-get install "
    "libnccl2 from NVIDIA's CUDA repository), or set FUSEDOPT_NCCL_LIBRARY to the library's "
    "path";
/// The oldest NCCL used: 2.10 (code 21000), the first with ncclBfloat16.
constexpr int kOldestVersion = 21000;

/// "2.28.9" from a version code (NCCL changed the encoding at 2.9).
std::string version_text(int code) {
  if (code >= 10000) return fmt::format("{}.{}.{}", code / 10000, code % 10000 / 100, code % 100);
  return fmt::format("{}.{}.{}", code / 1000, code % 1000 / 100, code % 100);
}

/// Binds every entry point of `api` from its library; the names of the required ones that
/// are missing, comma-separated (empty when all are there).
std::string bind_all(NcclApi& api) {
  std::string missing;
  auto bind = [&](const char* symbol, auto* out, bool required) {
    *out = reinterpret_cast<std::remove_pointer_t<decltype(out)> >(api.lib->symbol(symbol));
    if (!*out && required) missing += missing.empty() ? symbol : std::string(", ") + symbol;
  };
  bind("ncclGetVersion", &api.GetVersion, true);
  bind("ncclGetUniqueId", &api.GetUniqueId, true);
  bind("ncclCommInitRank", &api.CommInitRank, true);
  bind("ncclCommDestroy", &api.CommDestroy, true);
  bind("ncclCommAbort", &api.CommAbort, true);
  bind("ncclCommGetAsyncError", &api.CommGetAsyncError, true);
  bind("ncclGetErrorString", &api.GetErrorString, true);
  bind("ncclCommCount", &api.CommCount, true);
  bind("ncclCommCuDevice", &api.CommCuDevice, true);
  bind("ncclCommUserRank", &api.CommUserRank, true);
  bind("ncclAllReduce", &api.AllReduce, true);
  bind("ncclReduceScatter", &api.ReduceScatter, true);
  bind("ncclAllGather", &api.AllGather, true);
  bind("ncclBroadcast", &api.Broadcast, true);
  bind("ncclReduce", &api.Reduce, true);
  bind("ncclGetLastError", &api.GetLastError, false);
  bind("ncclCommInitRankConfig", &api.CommInitRankConfig, false);
  return missing;
}

const char* result_name(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "ncclSuccess";
    case ncclUnhandledCudaError:
      return "ncclUnhandledCudaError";
    case ncclSystemError:
      return "ncclSystemError";
    case ncclInternalError:
      return "ncclInternalError";
    case ncclInvalidArgument:
      return "ncclInvalidArgument";
    case ncclInvalidUsage:
      return "ncclInvalidUsage";
    case ncclRemoteError:
      return "ncclRemoteError";
    case ncclInProgress:
      return "ncclInProgress";
    default:
      return "ncclResult_t";
  }
}

}  // namespace

const NcclApi& load_nccl() {
  static std::mutex mutex;
  static const NcclApi* loaded = nullptr;
  std::lock_guard<std::mutex> lock(mutex);
  if (loaded) return *loaded;

  const char* env = std::getenv("FUSEDOPT_NCCL_LIBRARY");
  const bool from_env = env != nullptr && *env != '\0';
  const std::string path = from_env ? env : kDefaultLibrary;
  const std::string tried =
      from_env ? fmt::format("{} (FUSEDOPT_NCCL_LIBRARY)", path) : fmt::format("{}", path);
  auto api = std::make_unique<NcclApi>();
  std::string error;
  api->lib = support::DynLib::open(path, &error);
  if (!api->lib) {
    throw UnavailableError(
        fmt::format("NCCL could not be loaded from {}: {}; {}", tried, error, kHowToGetNccl));
  }
  // A library refused here is closed again (the DynLib goes with `api`).
  const std::string missing = bind_all(*api);
  if (!missing.empty()) {
    throw UnavailableError(fmt::format(
        "{} loaded but has no entry point {}: it is not NCCL, or an NCCL older than {}; {}", tried,
        missing, version_text(kOldestVersion), kHowToGetNccl));
  }
  if (api->GetVersion(&api->version) != ncclSuccess) api->version = 0;
  if (api->version < kOldestVersion) {
    throw UnavailableError(fmt::format(
        "{} is NCCL {}, older than {}, the oldest fusedopt uses (bf16 collectives); {}", tried,
        api->version ? version_text(api->version) : std::string("of unknown version"),
        version_text(kOldestVersion), kHowToGetNccl));
  }
  loaded = api.release();  // never destroyed, like the library
  return *loaded;
}

std::string nccl_error_text(const NcclApi& api, ncclResult_t r, ncclComm_t comm) {
  const char* text = api.GetErrorString(r);
  std::string out = fmt::format("{} (code {}): {}", result_name(r), static_cast<int>(r),
                                text ? text : "no description");
  if (api.GetLastError) {
    const char* last = api.GetLastError(comm);
    if (last && *last) out += fmt::format("; last error: {}", last);
  }
  return out;
}

ncclResult_t nccl_settle(const NcclApi& api, ncclComm_t comm, ncclResult_t r,
                         std::chrono::steady_clock::time_point deadline) {
  auto pause = std::chrono::microseconds(20);
  while (r == ncclInProgress) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t q = api.CommGetAsyncError(comm, &state);
    if (q != ncclSuccess) return q;
    if (state != ncclInProgress) return state;
    if (std::chrono::steady_clock::now() >= deadline) return ncclInProgress;
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(2000));
  }
  return r;
}

}  // namespace fusedopt::comm::detail

#endif
