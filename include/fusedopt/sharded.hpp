// Sharded optimizer state (ZeRO-1 and ZeRO-2) over a Communicator: each rank keeps the
// optimizer state of 1/W of the parameters and runs one fused step over it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::comm {

struct ShardOptions {
  /// 1: ZeRO-1 (gradients all-reduced, state sharded); 2: ZeRO-2 (each gradient bucket
  /// reduced to the rank that owns it: half the traffic of an all-reduce).
  int stage = 1;
  /// Buckets of the gradient reduction (bucket_bytes also cuts the parameter gather).
  BucketOptions buckets;
  /// The options of the fused optimizer each rank runs over its shard.
  OptimizerOptions optimizer;
};

/// What a ShardedOptimizer holds and moves. Bytes are this rank's unless said otherwise.
struct ShardStats {
  int stage = 1;
  int rank = 0;
  int ranks = 1;
  std::int64_t elements = 0;        ///< of every parameter (all ranks' shards)
  std::int64_t owned_elements = 0;  ///< of this rank's shard
  std::size_t state_bytes = 0;      ///< optimizer state and fp32 masters held here
  int reduce_collectives = 0;       ///< gradient collectives per step
  int gather_collectives = 0;       ///< parameter broadcasts per step
  std::size_t gradient_bytes = 0;   ///< gradient bytes reduced per step (the whole model)
  std::size_t parameter_bytes = 0;  ///< parameter bytes gathered per step (the whole model)
  std::string report;               ///< "rank 1 of 4 owns 27.4 M of 109.5 M elements (ZeRO-2): ..."
  OptimizerStats local;             ///< the fused optimizer over this rank's pieces
};

/// A data-parallel optimizer whose state is sharded across the ranks of `comm`, like
/// fairscale's OSS and DeepSpeed's ZeRO-1/2. The parameters (and the gradients) of each
/// dtype live in one flat buffer in parameter order (FlatArena's, or any such buffer, as for
/// GradBucketer); the concatenation of each dtype's parameters is cut into W equal
/// contiguous shards (the last one shorter), so a parameter may straddle shards. Rank r
/// runs ONE fused optimizer over the pieces it owns (state for those only: total / W), then
/// every rank's pieces are broadcast to the others in buckets (the parameters are whole and
/// identical everywhere after each step).
///
/// Each step: mark_ready(i) as gradient i is complete during backward (its bucket's
/// reduction starts as soon as it and every bucket before it are ready, strictly in order
/// on every rank), then step() / step_scaled() / step(GradScaler&): waits for the
/// reductions with the deadline, steps the shard with the average over ranks folded into
/// the gradient scale, and gathers the parameters.
///
/// Reductions that span tensors or ranks are combined across ranks before the pass that
/// uses them (the optimizer's reduction hook, in float64): per-tensor norms of straddling
/// parameters, global norms (clipping), and the non-finite check of a scaled step, so
/// sharded LAMB, LARS and clipped AdamW equal the unsharded optimizer and a non-finite
/// gradient on any rank skips the step on every rank.
///
/// Host tensors go over an MPI communicator, CUDA tensors of one device over an NCCL one
/// (every parameter and gradient on the communicator's device, else UsageError). On CUDA
/// the collectives run on the step's stream; the per-tensor totals are staged through the
/// host for their all-reduce (a few doubles per tensor: one synchronisation per reduction
/// pass), the global ones are all-reduced in place on the device, and every rank gathers
/// the parameters before it reads the step's verdict (a skipped step broadcasts unchanged
/// pieces).
class FUSEDOPT_COMM_API ShardedOptimizer : public ScaledOptimizer {
 public:
  /// Collective: every rank of `comm` constructs it with the same parameters (sizes, dtypes,
  /// groups), rule and options; a difference is a CommError on every rank naming it.
  ShardedOptimizer(Communicator comm, const Rule& rule, std::vector<ParamGroup> groups,
                   ShardOptions options = {});
  ~ShardedOptimizer();
  ShardedOptimizer(ShardedOptimizer&&) noexcept;
  ShardedOptimizer& operator=(ShardedOptimizer&&) noexcept;

  /// Gradient `param` (its index over all groups, in order) is complete for this step.
  void mark_ready(int param, void* stream = nullptr);
  /// Every gradient not marked yet is complete.
  void mark_all_ready(void* stream = nullptr);

  /// One step with the average over ranks: waits for the gradient reductions (marking
  /// every gradient not marked yet), steps this rank's shard, gathers the parameters.
  /// Not taken, changing nothing on any rank, when a gradient is not finite. The same face
  /// as Optimizer's: a StepResult (on CUDA the verdict may stay on the device until asked).
  StepResult step(void* stream = nullptr);
  /// step() with the gradients also multiplied by `inv_grad_scale`.
  StepResult step_scaled(float inv_grad_scale, void* stream = nullptr);
  /// step() under dynamic loss scaling: `scaler` unscales (one factor 1/(scale x ranks))
  /// and updates its scale the same way on every rank. scaler.step(*this) does the same.
  StepResult step(GradScaler& scaler, void* stream = nullptr) override;

  void set_hyper(const std::string& name, double value, std::optional<int> group = std::nullopt);
  /// set_hyper ordered on `stream` without waiting (as Optimizer's).
  void set_hyper(const std::string& name, double value, std::optional<int> group, void* stream);
  double hyper(const std::string& name, int group = 0) const;
  /// This rank's piece of state `name` of parameter `param` (its index over all groups):
  /// elements owned_range(param) of it; numel 0 (data null) where this rank owns none.
  Tensor state(const std::string& name, int param) const;
  std::int64_t step_count() const;
  ShardStats stats() const;
  /// The fused optimizer over this rank's pieces (its params are views of the pieces).
  const Optimizer& local() const;

  /// Collective: a checkpoint of the sharded state without consolidating it. Each rank
  /// writes the pieces it owns (Optimizer::save of local(), one safetensors file per rank:
  /// "<param>/<state>" for its piece), then rank 0 commits the set by writing
  /// `dir`/index.safetensors (the world size, every parameter and every piece's global
  /// offset) atomically, and removes the previous set's files. Until the index is written
  /// the previous checkpoint in `dir` stays whole and loadable (a save killed halfway
  /// leaves it). Parameters are the caller's: save them as well.
  void save(const std::filesystem::path& dir) const;
  /// Collective: loads a checkpoint written by save() at ANY world size; each rank reads only
  /// the byte ranges of the pieces it now owns. The parameters (names, sizes, dtypes), rule
  /// and hypers must match; any difference or damage is an Error on every rank and changes
  /// nothing.
  void load(const std::filesystem::path& dir);

  /// Converts a checkpoint of save() into one file in Optimizer::save's format (which a
  /// plain Optimizer over the same parameters loads), holding one tensor in memory at a
  /// time. No communicator needed (the fusedopt-ckpt tool).
  static void merge_checkpoint(const std::filesystem::path& dir, const std::filesystem::path& file);
  /// The reverse: a file of Optimizer::save (with its parameter list, written since format
  /// 1 of 2026-11) into a sharded checkpoint for `world_size` ranks in `dir`, one tensor in
  /// memory at a time.
  static void split_checkpoint(const std::filesystem::path& file, const std::filesystem::path& dir,
                               int world_size);

  /// The piece of parameter `param` this rank owns: [begin, end) in its elements (empty
  /// when it owns none of it).
  std::pair<std::int64_t, std::int64_t> owned_range(int param) const;

 private:
  struct Impl;
  Impl& live(const char* method) const;
  std::unique_ptr<Impl> impl_;
};

}  // namespace fusedopt::comm
