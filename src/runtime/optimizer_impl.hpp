// The Optimizer's private state, shared by its translation units (construction in
// plan.cpp, steps and stats in optimizer.cpp, checkpoints in checkpoint.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "fusedopt/optimizer.hpp"
#include "runtime/backend.hpp"
#include "runtime/cuda_driver.hpp"

namespace fusedopt {

namespace runtime {

/// One allocation holding every state (or master) tensor of one dtype, each view 64-byte
/// aligned.
struct Arena {
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  DType dtype = DType::F32;
  std::size_t bytes = 0;
  std::unique_ptr<std::byte[], Free> data;  ///< host arenas
  cuda::DeviceBuffer device_data;           ///< CUDA arenas
};

/// One parameter and what the optimizer keeps for it.
struct ParamSlot {
  std::string name;
  int group = 0;
  int index_in_group = 0;
  Tensor param;
  Tensor grad;
  std::vector<void*> states;  ///< rule states, then outputs (null when empty)
  void* master = nullptr;     ///< fp32 master copy, or null
  int binding = -1;           ///< index into Impl::backends; -1 for an empty tensor
};

/// One tensor of a checkpoint: its name, storage and the optimizer's memory for it.
struct CheckpointTensor {
  std::string name;
  DType dtype;
  std::int64_t numel;
  void* data;  ///< null when numel is 0
};

/// "group G, param I ('NAME')": how errors name a tensor.
std::string describe(const ParamSlot& slot);

}  // namespace runtime

struct Optimizer::Impl {
  Rule rule;
  OptimizerOptions options;
  Device device;
  /// The CUDA device's primary context (CUDA optimizers only); declared before the arenas
  /// and backends so it outlives them.
  std::unique_ptr<runtime::cuda::PrimaryContext> context;
  std::vector<std::string> state_names;     ///< rule states, then outputs
  std::size_t num_states = 0;               ///< how many of state_names are rule states
  std::vector<std::string> hyper_names;     ///< Rule::hypers order
  std::vector<std::vector<double>> hypers;  ///< [group][hyper], as set (double precision)
  std::vector<runtime::ParamSlot> params;
  std::vector<runtime::Arena> arenas;
  std::vector<DTypeBinding> bindings;
  std::vector<std::unique_ptr<runtime::Backend>> backends;  ///< one per binding
  std::int64_t step_count = 0;
  std::string fusion_report;
  // Reductions.
  int reduction_passes = 0;
  std::vector<double> host_global;               ///< shared global totals (host optimizers)
  runtime::cuda::DeviceBuffer device_global;     ///< shared global totals (CUDA optimizers)
  std::vector<std::vector<int>> binding_params;  ///< per binding: param index of each tensor
  ReductionHook hook;
  std::string schedule_report;

  /// One step: the reduction passes (if any), then the update, on every binding. With
  /// `scaled`, a non-finite unscaled gradient anywhere skips the step (returns false) and
  /// changes nothing.
  bool run_step(float inv_grad_scale, bool scaled, void* stream);
  /// Hands pass `pass`'s totals to the hook.
  void call_hook(int pass, void* stream);

  explicit Impl(const Rule& r) : rule(r) {}
  /// Frees device state with the optimizer's context current (then restores the caller's).
  ~Impl();

  /// The steps taken: the device's count in capturable CUDA mode (graph replays advance it
  /// without the host), else the host's.
  std::int64_t current_step_count() const;

  /// Index of hyper `name`; throws Error listing the rule's hypers otherwise.
  std::size_t hyper_index(const std::string& name) const;
  /// `hypers` rounded to fp32 (what the kernels read).
  std::vector<std::vector<float>> float_hypers() const;
  /// Hands the current hypers to every backend's prepared table.
  void push_hypers();
  /// Index of state `name` in state_names, -1 for "master", or throws listing them.
  int state_index(const std::string& name) const;
  /// The view of state `s` (or the master for -1) of parameter `p`.
  Tensor state_view(int s, std::size_t p) const;
  /// Copies `bytes` between the optimizer's memory (host or device) and host memory.
  void read_memory(void* host_dst, const void* src, std::size_t bytes) const;
  void write_memory(void* dst, const void* host_src, std::size_t bytes) const;
  /// What a checkpoint holds (checkpoint.cpp).
  std::vector<runtime::CheckpointTensor> checkpoint_tensors() const;
  /// The hypers as checkpoint metadata (checkpoint.cpp).
  std::string hypers_text() const;
};

}  // namespace fusedopt
