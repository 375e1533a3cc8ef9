// NCCL's entry points, loaded at run time with support::DynLib (FUSEDOPT_NCCL_LIBRARY, else
// libnccl.so.2) and never linked: nccl.h gives only types and enums. The NCCL transport
// (nccl_backend.cpp) calls NCCL through load_nccl() only. Only in builds with NCCL.
#pragma once

#if FUSEDOPT_HAVE_NCCL

#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>

#include "support/dynlib.hpp"

namespace fusedopt::comm::detail {

/// From NCCL 2.14 (ncclCommInitRankConfig, non-blocking communicators) ranks join within
/// fusedopt's deadline; before, ncclCommInitRank blocks under NCCL's own timeouts.
constexpr int kNcclNonBlockingVersion = 21400;

/// The NCCL entry points fusedopt uses, with the signatures of the nccl.h it was built
/// with (NCCL keeps its C API stable across 2.x).
struct NcclApi {
  std::unique_ptr<support::DynLib> lib;  ///< what was loaded (never unloaded)
  int version = 0;                       ///< ncclGetVersion: 22809 for 2.28.9
  decltype(&::ncclGetVersion) GetVersion = nullptr;
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclCommCount) CommCount = nullptr;
  decltype(&::ncclCommCuDevice) CommCuDevice = nullptr;
  decltype(&::ncclCommUserRank) CommUserRank = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclReduce) Reduce = nullptr;
  /// NCCL 2.13 and later (null before): the detail of a communicator's last error.
  const char* (*GetLastError)(ncclComm_t) = nullptr;
  /// NCCL 2.14 and later (null before): a communicator made with a config (non-blocking).
  ncclResult_t (*CommInitRankConfig)(ncclComm_t*, int, ncclUniqueId, int, ncclConfig_t*) = nullptr;
};

/// The loaded NCCL; UnavailableError naming what was tried and how to get it. A failed
/// attempt is not remembered: the next one reads FUSEDOPT_NCCL_LIBRARY again, so a program
/// can fix the variable and retry. A library that loaded stays for the process's life
/// (never dlclose'd: its threads may outlive any communicator).
const NcclApi& load_nccl();

/// "ncclSystemError (code 2): unhandled system error (run with NCCL_DEBUG=INFO for
/// details); last error: ..." with the communicator's last error where NCCL keeps one.
std::string nccl_error_text(const NcclApi& api, ncclResult_t r, ncclComm_t comm);

/// What a call on a non-blocking communicator came to: `r` itself unless it is
/// ncclInProgress, else ncclCommGetAsyncError polled until the call is done (its result) or
/// until `deadline` passes (ncclInProgress: the caller aborts the communicator).
ncclResult_t nccl_settle(const NcclApi& api, ncclComm_t comm, ncclResult_t r,
                         std::chrono::steady_clock::time_point deadline);

}  // namespace fusedopt::comm::detail

#endif
