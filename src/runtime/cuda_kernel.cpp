// CudaKernel: generate -> cache/NVRTC -> cuModuleLoadData -> one launch per step over a
// device-resident plan.
#include <fmt/format.h>

#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <tuple>

#include "abi.h"
#include "cache/kernel_cache.hpp"
#include "codegen/codegen.hpp"
#include "fusedopt/error.hpp"
#include "jit/compiler.hpp"
#include "provider/kernel_provider.hpp"
#include "runtime/cuda_kernel_impl.hpp"
#include "runtime/device_target.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {

CudaKernel::CudaKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes, int device,
                       cache::KernelCache& cache, codegen::Strategy strategy)
    : CudaKernel(rule, dtypes, device, [&](const Target& target) {
        return provider::provide({rule, nullptr, dtypes, target, strategy}, cache);
      }) {}

namespace {

CudaVersions cuda_versions() {
  CudaVersions v;
  // Asked each time (not the value cached at cuInit): cheap, and exact if it ever changes.
  if (cuda::driver().DriverGetVersion(&v.driver) != CUDA_SUCCESS) v.driver = 0;
  std::tie(v.nvrtc_major, v.nvrtc_minor) = jit::nvrtc_version();
  v.nvrtc_archs = jit::nvrtc_supported_archs();
  return v;
}

}  // namespace

CudaKernel::CudaKernel(std::shared_ptr<const lang::Rule> rule, DTypeBinding dtypes, int device,
                       const std::function<provider::ProvidedKernel(const Target&)>& provide)
    : rule_(std::move(rule)), dtypes_(dtypes) {
  if (!rule_) throw InternalError("CudaKernel: no rule");
  cuda::SavedCurrentContext saved;  // PrimaryContext's constructor binds it: undo that on exit
  impl_ = std::make_unique<Impl>(device);
  Impl& k = *impl_;
  k.sm = cuda::device_sm(device);
  k.sm_count = cuda::device_sm_count(device);
  // A CUBIN for the device when NVRTC knows it, else PTX (device_target.hpp); a CUBIN the
  // driver refuses is retried once as PTX. fusedopt's CUDA emulator runs emulator images
  // of the same source (Target::emu), and needs no NVRTC.
  const bool emulated = cuda::driver_is_emulator();
  const CudaVersions versions = emulated ? CudaVersions{} : cuda_versions();
  Target target = emulated ? Target::emu() : choose_cuda_target(k.sm, versions);
  provider::ProvidedKernel built = provide(target);
  cuda::ContextScope scope(k.ctx);
  CUresult loaded = cuda::driver().ModuleLoadData(&k.module, built.binary->data());
  if (loaded != CUDA_SUCCESS && !target.ptx && !emulated) {
    const char* name = nullptr;
    cuda::driver().GetErrorName(loaded, &name);
    target = ptx_fallback(k.sm, versions,
                          fmt::format("cuModuleLoadData: {}", name ? name : "unknown error"));
    built = provide(target);
    loaded = cuda::driver().ModuleLoadData(&k.module, built.binary->data());
  }
  cuda::check(loaded, "cuModuleLoadData", __FILE__, __LINE__);
  k.target = target;
  k.reduction_passes = built.body.reduction_passes;
  k.num_hypers = built.body.num_hypers;
  info_ = built.take_info();

  FUSEDOPT_CU_CHECK(ModuleGetFunction, &k.f_step, k.module, "fusedopt_step");
  FUSEDOPT_CU_CHECK(ModuleGetFunction, &k.f_init, k.module, "fusedopt_init");
  FUSEDOPT_CU_CHECK(ModuleGetFunction, &k.f_check, k.module, "fusedopt_check");
  FUSEDOPT_CU_CHECK(ModuleGetFunction, &k.f_advance, k.module, "fusedopt_advance_step");
  FUSEDOPT_CU_CHECK(ModuleGetFunction, &k.f_update_scale, k.module, "fusedopt_update_scale");
  FUSEDOPT_CU_CHECK(ModuleGetFunction, &k.f_scalars, k.module, "fusedopt_scalars");
  k.num_scalars = info_.body.num_scalars;
  k.factored = info_.body.factored;
  k.f_reduce.assign(static_cast<std::size_t>(k.reduction_passes), nullptr);
  for (int pass = 0; pass < k.reduction_passes; ++pass) {
    const std::string name = fmt::format("fusedopt_reduce_{}", pass);
    FUSEDOPT_CU_CHECK(ModuleGetFunction, &k.f_reduce[static_cast<std::size_t>(pass)], k.module,
                      name.c_str());
  }
  FUSEDOPT_CU_CHECK(ModuleGetFunction, &k.f_finalize, k.module, "fusedopt_finalize");
  std::vector<CUfunction> sized = {k.f_step, k.f_init, k.f_check};
  sized.insert(sized.end(), k.f_reduce.begin(), k.f_reduce.end());
  for (CUfunction f : sized) {
    int n = 0;
    FUSEDOPT_CU_CHECK(OccupancyMaxActiveBlocksPerMultiprocessor, &n, f, kCudaBlock, 0);
    k.blocks_per_sm[f] = n;
  }
  k.flag = DeviceBuffer(sizeof(double));
  const std::vector<double> zeros(static_cast<std::size_t>(info_.body.num_global_slots), 0.0);
  k.own_global = upload(zeros);
  k.capturable = DeviceBuffer(sizeof(double));
  const double no_steps = 0.0;
  cuda::copy_to_device(k.capturable.get(), &no_steps, sizeof no_steps);
  cuda::synchronize(nullptr);
}

CudaKernel::~CudaKernel() = default;

int CudaKernel::num_roles() const { return info_.body.num_roles; }
int CudaKernel::device() const { return impl_->ctx.device(); }
int CudaKernel::sm() const { return impl_->sm; }
std::int64_t CudaKernel::num_chunks() const { return impl_->num_chunks; }
unsigned CudaKernel::grid_size() const { return impl_->grid(impl_->f_step); }
int CudaKernel::num_aligned_tensors() const { return impl_->num_aligned; }

void CudaKernel::set_tensors(const std::vector<std::vector<DevicePtr>>& ptrs,
                             const std::vector<std::int64_t>& numel,
                             const std::vector<std::vector<double>>& hypers,
                             const std::vector<int>& group) {
  std::vector<std::vector<void*>> host_ptrs;
  host_ptrs.reserve(ptrs.size());
  for (const auto& roles : ptrs) {
    std::vector<void*> row;
    for (DevicePtr p : roles)
      row.push_back(reinterpret_cast<void*>(static_cast<std::uintptr_t>(p)));
    host_ptrs.push_back(std::move(row));
  }
  set_plan(Plan::build(info_.body,
                       PlanRequest("CudaKernel", host_ptrs, numel, hypers, group, kCudaChunk)));
}

void CudaKernel::check_device_pointers(const Plan& plan) const {
  const int roles = plan.num_roles() - static_cast<int>(info_.body.scratch.size());
  for (std::int64_t t = 0; t < plan.num_tensors(); ++t) {
    for (int r = 0; r < roles; ++r) {
      const auto p = reinterpret_cast<std::uintptr_t>(
          plan.ptrs()[static_cast<std::size_t>(t * plan.num_roles() + r)]);
      if (p == 0) continue;  // an empty tensor (Plan::build refused null pointers otherwise)
      // Formatted only for an error: rebind checks every pointer of every step that moves.
      const auto who = [&] {
        const auto ti = static_cast<std::size_t>(t);
        return ti < tensor_names_.size()
                   ? fmt::format("{}, role {}", tensor_names_[ti],
                                 info_.body.roles.at(static_cast<std::size_t>(r)))
                   : fmt::format("tensor {} role {}", t, r);
      };
      // Catch host pointers early: the kernel would fault (an unrecoverable context error).
      unsigned int memory_type = 0;
      CUresult res = cuda::driver().PointerGetAttribute(
          &memory_type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, static_cast<CUdeviceptr>(p));
      if (res != CUDA_SUCCESS) {
        throw UsageError(
            fmt::format("CudaKernel: {} (0x{:x}) is not memory the CUDA "
                        "driver knows (cuPointerGetAttribute failed with {})",
                        who(), p, static_cast<int>(res)));
      }
      // Pinned host memory is known to the driver too, and a pointer of another device
      // would fault the same way: only device (or managed) memory of this device.
      FUSEDOPT_CHECK_USAGE(
          !(memory_type != CU_MEMORYTYPE_DEVICE && memory_type != CU_MEMORYTYPE_UNIFIED),
          "CudaKernel: {} (0x{:x}) is host memory, not device memory", who(), p);
      int ordinal = -1;
      if (cuda::driver().PointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                             static_cast<CUdeviceptr>(p)) == CUDA_SUCCESS &&
          memory_type == CU_MEMORYTYPE_DEVICE && ordinal != impl_->ctx.device()) {
        throw UsageError(
            fmt::format("CudaKernel: {} (0x{:x}) is memory of cuda:{}, "
                        "the kernel runs on cuda:{}",
                        who(), p, ordinal, impl_->ctx.device()));
      }
    }
  }
}

void CudaKernel::set_plan(const Plan& plan) {
  Impl& k = *impl_;
  cuda::ContextScope scope(k.ctx);
  check_device_pointers(plan);
  // Build everything before replacing anything: a failed upload leaves the old plan.
  DeviceBuffer d_partials, d_totals, d_ranges;
  if (k.reduction_passes > 0) {
    d_partials = DeviceBuffer(plan.num_partials() * sizeof(float));
    d_totals = upload(std::vector<double>(plan.num_tensor_totals(), 0.0));
    d_ranges = upload(plan.tensor_chunks());
  }
  DeviceBuffer d_chunks = upload(plan.chunks());
  DeviceBuffer d_ptrs = upload(plan.ptrs());
  DeviceBuffer d_hypers = upload(plan.hypers());
  DeviceBuffer d_aligned = upload(plan.aligned());
  DeviceBuffer d_info = upload(plan.tensor_info());
  DeviceBuffer d_groups, d_scalars;
  DeviceBuffer d_rc, d_cc, d_rt, d_ct, d_mt, d_cp, d_rows, d_cols;
  if (k.factored) {
    const Plan::RcWidths& w = plan.rc_widths();
    auto zeros = [](std::int64_t n, int width) {
      return std::max<std::size_t>(static_cast<std::size_t>(n), 1) *
             static_cast<std::size_t>(width);
    };
    d_rc = upload(plan.rc_offsets());
    d_cc = upload(plan.chunk_cols());
    d_rt = upload(std::vector<double>(zeros(plan.num_rows(), w.row_slots), 0.0));
    d_ct = upload(std::vector<double>(zeros(plan.num_cols(), w.col_slots), 0.0));
    d_mt = upload(std::vector<double>(zeros(plan.num_matrices(), w.matrix_slots), 0.0));
    d_cp = upload(std::vector<double>(std::max<std::size_t>(plan.num_col_partials(), 1), 0.0));
    d_rows = upload(std::vector<float>(zeros(plan.num_rows(), w.row_states), 0.0f));
    d_cols = upload(std::vector<float>(zeros(plan.num_cols(), w.col_states), 0.0f));
  }
  if (k.num_scalars > 0 || k.factored) {
    d_groups = upload(plan.tensor_groups());
    if (k.num_scalars > 0) {
      d_scalars = upload(std::vector<double>(std::max<std::size_t>(plan.num_scalars(), 1), 0.0));
    }
  }
  const double no_steps = 0.0;
  cuda::copy_to_device(k.capturable.get(), &no_steps, sizeof no_steps);
  // A copy from pageable memory may return before its DMA lands: wait for it, so a launch
  // on any stream (non-blocking ones do not order after the legacy stream) sees the plan.
  cuda::synchronize(nullptr);
  k.chunks = std::move(d_chunks);
  k.ptrs = std::move(d_ptrs);
  k.hypers = std::move(d_hypers);
  k.aligned = std::move(d_aligned);
  k.partials = std::move(d_partials);
  k.tensor_totals = std::move(d_totals);
  k.tensor_chunks = std::move(d_ranges);
  k.tensor_groups = std::move(d_groups);
  k.rc_offsets = std::move(d_rc);
  k.chunk_cols = std::move(d_cc);
  k.row_totals = std::move(d_rt);
  k.col_totals = std::move(d_ct);
  k.matrix_totals = std::move(d_mt);
  k.col_partials = std::move(d_cp);
  k.own_rows = std::move(d_rows);
  k.own_cols = std::move(d_cols);
  k.tensor_info = std::move(d_info);
  k.own_scalars = std::move(d_scalars);
  k.num_tensors = plan.num_tensors();
  k.host_hypers = plan.hypers();
  k.num_chunks = plan.num_chunks();
  k.num_groups = plan.num_groups();
  k.num_aligned = plan.num_aligned();
  k.plan = plan;
  k.planned = true;
}

void CudaKernel::rebind(const std::vector<std::vector<void*>>& ptrs, cuda::Stream stream) {
  Impl& k = *impl_;
  k.require_plan("rebind");
  Plan plan = k.plan;
  plan.rebind(info_.body, ptrs);
  cuda::ContextScope scope(k.ctx);
  check_device_pointers(plan);
  // From pageable memory: the driver stages the bytes before returning.
  cuda::copy_to_device_async(k.ptrs.get(), plan.ptrs().data(), plan.ptrs().size() * sizeof(void*),
                             stream);
  cuda::copy_to_device_async(k.aligned.get(), plan.aligned().data(), plan.aligned().size(), stream);
  k.num_aligned = plan.num_aligned();
  k.plan = std::move(plan);
}

void CudaKernel::set_hypers(int group, const std::vector<double>& values, cuda::Stream stream) {
  Impl& k = *impl_;
  k.require_plan("set_hypers");
  FUSEDOPT_CHECK_USAGE(!(group < 0 || group >= k.num_groups),
                       "CudaKernel::set_hypers: group {} out of range ({} groups)", group,
                       k.num_groups);
  FUSEDOPT_CHECK_USAGE(static_cast<int>(values.size()) == k.num_hypers,
                       "CudaKernel::set_hypers: {} values given, the rule has {} hypers",
                       values.size(), k.num_hypers);
  if (k.num_hypers == 0) return;
  cuda::ContextScope scope(k.ctx);
  // A copy captured into a graph reads its host memory when the graph replays, and
  // `values` is gone by then: refused, before anything changes.
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  FUSEDOPT_CU_CHECK(StreamIsCapturing, static_cast<CUstream>(stream), &capture);
  FUSEDOPT_CHECK_USAGE(capture == CU_STREAM_CAPTURE_STATUS_NONE,
                       "set_hyper on a stream that is being captured: a captured copy reads its "
                       "host memory when the graph replays, and these values are gone by then; "
                       "set hypers before capturing or between replays (a captured step reads "
                       "the device's hypers each time it replays)");
  const std::size_t offset = static_cast<std::size_t>(group) * k.num_hypers;
  std::copy(values.begin(), values.end(),
            k.host_hypers.begin() + static_cast<std::ptrdiff_t>(offset));
  // From pageable memory: the driver stages the bytes before returning, so `values` may go.
  cuda::copy_to_device_async(k.hypers.get() + offset * sizeof(double), values.data(),
                             values.size() * sizeof(double), stream);
}

}  // namespace fusedopt::runtime
