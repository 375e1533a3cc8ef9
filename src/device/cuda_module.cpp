// CudaModule: the image in the device's primary context, its entry points and the grid of
// each: the update a block per chunk (one wave wide for quantized states), the other chunk
// launches one wave wide, finalize a block per tensor, the scalar states a thread per tensor,
// the count and the scaler's update one thread.
#include "device/cuda_module.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "fusedopt/error.hpp"
#include "support/check.hpp"

namespace fusedopt::runtime {

namespace {

/// FUSEDOPT_CUDA_WAVES (a tuning knob): every chunk launch N waves wide (N blocks per slot
/// the device has at once), or 0: a block per chunk, the hardware scheduling them. Unset
/// (-1): the measured default (see CudaModule::grid).
int cuda_waves() {
  const char* env = std::getenv("FUSEDOPT_CUDA_WAVES");
  if (!env || !*env) return -1;
  char* end = nullptr;
  const long waves = std::strtol(env, &end, 10);
  FUSEDOPT_CHECK_USAGE(*end == '\0' && waves >= 0 && waves <= 64,
                       "FUSEDOPT_CUDA_WAVES={} is not a number of waves from 0 to 64 (0: a block "
                       "per chunk)",
                       env);
  return static_cast<int>(waves);
}

class CudaModule final : public Module {
 public:
  CudaModule(const cuda::PrimaryContext& ctx, CUmodule module, KernelInfo info)
      : Module(std::move(info)), ctx_(ctx), module_(module) {
    sm_count_ = cuda::device_sm_count(ctx.device());
    const int waves = cuda_waves();
    waves_ = waves < 0 ? 1 : waves;
    // The update of an unquantized rule: a block per chunk. On an H100 (2026-11-27,
    // bench/gpu-notes.md) it beat one wave by 2% on BERT-base and 5% on 5,000 small tensors
    // (the hardware balances chunks of unequal sizes); a quantized update, whose blocks first
    // load the maps into shared memory, was 2% faster in one wave.
    step_waves_ = waves >= 0 ? waves : layout().quant_block > 0 ? 1 : 0;
    f_step_ = function("fusedopt_step");
    f_init_ = function("fusedopt_init");
    f_check_ = function("fusedopt_check");
    f_advance_ = function("fusedopt_advance_step");
    f_update_scale_ = function("fusedopt_update_scale");
    f_scalars_ = function("fusedopt_scalars");
    f_finalize_ = function("fusedopt_finalize");
    for (int pass = 0; pass < layout().reduction_passes; ++pass) {
      f_reduce_.push_back(function(fmt::format("fusedopt_reduce_{}", pass)));
    }
    FUSEDOPT_CU_CHECK(OccupancyMaxActiveBlocksPerMultiprocessor, &step_per_sm_, f_step_, kCudaBlock,
                      0);
    FUSEDOPT_CU_CHECK(OccupancyMaxActiveBlocksPerMultiprocessor, &init_per_sm_, f_init_, kCudaBlock,
                      0);
    FUSEDOPT_CU_CHECK(OccupancyMaxActiveBlocksPerMultiprocessor, &check_per_sm_, f_check_,
                      kCudaBlock, 0);
    for (CUfunction f : f_reduce_) {
      int n = 0;
      FUSEDOPT_CU_CHECK(OccupancyMaxActiveBlocksPerMultiprocessor, &n, f, kCudaBlock, 0);
      reduce_per_sm_.push_back(n);
    }
  }

  ~CudaModule() override {
    try {
      cuda::ContextScope scope(ctx_);
      cuda::driver().ModuleUnload(module_);  // teardown: nothing to report to
    } catch (const Error&) {
      // The context could not be made current: the driver is shutting down.
    }
  }

  void step(const fo_launch& L, void* stream) override {
    chunk_launch(f_step_, step_per_sm_, L, stream, step_waves_);
  }
  void init(const fo_launch& L, void* stream) override {
    chunk_launch(f_init_, init_per_sm_, L, stream, waves_);
  }
  void reduce(int pass, const fo_launch& L, void* stream) override {
    const auto p = static_cast<std::size_t>(pass);
    FUSEDOPT_CHECK_INTERNAL(p < f_reduce_.size(), "reduction pass {}: the rule has {}", pass,
                            f_reduce_.size());
    chunk_launch(f_reduce_[p], reduce_per_sm_[p], L, stream, waves_);
  }
  void finalize(int pass, const fo_launch& L, void* stream) override {
    fo_launch table = L;
    void* params[] = {&table, &pass};
    // One block per tensor (its threads share the tensor's chunk partials), at most one wave.
    const std::int64_t blocks =
        std::max<std::int64_t>(1, std::min<std::int64_t>(L.num_tensors, cap()));
    launch(f_finalize_, params, static_cast<unsigned>(blocks), kCudaBlock, stream);
  }
  void scalars(bool init, const fo_launch& L, void* stream) override {
    if (L.num_tensors == 0) return;
    fo_launch table = L;
    int first = init ? 1 : 0;
    void* params[] = {&table, &first};
    // Factored rules: a block per tensor (its rows and columns across the threads); else a
    // thread per tensor.
    const std::int64_t blocks = std::min<std::int64_t>(
        layout().factored ? L.num_tensors : (L.num_tensors + kCudaBlock - 1) / kCudaBlock, cap());
    launch(f_scalars_, params, static_cast<unsigned>(blocks), kCudaBlock, stream);
  }
  void check(const fo_launch& L, double* flag, void* stream) override {
    if (L.num_chunks == 0) return;
    fo_launch table = L;
    CUdeviceptr found = reinterpret_cast<CUdeviceptr>(flag);
    void* params[] = {&table, &found};
    launch(f_check_, params, grid(check_per_sm_, L.num_chunks, waves_), kCudaBlock, stream);
  }
  void advance_step(double* steps_taken, const double* skip, void* stream) override {
    CUdeviceptr steps = reinterpret_cast<CUdeviceptr>(steps_taken);
    CUdeviceptr skip_ptr = reinterpret_cast<CUdeviceptr>(skip);
    void* params[] = {&steps, &skip_ptr};
    launch(f_advance_, params, 1, 1, stream);
  }
  void update_scale(fo_scaler* scaler, const double* found, float growth, float backoff,
                    int interval, void* stream) override {
    CUdeviceptr s = reinterpret_cast<CUdeviceptr>(scaler);
    CUdeviceptr f = reinterpret_cast<CUdeviceptr>(found);
    void* params[] = {&s, &f, &growth, &backoff, &interval};
    launch(f_update_scale_, params, 1, 1, stream);
  }
  bool counts_by_launch() const override { return true; }

  unsigned step_grid(std::int64_t num_chunks) const {
    return grid(step_per_sm_, num_chunks, step_waves_);
  }

 private:
  CUfunction function(const std::string& name) const {
    CUfunction f = nullptr;
    FUSEDOPT_CU_CHECK(ModuleGetFunction, &f, module_, name.c_str());
    return f;
  }
  /// Blocks of launches that are not per chunk: at most four per SM.
  std::int64_t cap() const { return 4 * static_cast<std::int64_t>(std::max(1, sm_count_)); }
  /// One wave: as many blocks as fit on the device at once (`per_sm` times the SMs), never
  /// more than there are chunks; `waves` such waves, or 0: a block per chunk.
  unsigned grid(int per_sm, std::int64_t num_chunks, int waves) const {
    const std::int64_t wave =
        static_cast<std::int64_t>(std::max(1, per_sm)) * std::max(1, sm_count_);
    const std::int64_t blocks = waves == 0 ? num_chunks : wave * waves;
    const std::int64_t most = std::int64_t{1} << 30;
    return static_cast<unsigned>(std::max<std::int64_t>(1, std::min({num_chunks, blocks, most})));
  }
  void chunk_launch(CUfunction f, int per_sm, const fo_launch& L, void* stream, int waves) {
    if (L.num_chunks == 0) return;
    fo_launch table = L;
    void* params[] = {&table};
    launch(f, params, grid(per_sm, L.num_chunks, waves), kCudaBlock, stream);
  }
  void launch(CUfunction f, void** params, unsigned grid_x, unsigned block_x, void* stream) {
    cuda::ContextScope scope(ctx_);
    FUSEDOPT_CU_CHECK(LaunchKernel, f, grid_x, 1, 1, block_x, 1, 1, 0,
                      static_cast<CUstream>(stream), params, nullptr);
  }

  const cuda::PrimaryContext& ctx_;
  CUmodule module_ = nullptr;
  int sm_count_ = 0;
  int waves_ = 1, step_waves_ = 0;  // the chunk launches' waves; the update's (0: per chunk)
  CUfunction f_step_ = nullptr, f_init_ = nullptr, f_check_ = nullptr, f_advance_ = nullptr;
  CUfunction f_update_scale_ = nullptr, f_scalars_ = nullptr, f_finalize_ = nullptr;
  std::vector<CUfunction> f_reduce_;
  int step_per_sm_ = 0, init_per_sm_ = 0, check_per_sm_ = 0;
  std::vector<int> reduce_per_sm_;
};

}  // namespace

std::unique_ptr<Module> load_cuda_module(const cuda::PrimaryContext& context, KernelImage image,
                                         std::string* refusal) {
  cuda::ContextScope scope(context);
  CUmodule module = nullptr;
  const CUresult loaded = cuda::driver().ModuleLoadData(&module, image.binary->data());
  if (loaded != CUDA_SUCCESS && !image.target.ptx && !cuda::driver_is_emulator()) {
    const char* name = nullptr;
    cuda::driver().GetErrorName(loaded, &name);
    *refusal = fmt::format("cuModuleLoadData: {}", name ? name : "unknown error");
    return nullptr;
  }
  cuda::check(loaded, "cuModuleLoadData", __FILE__, __LINE__);
  try {
    return std::make_unique<CudaModule>(context, module, std::move(image.info));
  } catch (...) {
    cuda::driver().ModuleUnload(module);
    throw;
  }
}

unsigned cuda_step_grid(const Module& module, std::int64_t num_chunks) {
  return static_cast<const CudaModule&>(module).step_grid(num_chunks);
}

}  // namespace fusedopt::runtime
