// The extension API: what a library built on fusedopt's Optimizer may do beyond a user's API.
// fusedopt's own libraries use it and nothing else: the comm module's ShardedOptimizer (its
// ops in the step program, its pieces, its sharded checkpoints), the Python front end
// (fusedopt.torch: its process groups' reduction hook, the live step count) and the
// benchmarks (the time of each reduction pass). Versioned as the rest of the public API, with
// its own number for what an extension may rely on (FUSEDOPT_EXTENSION_VERSION).
//
// The types name passes and slots of the kernel's schedule: a rule's reductions
// (Rule::reduction_passes) run one pass each before the update, and every pass writes raw
// totals that an extension may combine across processes before the next pass reads them.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusedopt/export.hpp"
#include "fusedopt/optimizer.hpp"
#include "fusedopt/safetensors.hpp"

/// The extension API's version: raised when a type or entry point of this header changes
/// in a way an extension must follow. 1: 2026-11-28 (what was internal before).
#define FUSEDOPT_EXTENSION_VERSION 1

namespace fusedopt {

/// One total a reduction pass produces: what it is and how ranks combine it.
struct ReductionSlotInfo {
  std::string name;         ///< the rule's function ("tensor_norm", ...) or "grad_check"
  bool per_tensor = false;  ///< a value per tensor (else one global value)
  int slot = 0;             ///< index in ReductionPartials::global, or the column of
                            ///< ReductionPartials::TensorTotals
  int pass = 0;             ///< the pass that computes it
  bool max = false;         ///< ranks combine it by max (maxabs, any_nonfinite, grad_check);
                            ///< else by sum
  int line = 0;             ///< the rule line of the call (0: built in)
};

/// The raw totals of one reduction pass on this process, handed to the reduction hook
/// before the next pass reads them: sums (of x, of x*x for norms), max |x|, and counts of
/// non-finite values, in double. A sharded optimizer combines the slots of this pass
/// across ranks in place (sum, or max where `max`), e.g. with one all-reduce each; the
/// next pass then sees the totals of every rank. Norms take their square root afterwards.
/// Memory is host memory for host optimizers and device memory (of the optimizer's
/// device, ordered on `stream`) for CUDA ones. Slots of other passes must be left alone.
/// A scaled step whose grad check does not ride on pass 0 (rules without reductions, the
/// Store strategy, capturable steps) first calls the hook with pass -1 and one slot,
/// "grad_check" (global, max): non-zero when this process found a non-finite gradient;
/// combined across ranks, every rank takes or skips the same step.
///
/// Pieces (Tensor::whole_shape, PyTorch FSDP2: each rank's optimizer holds a dim-0 piece of
/// every param, possibly empty). The contract of a hook, for the ranks that hold pieces of
/// the same tensors: every buffer handed in one call must be combined element-wise across
/// those ranks, in place: the global slots of this pass and the per-tensor columns of this
/// pass (`slots`: by sum, or max where `max`), and all `num_shard` doubles of `shard` (by
/// sum, or max where shard_max[i]). Every rank receives the same sequence of calls, each
/// with the same sizes and layouts (the same bindings, each with the same tensors: an empty
/// piece takes part as any other), so a hook may combine with one collective per buffer in
/// call order. Then every rank computes what the unsharded tensors compute (within the
/// rounding of the sums' order). The shard holds a factored rule's sums that span pieces:
/// the column sums (col_mean) and matrix sums over rows (matrix_mean of a row value) of
/// each piece of a 1-D or 2-D tensor (its rows are its own, its columns are not; a piece of
/// a 3-D or bigger tensor holds whole matrices). Their pass's finalize then takes stages:
/// stage 0's call (this pass's totals, the shard's column sums), then, when the pass has
/// matrix means over rows, a stage 1 call (`stage` 1: no slots, no per-tensor totals, the
/// shard's matrix sums). Without pieces nothing changes: no shard, no stage 1 call.
struct ReductionPartials {
  int pass = 0;
  int stage = 0;  ///< 0: the pass's totals; 1: its matrix sums over rows (pieces: see above)
  Device device;
  void* stream = nullptr;
  double* global = nullptr;  ///< [num_global] raw global totals
  int num_global = 0;
  std::vector<ReductionSlotInfo> slots;  ///< the slots this pass wrote (global and per tensor)
  /// Per-tensor totals of one dtype binding: data[t * stride + slot] belongs to the t-th
  /// tensor of the binding, which is parameter params[t] (index over all groups, in order).
  struct TensorTotals {
    double* data = nullptr;
    std::int64_t num_tensors = 0;
    int stride = 0;
    std::vector<int> params;
  };
  std::vector<TensorTotals> tensors;  ///< empty in a stage 1 call
  /// [num_shard] doubles: the sums that span pieces (see above), laid out the same on every
  /// rank (each binding's in order, within it each spanning tensor's: its columns x the
  /// rule's column slots, then its matrix slots, at least one of each); entries this call
  /// does not use are 0.
  /// Null and 0 without pieces, and in the calls of a pass without column or matrix means
  /// (its finalize takes no stages).
  double* shard = nullptr;
  std::int64_t num_shard = 0;
  std::vector<char> shard_max;  ///< [num_shard]: 1 where ranks combine by max (today: none)
};
using ReductionHook = std::function<void(const ReductionPartials&)>;

/// A rule's matrix stages after pass `pass` (orthogonalize) on this process, handed to the
/// step extension when the optimizer's params are pieces: each piece holds the stage's input
/// for its elements of a whole matrix, to be replaced by the same elements of the whole
/// matrix's result. Every rank receives the same calls (its list of pieces possibly empty).
struct MatrixStageWork {
  int pass = 0;
  Device device;
  void* stream = nullptr;
  struct Piece {
    float* data = nullptr;  ///< the piece's values (the optimizer's device memory)
    std::int64_t numel = 0;
    long long param = 0;      ///< the whole param (PieceOrigin::param)
    std::int64_t offset = 0;  ///< the piece's first element in the whole param
    std::int64_t rows = 0;    ///< the whole param's matrix: its first dimension ...
    std::int64_t cols = 0;    ///< ... by the product of the others
    int stage = 0;            ///< which of the rule's stages (its orthogonalize calls)
    int group = 0;            ///< the param group (its hypers set the iteration)
  };
  std::vector<Piece> pieces;
  /// The rule's stages after this pass (indices: Piece::stage), the same on every rank.
  std::vector<int> stages;
  /// Replaces the whole matrix of `rows` x `cols` at `data` (host memory, row-major) by the
  /// iteration of stage `stage` with group `group`'s hypers.
  std::function<void(int stage, int group, float* data, std::int64_t rows, std::int64_t cols)>
      orthogonalize;
};

/// What a library adds to an Optimizer's step: ops of its step program, each at a fixed place
/// of every step, in program order. Set with OptimizerExtension::set_step_extension.
class StepExtension {
 public:
  virtual ~StepExtension() = default;
  /// `begin`, the step's first op: e.g. the gradients' all-reduce finished.
  virtual void begin(void* stream) = 0;
  /// Each reduction pass's raw totals on this process (and the grad check's, pass -1; see
  /// ReductionPartials), combined in place before the next pass reads them.
  virtual void combine(const ReductionPartials& totals) = 0;
  /// The matrix stages of pass `work.pass` over pieces: gathers each whole matrix, has it
  /// orthogonalized (work.orthogonalize) and puts each piece's part of the result back in
  /// place. False (this default): the extension does not, and the optimizer runs the stages
  /// on its own tensors (which must be whole).
  virtual bool orthogonalize(const MatrixStageWork& work) {
    (void)work;
    return false;
  }
  /// `publish`, after the step count: the updated parameters made everyone's (a skipped step
  /// that stops on the host does not get here; on a device it publishes unchanged ones).
  virtual void publish(void* stream) = 0;

 protected:
  StepExtension() = default;
  StepExtension(const StepExtension&) = default;
  StepExtension& operator=(const StepExtension&) = default;
};

/// Where a param of an Optimizer comes from when it is a piece of a bigger one (a
/// ShardedOptimizer's local optimizer; a PyTorch FSDP2 rank's shard): the whole param's index,
/// the piece's first element in it, and the whole param's elements.
struct PieceOrigin {
  long long param = 0;
  long long offset = 0;
  long long numel = 0;
  /// The whole param's shape, when it has one (a piece is then an element range of it, its
  /// own shape empty): the rule's built-ins (numel, dims, rows, cols) read it, and a matrix
  /// stage orthogonalizes that matrix (gathered by the step extension). Empty: built-ins of
  /// the piece, as before.
  std::vector<std::int64_t> shape;
};

/// The entry points of the extension API. Each takes the optimizer it acts on; a moved-from
/// one is a UsageError naming the entry point, as for Optimizer's own methods.
class FUSEDOPT_API OptimizerExtension {
 public:
  /// An Optimizer whose param p is a piece of a bigger param (origins[p]; empty: each param
  /// is whole): it draws its random numbers (stochastic rounding, rand()) as elements
  /// origins[p].offset + i of param origins[p].param, and its states are quantized when that
  /// param's origins[p].numel elements are enough (quant_min_numel), so the pieces round and
  /// quantize exactly as the whole params would (cut on block boundaries).
  static std::unique_ptr<Optimizer> make(const Rule& rule, std::vector<ParamGroup> groups,
                                         OptimizerOptions options,
                                         std::vector<PieceOrigin> origins);
  /// Adds `extension`'s ops to `opt`'s step program (null: none; replaces a reduction hook);
  /// it must outlive `opt` or be removed first.
  static void set_step_extension(Optimizer& opt, StepExtension* extension);
  /// An extension that only combines: `hook` with each pass's totals (empty: none; replaces
  /// a step extension). The optimizer keeps the hook.
  static void set_reduction_hook(Optimizer& opt, ReductionHook hook);
  /// The optimizer's step count where the steps write it: one double in the device's memory
  /// (host memory for host optimizers), valid while `opt` lives. A front end shows it live
  /// (fusedopt.torch's opt.state[p]['step']); it is written by the step's last op, in stream
  /// order on a device.
  static Tensor step_counter(const Optimizer& opt);
  /// Optimizer::load of a checkpoint already in memory and checked by the caller (a sharded
  /// checkpoint's pieces of this rank): `metadata` and `tensors` as save() writes them; the
  /// same checks, all before anything changes. `where` names it in errors.
  static void load_tensors(Optimizer& opt, const std::map<std::string, std::string>& metadata,
                           const std::vector<SafetensorsTensor>& tensors, const std::string& where);
  /// load_tensors' checks alone (the same, in the same order), changing nothing: a library
  /// that loads on several processes (the sharded checkpoints) runs them on every process
  /// before any loads, so that all load or none (a state's values, e.g. a bad absmax in one
  /// rank's pieces, fail on that rank alone).
  static void check_tensors(Optimizer& opt, const std::map<std::string, std::string>& metadata,
                            const std::vector<SafetensorsTensor>& tensors,
                            const std::string& where);
};

}  // namespace fusedopt
