// CudaKernel's launches: the update, reduction passes and their finalize, the scalar
// states, the grad check, the device step count and the device GradScaler's update.
#include "fusedopt/error.hpp"
#include "runtime/cuda_kernel_impl.hpp"

namespace fusedopt::runtime {

void CudaKernel::step(cuda::Stream stream, double step, float inv_grad_scale) {
  Impl& k = *impl_;
  k.require_plan("step");
  StepArgs args;
  args.step = step;
  args.inv_grad_scale = inv_grad_scale;
  if (k.num_chunks > 0) {
    for (int pass = 0; pass < k.reduction_passes; ++pass) {
      run_pass(stream, pass, args);
      finalize(stream, pass, false, args);
    }
    run_pass(stream, k.reduction_passes, args);
  }
  update_scalars(stream, args);
}

void CudaKernel::share_scalars(DevicePtr scalars) { impl_->shared_scalars = scalars; }
DevicePtr CudaKernel::scalars() const { return impl_->scalars(); }

void CudaKernel::share_rc_states(DevicePtr rows, DevicePtr cols) {
  impl_->shared_rows = rows;
  impl_->shared_cols = cols;
}

void CudaKernel::run_scalars(cuda::Stream stream, const StepArgs& args, int init) {
  Impl& k = *impl_;
  if (!info_.body.writes_after_update() || k.num_tensors == 0) return;
  cuda::ContextScope scope(k.ctx);
  fo_launch L = k.make_launch(args);
  if (init) L.skip_if_set = nullptr;  // initial values are not part of a step
  void* params[] = {&L, &init};
  const std::int64_t blocks = std::min<std::int64_t>((k.num_tensors + kCudaBlock - 1) / kCudaBlock,
                                                     4 * std::max<std::int64_t>(1, k.sm_count));
  k.launch(k.f_scalars, static_cast<CUstream>(stream), params, static_cast<unsigned>(blocks),
           kCudaBlock);
}

void CudaKernel::update_scalars(cuda::Stream stream, const StepArgs& args) {
  impl_->require_plan("update_scalars");
  run_scalars(stream, args, 0);
}

int CudaKernel::reduction_passes() const { return impl_->reduction_passes; }

void CudaKernel::run_pass(cuda::Stream stream, int pass, const StepArgs& args, bool check_grads) {
  Impl& k = *impl_;
  k.require_plan("run_pass");
  FUSEDOPT_CHECK_INTERNAL(!(pass < 0 || pass > k.reduction_passes),
                          "CudaKernel::run_pass({}): the rule has {} passes", pass,
                          k.reduction_passes + 1);
  if (k.num_chunks == 0) return;
  cuda::ContextScope scope(k.ctx);
  fo_launch L = k.make_launch(args);
  L.check_grads = check_grads ? 1 : 0;
  if (pass == k.reduction_passes) {
    void* params[] = {&L};
    k.launch(k.f_step, static_cast<CUstream>(stream), params, k.grid(k.f_step), kCudaBlock);
  } else {
    CUfunction f = k.f_reduce.at(static_cast<std::size_t>(pass));
    void* params[] = {&L};
    k.launch(f, static_cast<CUstream>(stream), params, k.grid(f), kCudaBlock);
  }
}

void CudaKernel::finalize(cuda::Stream stream, int pass, bool accumulate, const StepArgs& args) {
  Impl& k = *impl_;
  k.require_plan("finalize");
  cuda::ContextScope scope(k.ctx);
  fo_launch L = k.make_launch(args);
  L.global_accumulate = accumulate ? 1 : 0;
  int p = pass;
  void* params[] = {&L, &p};
  // One block per tensor (its threads share the tensor's chunk partials), at most one wave.
  const std::int64_t cap = 4 * static_cast<std::int64_t>(std::max(1, k.sm_count));
  const std::int64_t blocks = std::max<std::int64_t>(1, std::min(k.num_tensors, cap));
  k.launch(k.f_finalize, static_cast<CUstream>(stream), params, static_cast<unsigned>(blocks),
           kCudaBlock);
}

void CudaKernel::share_global_totals(DevicePtr totals) { impl_->shared_global = totals; }
DevicePtr CudaKernel::global_totals() const { return impl_->global(); }
DevicePtr CudaKernel::tensor_totals() const { return impl_->tensor_totals.get(); }

bool CudaKernel::found_nonfinite(cuda::Stream stream) {
  Impl& k = *impl_;
  cuda::ContextScope scope(k.ctx);
  cuda::synchronize(stream);
  double count = 0;
  cuda::copy_to_host(&count, k.global() + (info_.body.num_global_slots - 1) * sizeof(double),
                     sizeof count);
  return count > 0;
}

void CudaKernel::advance_step(cuda::Stream stream, DevicePtr steps_taken, DevicePtr skip) {
  Impl& k = *impl_;
  cuda::ContextScope scope(k.ctx);
  CUdeviceptr step_ptr = static_cast<CUdeviceptr>(steps_taken);
  CUdeviceptr skip_ptr = static_cast<CUdeviceptr>(skip);
  void* advance_args[] = {&step_ptr, &skip_ptr};
  k.launch(k.f_advance, static_cast<CUstream>(stream), advance_args, 1, 1);
}

void CudaKernel::update_scale(cuda::Stream stream, DevicePtr scaler, DevicePtr found, float growth,
                              float backoff, int interval) {
  Impl& k = *impl_;
  cuda::ContextScope scope(k.ctx);
  CUdeviceptr s = static_cast<CUdeviceptr>(scaler);
  CUdeviceptr f = static_cast<CUdeviceptr>(found);
  void* params[] = {&s, &f, &growth, &backoff, &interval};
  k.launch(k.f_update_scale, static_cast<CUstream>(stream), params, 1, 1);
}

void CudaKernel::check_grads_into(cuda::Stream stream, float inv_grad_scale,
                                  const float* device_scale, DevicePtr flag) {
  Impl& k = *impl_;
  k.require_plan("check_grads_into");
  if (k.num_chunks == 0) return;
  cuda::ContextScope scope(k.ctx);
  StepArgs args;  // the check itself always runs: no skip flag
  args.inv_grad_scale = inv_grad_scale;
  args.device_scale = device_scale;
  fo_launch L = k.make_launch(args);
  CUdeviceptr found = static_cast<CUdeviceptr>(flag);
  void* params[] = {&L, &found};
  k.launch(k.f_check, static_cast<CUstream>(stream), params, k.grid(k.f_check), kCudaBlock);
}

void CudaKernel::init_states(cuda::Stream stream) {
  Impl& k = *impl_;
  k.require_plan("init_states");
  run_scalars(stream, StepArgs{}, 1);
  if (k.num_chunks == 0) return;
  cuda::ContextScope scope(k.ctx);
  fo_launch L = k.make_launch(StepArgs{});
  void* params[] = {&L};
  k.launch(k.f_init, static_cast<CUstream>(stream), params, k.grid(k.f_init), kCudaBlock);
}

bool CudaKernel::grads_finite(cuda::Stream stream, float inv_grad_scale) {
  Impl& k = *impl_;
  k.require_plan("grads_finite");
  if (k.num_chunks == 0) return true;
  cuda::ContextScope scope(k.ctx);
  cuda::memset32_async(k.flag.get(), 0u, 2, stream);
  StepArgs args;
  args.inv_grad_scale = inv_grad_scale;
  fo_launch L = k.make_launch(args);
  CUdeviceptr flag = static_cast<CUdeviceptr>(k.flag.get());
  void* params[] = {&L, &flag};
  k.launch(k.f_check, static_cast<CUstream>(stream), params, k.grid(k.f_check), kCudaBlock);
  // The stream may be non-blocking: wait for it before the (legacy-stream) copy.
  cuda::synchronize(stream);
  double found_nonfinite = 0;
  cuda::copy_to_host(&found_nonfinite, k.flag.get(), sizeof found_nonfinite);
  return found_nonfinite == 0.0;
}

void CudaKernel::step_capturable(cuda::Stream stream) {
  Impl& k = *impl_;
  k.require_plan("step_capturable");
  cuda::ContextScope scope(k.ctx);
  StepArgs args;
  args.steps_taken = as_device_pointer<const double>(k.capturable.get());
  if (k.num_chunks > 0) {
    for (int pass = 0; pass < k.reduction_passes; ++pass) {
      run_pass(stream, pass, args);
      finalize(stream, pass, false, args);
    }
    run_pass(stream, k.reduction_passes, args);
  }
  update_scalars(stream, args);  // before the count: it reads this step's number
  // Counted even with no chunk, so the count stays the number of steps.
  advance_step(stream, k.capturable.get(), 0);
}

void CudaKernel::set_capturable_state(double steps_taken) {
  Impl& k = *impl_;
  cuda::ContextScope scope(k.ctx);
  cuda::copy_to_device(k.capturable.get(), &steps_taken, sizeof steps_taken);
  cuda::synchronize(nullptr);  // landed before any stream's next launch reads it
}

double CudaKernel::capturable_steps_taken() const {
  Impl& k = *impl_;
  cuda::ContextScope scope(k.ctx);
  double steps = 0.0;
  // The steps may have run on a non-blocking stream, which the legacy-stream copy does not
  // wait for: wait for the whole context first.
  cuda::context_synchronize();
  cuda::copy_to_host(&steps, k.capturable.get(), sizeof steps);
  return steps;
}

DevicePtr CudaKernel::capturable_step_ptr() const { return impl_->capturable.get(); }

}  // namespace fusedopt::runtime
