// CudaKernel's private state, shared by its translation units (cuda_kernel.cpp: loading,
// the plan, tensors and hypers; cuda_kernel_launch.cpp: the launches).
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <functional>
#include <map>
#include <tuple>
#include <vector>

#include "abi.h"
#include "runtime/cuda_kernel.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {

using cuda::DeviceBuffer;
using cuda::DevicePtr;

namespace cuda_kernel_detail {

template <typename T>
T* as_device_pointer(DevicePtr p) {
  return reinterpret_cast<T*>(static_cast<std::uintptr_t>(p));
}

template <typename T>
DeviceBuffer upload(const std::vector<T>& host) {
  DeviceBuffer b(std::max<std::size_t>(host.size() * sizeof(T), 16));  // never 0 bytes
  cuda::copy_to_device(b.get(), host.data(), host.size() * sizeof(T));
  return b;
}

}  // namespace cuda_kernel_detail

using cuda_kernel_detail::as_device_pointer;
using cuda_kernel_detail::upload;

struct CudaKernel::Impl {
  // Declared first: destroyed last, after the module and every buffer.
  cuda::PrimaryContext ctx;
  CUmodule module = nullptr;
  CUfunction f_step = nullptr;
  CUfunction f_init = nullptr;
  CUfunction f_check = nullptr;
  CUfunction f_advance = nullptr;
  CUfunction f_update_scale = nullptr;
  CUfunction f_scalars = nullptr;
  Target target;  // what was loaded: sm_XX, or compute_XX (PTX the driver compiled)
  std::vector<CUfunction> f_reduce;  // fusedopt_reduce_<pass>, one per reduction pass
  CUfunction f_finalize = nullptr;
  std::map<CUfunction, int> blocks_per_sm;  // occupancy at kCudaBlock threads
  int num_hypers = 0;
  int sm = 0;
  int sm_count = 0;

  // The plan.
  DeviceBuffer chunks;
  DeviceBuffer ptrs;
  DeviceBuffer hypers;
  DeviceBuffer aligned;
  DeviceBuffer flag;        // int: fusedopt_check's result
  DeviceBuffer capturable;  // double: steps taken
  // Reductions.
  DeviceBuffer partials;       // float[num_chunks * max_acc]
  DeviceBuffer tensor_totals;  // double[num_tensors * tensor slots]
  DeviceBuffer tensor_chunks;  // long long[2 * num_tensors]
  DeviceBuffer own_global;     // double[global slots]
  DevicePtr shared_global = 0;
  // Per-tensor scalar states (rules that declare `scalar`).
  DeviceBuffer tensor_groups;  // int[num_tensors]
  DeviceBuffer tensor_info;    // double[4 * num_tensors]: numel, dims, rows, cols
  DeviceBuffer own_scalars;    // double[num_tensors * scalars]
  DevicePtr shared_scalars = 0;
  int num_scalars = 0;
  // Factored rules (row/col states and means).
  bool factored = false;
  DeviceBuffer rc_offsets, chunk_cols, row_totals, col_totals, matrix_totals, col_partials;
  DeviceBuffer own_rows, own_cols;
  DevicePtr shared_rows = 0, shared_cols = 0;
  std::int64_t num_tensors = 0;
  int reduction_passes = 0;
  std::vector<double> host_hypers;
  std::int64_t num_chunks = 0;
  int num_groups = 0;
  int num_aligned = 0;
  bool planned = false;
  Plan plan;  // the host tables of the last set_plan (rebind redoes its pointers)

  explicit Impl(int device) : ctx(device) {}

  ~Impl() {
    try {
      cuda::ContextScope scope(ctx);
      chunks = DeviceBuffer();
      ptrs = DeviceBuffer();
      hypers = DeviceBuffer();
      aligned = DeviceBuffer();
      flag = DeviceBuffer();
      capturable = DeviceBuffer();
      partials = DeviceBuffer();
      tensor_totals = DeviceBuffer();
      tensor_chunks = DeviceBuffer();
      own_global = DeviceBuffer();
      tensor_groups = DeviceBuffer();
      tensor_info = DeviceBuffer();
      rc_offsets = DeviceBuffer();
      chunk_cols = DeviceBuffer();
      row_totals = DeviceBuffer();
      col_totals = DeviceBuffer();
      matrix_totals = DeviceBuffer();
      col_partials = DeviceBuffer();
      own_rows = DeviceBuffer();
      own_cols = DeviceBuffer();
      own_scalars = DeviceBuffer();
      if (module) cuda::driver().ModuleUnload(module);  // teardown: nothing to report to
    } catch (const Error&) {
      // The context could not be made current: the driver is shutting down.
    }
  }

  void require_plan(const char* what) const {
    FUSEDOPT_CHECK_USAGE(planned, "CudaKernel::{}: call set_tensors() first", what);
  }

  /// One wave: as many blocks as fit on the device at once (the occupancy of `f` at
  /// kCudaBlock threads, times the SMs), never more than there are chunks.
  unsigned grid(CUfunction f) const {
    auto it = blocks_per_sm.find(f);
    const int per_sm = it == blocks_per_sm.end() ? 1 : std::max(1, it->second);
    const std::int64_t cap = static_cast<std::int64_t>(per_sm) * std::max(1, sm_count);
    return static_cast<unsigned>(std::max<std::int64_t>(1, std::min(num_chunks, cap)));
  }

  /// The launch of `args` (device pointers) over the plan's tables.
  fo_launch make_launch(const StepArgs& args) const {
    fo_launch L{};
    L.chunks = as_device_pointer<const fo_chunk>(chunks.get());
    L.num_chunks = static_cast<long long>(num_chunks);
    L.ptrs = as_device_pointer<void* const>(ptrs.get());
    L.hypers = as_device_pointer<const double>(hypers.get());
    args.apply(L);
    L.aligned = as_device_pointer<const unsigned char>(aligned.get());
    if (reduction_passes > 0) {
      L.partials = as_device_pointer<float>(partials.get());
      L.tensor_totals = as_device_pointer<double>(tensor_totals.get());
      L.tensor_chunks = as_device_pointer<const long long>(tensor_chunks.get());
    }
    L.global_totals = as_device_pointer<double>(global());
    L.num_tensors = static_cast<long long>(num_tensors);
    L.tensor_info = as_device_pointer<const double>(tensor_info.get());
    if (num_scalars > 0 || factored) {
      L.scalars = num_scalars > 0 ? as_device_pointer<double>(scalars()) : nullptr;
      L.tensor_groups = as_device_pointer<const int>(tensor_groups.get());
    }
    if (factored) {
      L.rc_offsets = as_device_pointer<const long long>(rc_offsets.get());
      L.chunk_cols = as_device_pointer<const long long>(chunk_cols.get());
      L.row_states = as_device_pointer<float>(shared_rows ? shared_rows : own_rows.get());
      L.col_states = as_device_pointer<float>(shared_cols ? shared_cols : own_cols.get());
      L.row_totals = as_device_pointer<double>(row_totals.get());
      L.col_totals = as_device_pointer<double>(col_totals.get());
      L.matrix_totals = as_device_pointer<double>(matrix_totals.get());
      L.col_partials = as_device_pointer<double>(col_partials.get());
    }
    return L;
  }

  DevicePtr scalars() const { return shared_scalars ? shared_scalars : own_scalars.get(); }

  DevicePtr global() const { return shared_global ? shared_global : own_global.get(); }

  void launch(CUfunction f, CUstream stream, void** args, unsigned grid_x, unsigned block_x) const {
    FUSEDOPT_CU_CHECK(LaunchKernel, f, grid_x, 1, 1, block_x, 1, 1, 0, stream, args, nullptr);
  }
};

}  // namespace fusedopt::runtime
