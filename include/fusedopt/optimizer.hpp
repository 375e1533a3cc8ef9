// The optimizer runtime: a rule applied to a whole parameter list with one launch per step
// (per dtype binding), on the host or a CUDA device, with mixed precision, grad scaling,
// per-group hypers, statistics and safetensors checkpoints.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/export.hpp"
#include "fusedopt/kernel.hpp"

namespace fusedopt {

/// Where a tensor's memory lives.
struct Device {
  enum class Kind { Host, Cuda };
  Kind kind = Kind::Host;
  int index = 0;  ///< CUDA device ordinal
  static Device host() { return {}; }
  static Device cuda(int index = 0) { return {Kind::Cuda, index}; }
  bool operator==(const Device& o) const { return kind == o.kind && index == o.index; }
};

/// A flat view of memory the caller owns (fusedopt never frees it).
struct Tensor {
  Tensor() = default;
  /// The members in order, shape last and optional: `{data, numel, dtype, device, name}`
  /// as before shapes existed (a constructor, so that form draws no
  /// -Wmissing-field-initializers warning).
  Tensor(void* data_, std::int64_t numel_, DType dtype_ = DType::F32, Device device_ = {},
         std::string name_ = {}, std::vector<std::int64_t> shape_ = {})
      : data(data_),
        numel(numel_),
        dtype(dtype_),
        device(device_),
        name(std::move(name_)),
        shape(std::move(shape_)) {}

  void* data = nullptr;
  std::int64_t numel = 0;
  DType dtype = DType::F32;
  Device device;
  std::string name;  ///< used in errors and as the checkpoint key; "param<i>" when empty
  /// The dimensions (row-major, their product numel), or empty: a 1-D tensor. Rules read
  /// a param's as `dims`, `rows` and `cols` (its last two dimensions; fewer than two: numel
  /// rows of one column). A grad's is ignored (it must be empty or the param's).
  std::vector<std::int64_t> shape;
  /// A param that is a dim-0 piece of a bigger tensor (PyTorch FSDP2's shard: rows
  /// [whole_offset, whole_offset + shape[0]) of dim 0) gives the whole tensor's shape here;
  /// empty: the tensor is whole. The piece's shape (its `shape`; empty: the whole's with
  /// dim 0 numel / the product of the others, or 1-D of numel) must equal whole_shape but
  /// in dim 0, and whole_offset + its rows must fit in
  /// whole_shape[0]; a 1-D piece is an element range, a 0-d tensor a 1-D one of one
  /// element. An empty piece (0 rows) takes part like any other. A rule then computes what
  /// the whole tensor computes once the reduction hook combines the partials of every
  /// piece (docs/cpp.md, "Pieces"): the built-ins read the whole shape, means divide by the
  /// whole counts, random numbers are drawn as the whole tensor's elements, and states are
  /// quantized when the whole tensor is big enough (quant_min_numel; blocks within the
  /// piece). Every rank must give the same params as pieces, and every param of such an
  /// optimizer should be one (the hook sums each tensor's totals over the ranks: a param
  /// every rank holds whole is a piece of itself on one rank and an empty piece on the
  /// others). A grad's is ignored.
  std::vector<std::int64_t> whole_shape;
  std::int64_t whole_offset = 0;  ///< the dim-0 index where the piece starts in its whole
};

/// Params, their grads (same order, same numel) and per-group hyper overrides, like
/// torch's param_groups.
struct ParamGroup {
  std::vector<Tensor> params;
  std::vector<Tensor> grads;
  std::vector<std::pair<std::string, double>> hypers;  ///< overrides of the rule's defaults
};

struct OptimizerOptions {
  DType state_dtype = DType::F32;  ///< storage of every state tensor (fp32, bf16 or fp16)
  /// Keep an fp32 master copy of fp16/bf16 params (allocated and owned by the optimizer);
  /// the kernel updates the master and stores the rounded value into the param.
  bool master_weights = false;
  /// Accepted for torch's `capturable`: every CUDA step is capturable (hypers and the step
  /// count live in device memory; one tiny launch per step counts it), so it changes nothing.
  bool capturable = false;
  /// Clip the gradients by their global norm over every tensor of the step before the rule
  /// sees them, like torch.nn.utils.clip_grad_norm_(max_norm): g *= min(1, max_grad_norm /
  /// (norm + 1e-6)). 0 turns it off. The rule gains a hyper "max_grad_norm" (set_hyper
  /// changes it) and one reduction pass; a rule that already has such a hyper is refused.
  double max_grad_norm = 0.0;
  ReductionStrategy reduction_strategy = ReductionStrategy::Auto;
  /// Block-quantized states (Quant; docs/rules.md, "Quantized states"), by state name:
  /// "q8" or "q4" (the map's sign chosen from the rule: unsigned where the checker proves
  /// the state never negative, else signed), "q8s", "q8u", "q4s", "q4u" (chosen), or "-"
  /// (kept in state_dtype); a "+sr" suffix ("q4u+sr") rounds the codes stochastically
  /// (DTypeBinding::quant_sr) instead of to the nearest. The name "*" stands for every state
  /// not named. Outputs are never quantized. A rule may declare its own default (`storage m = q8`),
  /// which these entries override.
  std::vector<std::pair<std::string, std::string>> state_storage;
  /// Elements per absmax block of quantized states: a power of two from 32 to 512 (0: 256,
  /// or 128 when a state is 4-bit).
  int quant_block = 0;
  /// Params with fewer elements keep their states in state_dtype (bitsandbytes'
  /// min_8bit_size): their blocks would cost more than they save.
  std::int64_t quant_min_numel = 4096;
  /// Store fp16 and bf16 params (without master_weights) rounded stochastically: up or down
  /// with the probabilities that keep the fp32 result's expected value (torchao's bf16
  /// stochastic rounding), so small updates are not lost to round-to-nearest. The random
  /// numbers come from a counter-based generator (Philox4x32-10) keyed on (seed, step, param,
  /// element within the param): the same bits on any thread count, memory layout or
  /// sharding. fp32 params are unaffected. The rule's rand() draws from the same generator.
  bool stochastic_rounding = false;
  std::uint64_t seed = 0;  ///< the generator's key (stochastic rounding and rand())
  /// The precision of a rule's matrix stages (orthogonalize): DType::F32, or DType::BF16 as
  /// torch.optim.Muon iterates (the GEMMs accumulate in fp32, their results are rounded).
  DType matrix_precision = DType::F32;
};

/// What a step costs, and where its kernel came from.
/// What kind of state an optimizer keeps per parameter, and so its size.
enum class StateKind {
  Element,  ///< the rule's `state`: one value per element of the param
  Output,   ///< the rule's `output`: one value per element, written every step, not saved
  Scalar,   ///< the rule's `scalar`: one float64 per param
  Row,      ///< the rule's `row`: one fp32 per row of the param's matrices
  Col,      ///< the rule's `col`: one fp32 per column
  Master,   ///< the fp32 master copy of a 16-bit param (OptimizerOptions::master_weights)
  Absmax,   ///< "NAME.absmax": the fp32 absmax per block of quantized state NAME (empty for
            ///< a param whose NAME is not quantized)
};
/// "element", "output", "scalar", "row", "col", "master", "absmax".
FUSEDOPT_API const char* to_string(StateKind kind);

/// One state an optimizer keeps per parameter (Optimizer::states()).
struct StateInfo {
  std::string name;  ///< as state() and checkpoints name it ("m", "master")
  StateKind kind = StateKind::Element;
  DType dtype = DType::F32;  ///< its storage (where quantized: DType::U8, the codes)
  bool saved = true;         ///< whether checkpoints hold it (all but outputs)
  /// An element state's block-quantized storage, for params of at least quant_min_numel
  /// elements (smaller ones keep `dtype`... F32, F16 or BF16: state_dtype).
  Quant quant = Quant::None;
};

/// What one pass of a step moves over the elements of one dtype binding, role by role, in
/// bits per element (a 4-bit state's codes: 4; the absmax per block and row/column states
/// not counted): the traffic a floor must reproduce (bench/floor.hpp streams the same).
struct PassTraffic {
  std::int64_t elements = 0;
  std::vector<int> read_bits;    ///< roles the pass reads and does not write
  std::vector<int> update_bits;  ///< roles it reads and writes (in place)
  std::vector<int> write_bits;   ///< roles it writes without reading them
};

struct OptimizerStats {
  std::int64_t tensors = 0;  ///< parameters (empty ones included)
  std::int64_t elements = 0;
  std::int64_t launches_per_step = 0;  ///< kernel launches of one step(): per dtype binding,
                                       ///< one per reduction pass, one finalize after each
                                       ///< (up to three with pieces of a factored rule),
                                       ///< the update, and on CUDA the one-thread launch that
                                       ///< counts the step on the device
  std::int64_t bytes_per_step = 0;     ///< bytes read + written by one step (every pass)
  /// Per dtype binding and pass, in launch order: what it reads and writes. The sum of
  /// elements x bits / 8 over them (an updated role twice) is bytes_per_step.
  std::vector<PassTraffic> traffic;
  std::size_t state_bytes = 0;  ///< memory of the rule's states, outputs and fp32
                                ///< masters (64-byte aligned views)
  int reduction_passes = 0;     ///< passes before the update (0: element-wise rule)
  /// The strategy chosen for the reduction passes (Recompute or Store, never Auto); none
  /// without reductions.
  std::optional<ReductionStrategy> reduction_strategy;
  std::int64_t bytes_recompute = 0;  ///< bytes per step under each strategy
  std::int64_t bytes_store = 0;
  std::string schedule_report;  ///< the passes, what each reads and writes, and the
                                ///< recompute-or-store choice with its bytes
  /// The ops of a plain step and of a scaled one, in order (the step program: "reduce 0,
  /// finalize 0, hook 0, update, end"; a ShardedOptimizer's local optimizer adds "begin"
  /// and "publish"), for logs and bug reports.
  std::string step_program, scaled_step_program;
  std::vector<std::string> kernel_keys;
  double kernel_seconds = 0;  ///< compile or cache-load time at construction
  /// Where the kernels came from: the dearest origin of any (none without a kernel).
  std::optional<KernelOrigin> kernel_origin;
  std::string fusion_report;  ///< e.g. "adamw over 201 tensors (109.5 M elements): 1 launch per
                              ///< step instead of 201"
};

class GradScaler;

/// What a grad-scaled step did: whether it was taken (false: an unscaled gradient was not
/// finite and nothing changed). On the host the answer is known when the step returns. On
/// CUDA the check and the skip happen on the device and the step only launches; the answer
/// is read back (waiting for every queued launch of the device) the first time it is asked,
/// then kept. Ask before the optimizer's next step, which reuses the device flag: asking
/// later, or after the optimizer is gone, is a UsageError. Converts to bool, so
/// `if (!opt.step_scaled(inv))` reads as before; a result never asked for costs nothing.
class FUSEDOPT_API StepResult {
 public:
  StepResult() = default;
  explicit StepResult(bool taken) : taken_(taken) {}
  /// Whether the step was taken (reads the device's verdict the first time; see above).
  bool taken() const;
  operator bool() const { return taken(); }  // NOLINT: reads like the bool it replaces
  /// Whether the answer is on the host already (taken() will not wait).
  bool known() const { return pending_ == nullptr; }

  /// Internal: a verdict still on the device (made by the optimizer's step).
  struct Pending;
  explicit StepResult(std::shared_ptr<const Pending> pending) : pending_(std::move(pending)) {}

 private:
  mutable std::shared_ptr<const Pending> pending_;
  mutable bool taken_ = true;
};

/// The storage each of `rule`'s states gets under `options` (its `storage` declarations, then
/// options.state_storage; "q8"/"q4" resolved by the rule's sign proof), for params of at
/// least options.quant_min_numel elements; *stochastic (when given) gets bit k for each state
/// k whose codes are rounded stochastically ("+sr", DTypeBinding::quant_sr). UsageError for an
/// unknown state or storage.
FUSEDOPT_API std::vector<Quant> resolve_state_storage(const Rule& rule,
                                                      const OptimizerOptions& options,
                                                      std::uint64_t* stochastic = nullptr);

/// The binding a param of at least options.quant_min_numel elements steps in where `plain`
/// is what smaller params of its dtypes use: `plain` with the states' storage of
/// resolve_state_storage (and options.quant_block), or nullopt where no state is quantized,
/// `plain` names its storage already, or its params are float64 (never quantized). What a
/// warmup compiles besides `plain` (fusedopt-cache warmup, fusedopt.warmup).
FUSEDOPT_API std::optional<DTypeBinding> quantized_binding(const Rule& rule,
                                                           const DTypeBinding& plain,
                                                           const OptimizerOptions& options = {});

/// The checks of `options` that need no param, which the Optimizer's constructor makes first
/// (a front end calls it to refuse bad options when they are given): UsageError naming the
/// first bad one.
FUSEDOPT_API void check_options(const OptimizerOptions& options);

/// The one rule for a hyper's value: finite and within fp32's range (kernels read hypers as
/// fp32: 1e300 would be inf there). Throws UsageError naming `where` (the caller), the
/// hyper and its group otherwise.
FUSEDOPT_API void check_hyper_value(const std::string& where, const std::string& name, int group,
                                    double value);

/// Runs `rule` over every parameter of every group. States are allocated (one arena per
/// dtype and device) and initialised from the rule at construction.
///
/// A moved-from Optimizer may be destroyed or assigned to; its other methods throw
/// UsageError ("Optimizer::step: this Optimizer was moved from").
///
/// CUDA ordering: step() and step_scaled() launch on `stream` and never wait: the step count
/// lives on the device (each launch reads it; it advances after the step's last launch,
/// unless the device skipped the step), the inverse scale goes by value (or from a device
/// GradScaler), a scaled step's grad check and skip happen on the device. So every step,
/// scaled or not, can be captured in a CUDA graph and replayed. The reduction hook is called
/// with `stream`. set_hyper(name, value, group, stream) is ordered on `stream` without
/// waiting. set_hyper(), save(), load(), step_count() and a StepResult's taken() first
/// wait for all work queued on the device (every stream of its context: a superset of
/// `stream`'s order), then read or write device memory, so they are safe after steps on any
/// stream. state() is a view of device memory: read it in stream order after the steps (or
/// after a synchronize).
///
/// Hyper values: every entry point (group hypers, set_hyper, load) takes what
/// check_hyper_value takes.
///
/// Threads: an Optimizer is used by one thread at a time, as torch's optimizers are. A
/// call to step, step_scaled, step_amp, set_hyper, set_step_count, rebind, save or load
/// while another of them runs on the same optimizer (another thread, or a reduction hook
/// calling back) is a UsageError naming both, never a race.
class OptimizerExtension;  // fusedopt/extension.hpp: what libraries built on it may do

class FUSEDOPT_API Optimizer {
 public:
  /// Throws Error naming the tensor and the reason for any misuse (grads missing or of a
  /// different size, null data, a device this build cannot use, an unknown hyper).
  Optimizer(const Rule& rule, std::vector<ParamGroup> groups, OptimizerOptions options = {});
  ~Optimizer();
  Optimizer(Optimizer&&) noexcept;
  Optimizer& operator=(Optimizer&&) noexcept;

  /// One step: one launch per dtype binding. `stream` is a CUstream for CUDA tensors
  /// (nullptr: the default stream), ignored on the host. Always taken (the same face as
  /// step_scaled and comm::ShardedOptimizer::step).
  StepResult step(void* stream = nullptr);
  /// A step with the gradients multiplied by `inv_grad_scale` in the kernel. If any
  /// unscaled gradient is not finite, nothing changes (params, state and the step count
  /// stay bit for bit) and the result says not taken. The check rides on the first pass
  /// that reads the gradients when that pass writes nothing (rules with reductions), else
  /// it is one launch before the update. On CUDA nothing waits (see StepResult).
  StepResult step_scaled(float inv_grad_scale, void* stream = nullptr);

  /// A step under PyTorch's fused-optimizer AMP protocol (a GradScaler that sees
  /// `_step_supports_amp_scaling`): the gradients are divided by the fp32 at `grad_scale`
  /// (null: they are unscaled already) and the whole step, its count included, is skipped
  /// when the fp32 at `found_inf` (null: none) is non-zero; no grad check of its own (the
  /// scaler made it). Both live in memory of the optimizer's device: the host reads them
  /// before the step; on CUDA the launches read them in `stream`'s order and nothing
  /// waits. Returns whether the step was taken, as step_scaled().
  StepResult step_amp(const float* grad_scale, const float* found_inf, void* stream = nullptr);

  /// Points the params and grads at new memory, keeping the plan, the kernels and the
  /// states: `param_data[i]` and `grad_data[i]` belong to parameter i (over every group, in
  /// order) and a null entry keeps the current pointer; each list is empty or has one entry
  /// per parameter. The memory must hold what construction was given (numel, dtype, device,
  /// shape): this is for tensors that move between steps, like PyTorch's `.grad` after
  /// zero_grad(set_to_none=True). Params or grads that overlap (and, on CUDA, memory that
  /// is not the device's) are refused, naming the tensor, and change nothing. CUDA: the pointer
  /// tables are updated in `stream`'s order without waiting (steps queued on other streams are not
  /// ordered with it).
  void rebind(const std::vector<void*>& param_data, const std::vector<void*>& grad_data,
              void* stream = nullptr);
  /// Sets the count of steps taken (the next step's `step` is count + 1; 0 to 2^53), for a
  /// caller that keeps the count with its own state (a framework's checkpoint). CUDA: waits
  /// for every queued launch of the device first.
  void set_step_count(std::int64_t count);

  /// Sets a hyper for one group, or for every group when `group` is empty. CUDA: waits for
  /// every queued launch of the device first, so it is safe whatever stream the steps use.
  void set_hyper(const std::string& name, double value, std::optional<int> group = std::nullopt);
  /// The same, ordered on `stream` (a CUstream; nullptr is the legacy default stream) without
  /// waiting: the steps launched on `stream` after it use the new value, those queued
  /// before it the old one (an LR schedule changing "lr" every step costs no
  /// synchronisation). Launches on other streams are not ordered with it. Refused with
  /// UsageError, changing nothing, while `stream` is being captured (a captured copy would
  /// read host memory gone by the replay; a captured step reads the hypers when it replays).
  void set_hyper(const std::string& name, double value, std::optional<int> group, void* stream);
  double hyper(const std::string& name, int group = 0) const;
  /// Steps taken so far (the next step's `step` is step_count() + 1).
  std::int64_t step_count() const;
  OptimizerStats stats() const;

  /// Every state kept per parameter, in one order (element states, outputs, scalars, rows,
  /// columns, the master copy): what state() views and checkpoints hold.
  std::vector<StateInfo> states() const;
  /// The optimizer's state of tensor `param` (a flat view), e.g. state("m", 3). A quantized
  /// state's view holds its codes (DType::U8: a byte per element, or per two elements at 4
  /// bits); "m.absmax" views its absmax per block.
  Tensor state(const std::string& name, int param_index) const;
  /// The values of element state (or output) `name` of tensor `param_index`, as fp32 on the
  /// host: a copy, dequantized where the state is quantized, widened from 16 bits. Waits for
  /// the device like save().
  std::vector<float> state_values(const std::string& name, int param_index) const;

  /// Writes a safetensors file: one tensor "<param name>/<state>" per (parameter, state)
  /// pair (and "<param name>/master"), metadata with the rule, its key, the step and the
  /// hypers. Atomic. CUDA: waits for the device's queued work first.
  void save(const std::filesystem::path& path) const;
  /// Reads a file written by save(); a mismatched name, shape or dtype is an Error and
  /// changes nothing. The next step is bit-identical to the saver's next step.
  void load(const std::filesystem::path& path);

 private:
  friend class GradScaler;  // a device GradScaler steps with its scale in device memory
  friend class StepResult;  // reads a step's verdict from the device
  friend class OptimizerExtension;
  struct Impl;
  /// An optimizer of a built Impl (OptimizerExtension::make: one of pieces).
  explicit FUSEDOPT_NO_EXPORT Optimizer(std::unique_ptr<Impl> impl);
  /// The Impl, or UsageError("Optimizer::<method>: this Optimizer was moved from").
  Impl& live(const char* method) const;
  std::unique_ptr<Impl> impl_;
};

/// An optimizer GradScaler::step drives through the optimizer itself, besides Optimizer:
/// comm::ShardedOptimizer, which reduces its gradients across ranks around the scaler's step
/// (scaler.step(sharded) and sharded.step(scaler) are the same call).
class FUSEDOPT_API ScaledOptimizer {
 public:
  virtual ~ScaledOptimizer() = default;
  /// One step under `scaler` (see GradScaler::step).
  virtual StepResult step(GradScaler& scaler, void* stream = nullptr) = 0;

 protected:
  ScaledOptimizer() = default;
  ScaledOptimizer(const ScaledOptimizer&) = default;
  ScaledOptimizer& operator=(const ScaledOptimizer&) = default;
};

/// Dynamic loss scaling, like torch.amp.GradScaler: scale the loss by scale(), then step()
/// unscales inside the kernel; a non-finite gradient skips the step and backs the scale off,
/// and `growth_interval` good steps in a row grow it (torch's _amp_update_scale_, in fp32).
///
/// A host GradScaler (the default) keeps its scale on the host: a plain value, copying or
/// moving it copies the scale and the tracker (a moved-from one stays valid and unchanged).
/// It steps any optimizer; on CUDA it reads the verdict of each step back (a
/// synchronisation: the scale it keeps on the host depends on it). A device GradScaler
/// (on_device()) keeps the scale, the growth tracker and the last verdict in device memory and
/// updates them there: its step() only launches (no synchronisation, copy or allocation), so a
/// whole GradScaler step can be captured in a CUDA graph, and the host reads the state back only
/// when asked (scale(), growth_tracker(), last_step_taken()). Copies of a device GradScaler share
/// its state.
class FUSEDOPT_API GradScaler {
 public:
  struct Options {
    double init_scale = 65536.0;
    double growth_factor = 2.0;
    double backoff_factor = 0.5;
    int growth_interval = 2000;
  };
  GradScaler() : GradScaler(Options{}) {}
  explicit GradScaler(Options options);
  /// A device GradScaler for `opt`, which must be a CUDA optimizer with at least one
  /// element: its state lives in memory of `opt`'s device (allocated and written here,
  /// once). It then steps any CUDA optimizer of that device.
  static GradScaler on_device(const Optimizer& opt, Options options);
  static GradScaler on_device(const Optimizer& opt) { return on_device(opt, Options{}); }

  GradScaler(const GradScaler&) = default;  // no move members: a move copies
  GradScaler& operator=(const GradScaler&) = default;
  ~GradScaler();

  bool is_on_device() const { return device_ != nullptr; }
  /// The current scale (an fp32 value). A device GradScaler reads it from the device,
  /// after every queued launch.
  double scale() const;
  /// Good steps in a row since the scale last changed (read like scale()).
  int growth_tracker() const;
  /// Device address of the fp32 scale, to multiply the loss by inside a captured graph;
  /// null for a host GradScaler.
  const float* device_scale() const;
  /// Steps `opt` with the gradients multiplied by grad_factor / scale() (computed in double,
  /// rounded once to fp32) and updates the scale. Returns whether the step was taken: a host
  /// GradScaler knows it; a device GradScaler's result is read from the device only when
  /// asked (StepResult; or last_step_taken()). `stream` as for Optimizer::step. `grad_factor` folds
  /// one more factor into the same launches: data parallel passes GradBucketer::grad_scale() (1 /
  /// ranks), so the average over ranks and the unscale are one multiplication.
  StepResult step(Optimizer& opt, void* stream = nullptr, float grad_factor = 1.0f);
  /// Steps `opt` (a comm::ShardedOptimizer) under this scaler: opt.step(*this, stream).
  StepResult step(ScaledOptimizer& opt, void* stream = nullptr) { return opt.step(*this, stream); }
  /// Whether the last step() was taken (false: skipped for a non-finite gradient); true
  /// before any. A device GradScaler reads it from the device, after every queued launch.
  bool last_step_taken() const;

 private:
  struct DeviceState;
  Options options_;
  double scale_;
  int good_steps_ = 0;
  bool last_taken_ = true;
  std::shared_ptr<DeviceState> device_;  ///< null: a host GradScaler
};

/// Params and grads contiguous, one buffer per dtype (Bagua's do_flatten): add() returns a
/// view into the arena; the arena owns the memory (host memory only). A moved-from arena
/// may be destroyed or assigned to; its other methods throw UsageError (the views it handed
/// out now belong to the arena it was moved into).
class FUSEDOPT_API FlatArena {
 public:
  FlatArena();
  ~FlatArena();
  FlatArena(FlatArena&&) noexcept;
  FlatArena& operator=(FlatArena&&) noexcept;
  /// Reserves a tensor of `numel` elements; views stay valid until the arena is destroyed.
  /// Each view starts 64-byte aligned. Call finalize() before using the views. UsageError
  /// for a negative `numel` or a `dtype` that is not a DType value.
  void add(const std::string& name, std::int64_t numel, DType dtype);
  /// Allocates the buffers (zeroed).
  void finalize();
  /// Takes each dtype's gradient buffer from `grad_memory(bytes)` and, when given, its
  /// params' from `param_memory(bytes)` (each called once per dtype, in a fixed order,
  /// gradients first, but not for a dtype whose tensors are all empty, which needs no
  /// memory; 64-byte aligned memory that outlives the arena, which zeroes it; the arena
  /// allocates what a null function leaves): for example
  /// `[&](std::size_t n) { return comm.allocate_shared(n); }`, so that gradients are reduced,
  /// and a ZeRO optimizer's params broadcast, in place in shared memory (docs/comm.md).
  void finalize(const std::function<void*(std::size_t bytes)>& grad_memory,
                const std::function<void*(std::size_t bytes)>& param_memory = nullptr);
  /// The view of tensor `i` (in add() order), and its gradient twin.
  Tensor param(std::size_t i) const;
  Tensor grad(std::size_t i) const;
  std::size_t size() const;

 private:
  struct Impl;
  /// The Impl, or UsageError("FlatArena::<method>: this FlatArena was moved from").
  Impl& live(const char* method) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusedopt
