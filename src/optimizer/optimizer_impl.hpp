// The Optimizer's private state, shared by its translation units (construction in
// optimizer_build.cpp, steps and stats in optimizer.cpp, checkpoints in checkpoint.cpp).
// Device memory and launches go through the backend seam (device/backend.hpp).
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "device/backend.hpp"
#include "exec/binding.hpp"
#include "exec/step_program.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"
#include "fusedopt/optimizer.hpp"
#include "io/safetensors.hpp"

namespace fusedopt {

namespace runtime {

/// One allocation of the backend holding every state (or master) tensor of one dtype,
/// each view 64-byte aligned.
struct Arena {
  DType dtype = DType::F32;
  std::size_t bytes = 0;
  Buffer memory;
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
  double* scalars = nullptr;  ///< its scalar states (backend memory), or null: none
  /// Row and column states (factored rules): state k's rows of this param are at
  /// row_base + k * row_stride + row_first (row_count of them); columns alike.
  float* row_base = nullptr;
  float* col_base = nullptr;
  std::int64_t row_stride = 0, row_first = 0, row_count = 0;
  std::int64_t col_stride = 0, col_first = 0, col_count = 0;
  int binding = -1;  ///< index into Impl::kernels; -1 for an empty tensor of a rule
                     ///< without scalar states (one with them binds every tensor)
};

/// One state the optimizer keeps per parameter: a row of the table built from the rule
/// (Optimizer::Impl::specs), which state(), the state views and checkpoints iterate. A new
/// kind of state is one more StateKind (optimizer.hpp) and its case in Impl::state_view.
struct StateSpec {
  using Kind = StateKind;
  Kind kind;
  std::string name;
  DType dtype;
  std::size_t index = 0;      ///< its position among the states of its kind (Absmax: its state's)
  Quant quant = Quant::None;  ///< Element, Absmax: the state's storage where quantized

  /// Whether checkpoints hold it (everything but outputs).
  bool saved() const { return kind != Kind::Output; }
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

/// The most steps an optimizer takes (2^53: every count is exact as a double, and the
/// counter can never overflow); a checkpoint claiming more is refused.
inline constexpr std::int64_t kMaxSteps = std::int64_t{1} << 53;

// Hidden: nested in an exported class, it would otherwise export every method (internals).
struct FUSEDOPT_NO_EXPORT Optimizer::Impl {
  /// Who holds the optimizer now ("step", "save", ...; null: nobody). An Optimizer is used
  /// by one thread at a time, as torch's optimizers are; Exclusive detects a second user.
  mutable std::atomic<const char*> holder{nullptr};
  /// Holds the optimizer for one call. A second call while it is held (another thread, or
  /// a reduction hook calling back) is a UsageError naming both, instead of a race that
  /// would lose a step or save a torn checkpoint.
  class Exclusive {
   public:
    Exclusive(const Impl& m, const char* method) : m_(m) {
      const char* held = nullptr;
      if (!m.holder.compare_exchange_strong(held, method, std::memory_order_acquire)) {
        throw UsageError(fmt::format(
            "Optimizer::{}: called while {}() is running on this optimizer; an Optimizer is "
            "used by one thread at a time (as torch's optimizers are): order the calls",
            method, held ? held : "another call"));
      }
    }
    ~Exclusive() { m_.holder.store(nullptr, std::memory_order_release); }
    Exclusive(const Exclusive&) = delete;
    Exclusive& operator=(const Exclusive&) = delete;

   private:
    const Impl& m_;
  };

  Rule rule;
  OptimizerOptions options;
  Device device;
  /// The device: memory and kernels. Declared before the arenas and kernels so it outlives
  /// them; shared with the device GradScalers made for this optimizer (their memory).
  std::shared_ptr<runtime::Backend> backend;
  std::vector<std::string> state_names;   ///< rule states, then outputs
  std::size_t num_states = 0;             ///< how many of state_names are rule states
  std::vector<std::string> scalar_names;  ///< per-tensor scalar states (`scalar`)
  std::vector<std::string> row_names;     ///< row states (`row`)
  std::vector<std::string> col_names;     ///< column states (`col`)
  /// Per param (when set, before construction ends): the whole param it is a piece of (its
  /// index and element offset key the random numbers; its size decides quantization);
  /// empty: every param is whole.
  std::vector<PieceOrigin> origins;
  /// Whether some param is a piece of a bigger tensor (Tensor::whole_shape).
  bool pieces = false;
  /// Pieces of a factored rule: the sums that span pieces (abi.h's shard), every binding's
  /// in binding order (shard_first[b]: binding b's first), handed to the reduction hook;
  /// and per reduction pass, how many stages its finalize takes (1: unstaged, else 2 or 3).
  runtime::Buffer shard;
  std::int64_t num_shard = 0;
  std::vector<int> finalize_stages;
  /// Per rule state: its block-quantized storage for params of at least
  /// options.quant_min_numel elements (optimizer/quant_states.hpp).
  std::vector<Quant> quant;
  std::uint64_t quant_sr = 0;  ///< bit k: state k's codes rounded stochastically ("+sr")
  /// Every state per parameter, in that order (element states, outputs, scalars, rows,
  /// columns, then the master copy when master_weights): the one table of them.
  std::vector<runtime::StateSpec> specs;
  runtime::Buffer rc_states;  ///< every binding's row states, then its column states (fp32)
  runtime::Buffer scalars;    ///< [binding's first tensor + index in binding][scalar], doubles
  std::vector<std::string> hyper_names;     ///< Rule::hypers order
  std::vector<std::vector<double>> hypers;  ///< [group][hyper], as set (double precision)
  std::vector<runtime::ParamSlot> params;
  std::vector<runtime::Arena> arenas;
  std::vector<DTypeBinding> bindings;
  runtime::Buffer global_totals;  ///< shared global reduction totals (backend memory)
  /// The step as a program (step_program.hpp): plain, and scaled (checked and skipped on a
  /// non-finite gradient); compiled by bind_kernels().
  runtime::StepProgram plain_program, scaled_program;
  /// Whether the grad check may ride on pass 0 (no binding's pass 0 writes).
  bool fold_check = true;
  std::vector<std::unique_ptr<runtime::Binding>> kernels;  ///< one per binding
  /// The steps taken (one double, backend memory): launches read their step from it (one
  /// past it) and a step's last launch counts it unless the step was skipped, so the count
  /// needs nothing from the host (graph replays advance it). Allocated by bind_kernels().
  runtime::Buffer steps_taken;
  /// Steps launched since construction or the last set_steps_taken (the 2^53 limit's count,
  /// kept on the host so that a step never waits for the device).
  std::int64_t steps_launched = 0;
  std::string fusion_report;
  // Reductions.
  int reduction_passes = 0;
  std::vector<std::vector<int>> binding_params;  ///< per binding: param index of each tensor
  /// A library's ops in the step program (StepExtension; null: none), and the
  /// extension set_reduction_hook makes of a bare hook.
  StepExtension* extension = nullptr;
  std::unique_ptr<StepExtension> own_extension;
  std::string schedule_report;
  /// Where a step's device verdict is read (the grad-check slot of global_totals), and the
  /// serial of the last step: a StepResult of an older step can no longer be read. Shared
  /// with the StepResults (weakly: the optimizer's end expires them).
  struct Verdicts {
    runtime::Backend* backend = nullptr;
    const void* flag = nullptr;
    std::int64_t serial = 0;
  };
  std::shared_ptr<Verdicts> verdicts = std::make_shared<Verdicts>();

  /// A device GradScaler's part in a step (capturable CUDA): its fo_scaler (device memory),
  /// whose scale the step divides by and which is updated after the step, and its factors.
  struct DeviceScaler {
    void* scaler = nullptr;
    float growth = 2.0f;
    float backoff = 0.5f;
    int interval = 2000;
  };
  /// One step: the reduction passes (if any), then the update, on every binding. With
  /// `scaled`, a non-finite unscaled gradient anywhere skips the step (not taken) and
  /// changes nothing. With `scaler` (CUDA, scaled), the gradients are multiplied by
  /// inv_grad_scale / the device scaler's scale, and the scaler is updated after the step.
  /// On CUDA nothing waits: the verdict stays on the device until asked.
  /// `device_scale` and `skip_flag` (CUDA, device memory; PyTorch's AMP protocol): the
  /// launches also divide by the fp32 at `device_scale`, and do nothing when the double at
  /// `skip_flag` is non-zero.
  StepResult run_step(float inv_grad_scale, bool scaled, void* stream,
                      const DeviceScaler* scaler = nullptr, const float* device_scale = nullptr,
                      const void* skip_flag = nullptr);
  /// What a step's launches read: `inv_grad_scale`, the count of steps taken, the loss
  /// scale of `scaler` or `device_scale` (device memory) when non-null.
  runtime::StepArgs step_args(float inv_grad_scale, const DeviceScaler* scaler,
                              const float* device_scale) const;
  /// Whether the verdict at `flag` can be read in place (host memory) and says skip.
  bool skipped_now(const void* flag) const;
  /// The End op: counts the step in steps_taken unless `skip` says it was skipped.
  void count_step(const double* skip, void* stream);
  /// PyTorch's AMP protocol (Optimizer::step_amp).
  StepResult run_amp_step(const float* grad_scale, const float* found_inf, void* stream);
  /// Binding `b`'s tensors' role pointers, in kernel role order (param, grad, states,
  /// outputs, master).
  std::vector<std::vector<void*>> binding_ptrs(std::size_t b) const;
  /// The step programs of the schedule and the extension (plain_program, scaled_program).
  void compile_programs();
  /// Hands pass `pass`'s totals to the extension: stage 0 its global and per-tensor totals
  /// (and the shard's column sums), stage 1 the shard's matrix sums (pieces).
  void call_hook(int pass, int stage, void* stream);
  /// Hands a scaled step's separate grad check (the last global slot: 0, or non-zero when a
  /// gradient is not finite) to the extension as pass -1.
  void call_check_hook(void* stream);

  explicit Impl(const Rule& r) : rule(r) {}
  /// Everything Optimizer's constructor does: checks, arenas, kernels (origins: see
  /// OptimizerExtension::make; empty: whole params).
  static std::unique_ptr<Impl> build(const Rule& rule, std::vector<ParamGroup> groups,
                                     const OptimizerOptions& options,
                                     std::vector<PieceOrigin> origins);
  ~Impl();

  // Construction, step by step (optimizer_build.cpp).
  /// Checks the options and takes the rule's states and hypers (clipping applied).
  void take_rule(const Rule& user_rule);
  /// Checks every group and tensor (errors name the tensor) and fills `params`.
  void validate_groups(std::vector<ParamGroup>& groups);
  /// The dtype binding of a param: its dtypes, the options' state dtype and master, and
  /// the quantized storage when it has at least quant_min_numel elements.
  DTypeBinding binding_of(std::size_t p) const;
  /// Groups tensors by dtype binding and lays the states out in one arena per dtype.
  void lay_out_arenas();
  /// Plans one kernel per binding over its tensors and writes the initial states.
  void bind_kernels();
  /// Pieces of a factored rule: the shard and finalize_stages (after the kernels;
  /// pieces.cpp).
  void lay_out_shard();
  /// Each binding's tensors (the shared global totals allocated); binding_params filled.
  std::vector<runtime::BindingTensors> binding_tensors();
  /// Scalar states: one row of doubles per tensor, each binding's tensors adjacent.
  void lay_out_scalars(std::vector<runtime::BindingTensors>& tensors);
  /// Row and column states: per binding, state-major, fp32.
  void lay_out_rc_states(std::vector<runtime::BindingTensors>& tensors);
  /// The fusion and schedule reports (stats(), FUSEDOPT_LOG=info).
  void report();

  /// The steps taken (steps_taken, read after the queued steps).
  std::int64_t current_step_count() const;
  /// Sets the steps taken, after the queued steps (a checkpoint load, set_step_count).
  void set_steps_taken(std::int64_t count);

  /// Index of hyper `name`; throws Error listing the rule's hypers otherwise.
  std::size_t hyper_index(const std::string& name) const;
  /// `hypers` as the kernels read them (double: fo_prepare rounds each use once).
  std::vector<std::vector<double>> hyper_values() const;
  /// Hands the current hypers to every kernel's plan.
  void push_hypers();
  /// Sets hyper `name` of one group (or all) on the host; `method` names the caller in errors.
  void assign_hyper(const char* method, const std::string& name, double value,
                    std::optional<int> group);
  /// The same, ordered on `stream` (no waiting).
  void push_hypers_on(void* stream);
  /// The spec of state `name`, or throws listing the states.
  const runtime::StateSpec& state_spec(const std::string& name) const;
  /// Whether state k of parameter `p` is quantized (its binding's storage).
  Quant quant_of(const runtime::ParamSlot& slot, std::size_t k) const;
  /// The storage of slot's element states and outputs: float64 for a float64 param, else
  /// state_dtype (where not quantized).
  DType element_dtype(const runtime::ParamSlot& slot) const;
  /// The checkpoint's record of the states' storage: ("m=q8s,v=q8u", "256"), or empty
  /// strings when no state is quantized (checkpoint.cpp).
  std::pair<std::string, std::string> storage_text() const;
  /// The view of state `spec` of parameter `p` (its numel is 0 where the param has none:
  /// an fp32 param's master, the absmax of a state kept unquantized).
  Tensor state_view(const runtime::StateSpec& spec, std::size_t p) const;
  /// What a checkpoint holds (checkpoint.cpp).
  std::vector<runtime::CheckpointTensor> checkpoint_tensors() const;
  /// Loads a checkpoint read into memory (Optimizer::load's checks and copies; `where`
  /// names it in errors).
  void load_file(const io::SafetensorsFile& file, const std::string& where);
  /// The hypers as checkpoint metadata (checkpoint.cpp).
  std::string hypers_text() const;
};

}  // namespace fusedopt
