// CudaKernel: generate -> cache/NVRTC -> cuModuleLoadData -> one launch per step over a
// device-resident plan.
#include "runtime/cuda_kernel.hpp"

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
#include "runtime/device_target.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {

using cuda::DeviceBuffer;
using cuda::DevicePtr;

namespace {

/// Remembers the calling thread's current context and puts it back at scope exit, so a
/// CudaKernel never leaves a thread bound to a context it did not ask for.
class SavedContext {
 public:
  SavedContext() { FUSEDOPT_CU_CHECK(CtxGetCurrent, &previous_); }
  ~SavedContext() {
    try {
      const cuda::DriverApi& api = cuda::driver();  // loaded: the constructor succeeded
      CUcontext now = nullptr;
      if (api.CtxGetCurrent(&now) == CUDA_SUCCESS && now != previous_) api.CtxSetCurrent(previous_);
    } catch (const Error&) {
      // Unreachable in practice; a destructor must not throw.
    }
  }
  SavedContext(const SavedContext&) = delete;
  SavedContext& operator=(const SavedContext&) = delete;

 private:
  CUcontext previous_ = nullptr;
};

/// Makes `ctx` current for a scope, then restores the caller's context.
class ScopedContext {
 public:
  explicit ScopedContext(const cuda::PrimaryContext& ctx) { ctx.make_current(); }

 private:
  SavedContext saved_;  // constructed before the body runs: holds the caller's context
};

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

}  // namespace

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
  DevicePtr skip = 0;          // set_skip_flag: launches do nothing when this double is non-zero
  DevicePtr scale_source = 0;  // set_scale_source: the loss scale the launches divide by
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
      ScopedContext scope(ctx);
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

  fo_launch make_launch(double step, float inv_grad_scale, bool capturable_mode) const {
    fo_launch L{};
    L.chunks = as_device_pointer<const fo_chunk>(chunks.get());
    L.num_chunks = static_cast<long long>(num_chunks);
    L.ptrs = as_device_pointer<void* const>(ptrs.get());
    L.hypers = as_device_pointer<const double>(hypers.get());
    L.step = step;
    L.inv_grad_scale = inv_grad_scale;
    L.skip_if_set = skip ? as_device_pointer<const double>(skip) : nullptr;
    if (capturable_mode) L.step_ptr = as_device_pointer<const double>(capturable.get());
    if (scale_source) L.grad_scale_ptr = as_device_pointer<const float>(scale_source);
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
  SavedContext saved;  // PrimaryContext's constructor binds the context: undo that on exit
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
  ScopedContext scope(k.ctx);
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
  ScopedContext scope(k.ctx);
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
  ScopedContext scope(k.ctx);
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
  ScopedContext scope(k.ctx);
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

void CudaKernel::step(cuda::Stream stream, double step, float inv_grad_scale) {
  Impl& k = *impl_;
  k.require_plan("step");
  if (k.num_chunks > 0) {
    for (int pass = 0; pass < k.reduction_passes; ++pass) {
      run_pass(stream, pass, step, inv_grad_scale, false, false);
      finalize(stream, pass, false, step, inv_grad_scale, false);
    }
    run_pass(stream, k.reduction_passes, step, inv_grad_scale, false, false);
  }
  update_scalars(stream, step, false);
}

void CudaKernel::share_scalars(DevicePtr scalars) { impl_->shared_scalars = scalars; }
DevicePtr CudaKernel::scalars() const { return impl_->scalars(); }

void CudaKernel::share_rc_states(DevicePtr rows, DevicePtr cols) {
  impl_->shared_rows = rows;
  impl_->shared_cols = cols;
}

void CudaKernel::run_scalars(cuda::Stream stream, double step, bool capturable_mode, int init) {
  Impl& k = *impl_;
  if (!info_.body.writes_after_update() || k.num_tensors == 0) return;
  ScopedContext scope(k.ctx);
  fo_launch L = k.make_launch(step, 1.0f, capturable_mode);
  if (init) L.skip_if_set = nullptr;  // initial values are not part of a step
  void* args[] = {&L, &init};
  const std::int64_t blocks = std::min<std::int64_t>((k.num_tensors + kCudaBlock - 1) / kCudaBlock,
                                                     4 * std::max<std::int64_t>(1, k.sm_count));
  k.launch(k.f_scalars, static_cast<CUstream>(stream), args, static_cast<unsigned>(blocks),
           kCudaBlock);
}

void CudaKernel::update_scalars(cuda::Stream stream, double step, bool capturable_mode) {
  impl_->require_plan("update_scalars");
  run_scalars(stream, step, capturable_mode, 0);
}

int CudaKernel::reduction_passes() const { return impl_->reduction_passes; }

void CudaKernel::run_pass(cuda::Stream stream, int pass, double step, float inv_grad_scale,
                          bool check_grads, bool capturable_mode) {
  Impl& k = *impl_;
  k.require_plan("run_pass");
  FUSEDOPT_CHECK_INTERNAL(!(pass < 0 || pass > k.reduction_passes),
                          "CudaKernel::run_pass({}): the rule has {} passes", pass,
                          k.reduction_passes + 1);
  if (k.num_chunks == 0) return;
  ScopedContext scope(k.ctx);
  fo_launch L = k.make_launch(step, inv_grad_scale, capturable_mode);
  L.check_grads = check_grads ? 1 : 0;
  if (pass == k.reduction_passes) {
    void* args[] = {&L};
    k.launch(k.f_step, static_cast<CUstream>(stream), args, k.grid(k.f_step), kCudaBlock);
  } else {
    CUfunction f = k.f_reduce.at(static_cast<std::size_t>(pass));
    void* args[] = {&L};
    k.launch(f, static_cast<CUstream>(stream), args, k.grid(f), kCudaBlock);
  }
}

void CudaKernel::finalize(cuda::Stream stream, int pass, bool accumulate, double step,
                          float inv_grad_scale, bool capturable_mode) {
  Impl& k = *impl_;
  k.require_plan("finalize");
  ScopedContext scope(k.ctx);
  fo_launch L = k.make_launch(step, inv_grad_scale, capturable_mode);
  L.global_accumulate = accumulate ? 1 : 0;
  int p = pass;
  void* args[] = {&L, &p};
  // One block per tensor (its threads share the tensor's chunk partials), at most one wave.
  const std::int64_t cap = 4 * static_cast<std::int64_t>(std::max(1, k.sm_count));
  const std::int64_t blocks = std::max<std::int64_t>(1, std::min(k.num_tensors, cap));
  k.launch(k.f_finalize, static_cast<CUstream>(stream), args, static_cast<unsigned>(blocks),
           kCudaBlock);
}

void CudaKernel::share_global_totals(DevicePtr totals) { impl_->shared_global = totals; }
DevicePtr CudaKernel::global_totals() const { return impl_->global(); }
DevicePtr CudaKernel::tensor_totals() const { return impl_->tensor_totals.get(); }

bool CudaKernel::found_nonfinite(cuda::Stream stream) {
  Impl& k = *impl_;
  ScopedContext scope(k.ctx);
  cuda::synchronize(stream);
  double count = 0;
  cuda::copy_to_host(&count, k.global() + (info_.body.num_global_slots - 1) * sizeof(double),
                     sizeof count);
  return count > 0;
}

void CudaKernel::advance_step(cuda::Stream stream) {
  Impl& k = *impl_;
  ScopedContext scope(k.ctx);
  CUdeviceptr step_ptr = static_cast<CUdeviceptr>(k.capturable.get());
  CUdeviceptr skip = static_cast<CUdeviceptr>(k.skip);
  void* advance_args[] = {&step_ptr, &skip};
  k.launch(k.f_advance, static_cast<CUstream>(stream), advance_args, 1, 1);
}

void CudaKernel::set_skip_flag(DevicePtr flag) { impl_->skip = flag; }
void CudaKernel::set_scale_source(DevicePtr scale) { impl_->scale_source = scale; }

void CudaKernel::update_scale(cuda::Stream stream, DevicePtr scaler, DevicePtr found, float growth,
                              float backoff, int interval) {
  Impl& k = *impl_;
  ScopedContext scope(k.ctx);
  CUdeviceptr s = static_cast<CUdeviceptr>(scaler);
  CUdeviceptr f = static_cast<CUdeviceptr>(found);
  void* args[] = {&s, &f, &growth, &backoff, &interval};
  k.launch(k.f_update_scale, static_cast<CUstream>(stream), args, 1, 1);
}

void CudaKernel::check_grads_into(cuda::Stream stream, float inv_grad_scale, bool capturable_mode,
                                  DevicePtr flag) {
  Impl& k = *impl_;
  k.require_plan("check_grads_into");
  if (k.num_chunks == 0) return;
  ScopedContext scope(k.ctx);
  fo_launch L = k.make_launch(0.0f, inv_grad_scale, capturable_mode);
  L.skip_if_set = nullptr;  // the check itself always runs
  CUdeviceptr found = static_cast<CUdeviceptr>(flag);
  void* args[] = {&L, &found};
  k.launch(k.f_check, static_cast<CUstream>(stream), args, k.grid(k.f_check), kCudaBlock);
}

void CudaKernel::init_states(cuda::Stream stream) {
  Impl& k = *impl_;
  k.require_plan("init_states");
  run_scalars(stream, 0.0, false, 1);
  if (k.num_chunks == 0) return;
  ScopedContext scope(k.ctx);
  fo_launch L = k.make_launch(0.0f, 1.0f, false);
  L.skip_if_set = nullptr;
  void* args[] = {&L};
  k.launch(k.f_init, static_cast<CUstream>(stream), args, k.grid(k.f_init), kCudaBlock);
}

bool CudaKernel::grads_finite(cuda::Stream stream, float inv_grad_scale) {
  Impl& k = *impl_;
  k.require_plan("grads_finite");
  if (k.num_chunks == 0) return true;
  ScopedContext scope(k.ctx);
  cuda::memset32_async(k.flag.get(), 0u, 2, stream);
  fo_launch L = k.make_launch(0.0f, inv_grad_scale, false);
  L.skip_if_set = nullptr;
  CUdeviceptr flag = static_cast<CUdeviceptr>(k.flag.get());
  void* args[] = {&L, &flag};
  k.launch(k.f_check, static_cast<CUstream>(stream), args, k.grid(k.f_check), kCudaBlock);
  // The stream may be non-blocking: wait for it before the (legacy-stream) copy.
  cuda::synchronize(stream);
  double found_nonfinite = 0;
  cuda::copy_to_host(&found_nonfinite, k.flag.get(), sizeof found_nonfinite);
  return found_nonfinite == 0.0;
}

void CudaKernel::step_capturable(cuda::Stream stream) {
  Impl& k = *impl_;
  k.require_plan("step_capturable");
  ScopedContext scope(k.ctx);
  if (k.num_chunks > 0) {
    for (int pass = 0; pass < k.reduction_passes; ++pass) {
      run_pass(stream, pass, 0.0, 1.0f, false, true);
      finalize(stream, pass, false, 0.0, 1.0f, true);
    }
    run_pass(stream, k.reduction_passes, 0.0, 1.0f, false, true);
  }
  update_scalars(stream, 0.0, true);  // before the count: it reads this step's number
  // Counted even with no chunk, so the count stays the number of steps.
  advance_step(stream);
}

void CudaKernel::set_capturable_state(double steps_taken) {
  Impl& k = *impl_;
  ScopedContext scope(k.ctx);
  cuda::copy_to_device(k.capturable.get(), &steps_taken, sizeof steps_taken);
  cuda::synchronize(nullptr);  // landed before any stream's next launch reads it
}

double CudaKernel::capturable_steps_taken() const {
  Impl& k = *impl_;
  ScopedContext scope(k.ctx);
  double steps = 0.0;
  // The steps may have run on a non-blocking stream, which the legacy-stream copy does not
  // wait for: wait for the whole context first.
  cuda::context_synchronize();
  cuda::copy_to_host(&steps, k.capturable.get(), sizeof steps);
  return steps;
}

DevicePtr CudaKernel::capturable_step_ptr() const { return impl_->capturable.get(); }

}  // namespace fusedopt::runtime
