// The public face of the core pipeline: parse a rule (or take a preset), compile it for a
// target and dtype binding through the kernel cache, and inspect what came out. The
// optimizer runtime builds on this.
#pragma once

#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/export.hpp"
#include "fusedopt/target.hpp"

namespace fusedopt {

namespace lang {
struct Rule;
}
struct RuleAccess;  // fusedopt's own components reach the checked rule through it

/// A parsed and checked optimizer rule (immutable, cheap to copy).
class FUSEDOPT_API Rule {
 public:
  /// Parses and checks `text`; `file` names it in diagnostics. Throws RuleError.
  static Rule parse(std::string_view text, const std::string& file = "<rule>");
  /// A shipped preset ("adamw", "sgd", ...), or a preset with an option chosen when it is
  /// compiled, "BASE+OPTION" ("adamw+amsgrad"). Throws Error for an unknown name.
  static Rule preset(const std::string& name);
  /// The preset names, options included ("adam", "adam+amsgrad", ...).
  static std::vector<std::string> presets();
  /// The options of preset `name` (e.g. {"amsgrad"} for "adamw"): each is the preset
  /// "name+OPTION".
  static std::vector<std::string> preset_options(const std::string& name);

  Rule(const Rule&) = default;
  Rule& operator=(const Rule&) = default;
  /// Moving a Rule copies it (one shared pointer): a moved-from Rule is still the same
  /// rule, so no method can meet an empty one.
  Rule(Rule&& other) noexcept : impl_(other.impl_) {}
  Rule& operator=(Rule&& other) noexcept {
    impl_ = other.impl_;
    return *this;
  }
  ~Rule() = default;

  const std::string& name() const;
  /// Hyper names with their defaults, in declaration order.
  std::vector<std::pair<std::string, double>> hypers() const;
  /// State tensor names, in declaration order.
  std::vector<std::string> states() const;
  /// Per-tensor scalar state names (`scalar NAME = INIT`: one double per tensor), in
  /// declaration order.
  std::vector<std::string> scalars() const;
  /// Row and column state names (`row NAME`, `col NAME`: one float per row or column of a
  /// param's matrices), in declaration order.
  std::vector<std::string> row_states() const;
  std::vector<std::string> col_states() const;
  /// The rule's `storage NAME = KIND` declarations (state name, kind), in order: the default
  /// block-quantized storage of its states (OptimizerOptions::state_storage overrides it).
  std::vector<std::pair<std::string, std::string>> storage() const;
  /// Passes over the data before the update (0: an element-wise rule).
  int reduction_passes() const;
  /// Matrix stages (`orthogonalize(...)` calls): each param must be a matrix (2 or more
  /// dimensions), and under sharding each is gathered whole for its stage.
  int matrix_stages() const;
  /// This rule with the gradient clipped by its global norm first (torch's
  /// clip_grad_norm_): a new hyper `max_grad_norm` (default `max_grad_norm`) and one more
  /// reduction. Named "<name>+clip". Throws RuleError if the rule already uses the name.
  Rule with_grad_clipping(double max_grad_norm = 1.0) const;

  /// The rule's text as parsed (a preset's text for a preset).
  const std::string& text() const;
  /// One line on what the rule compiles to (fp32 tensors): its tensors, hypers,
  /// statements, uniform values hoisted out of the element loop and reduction passes.
  std::string describe() const;

 private:
  friend struct RuleAccess;
  explicit Rule(std::shared_ptr<const lang::Rule> impl) : impl_(std::move(impl)) {}
  std::shared_ptr<const lang::Rule> impl_;
};

/// Trusted C++ for what the rule language cannot say. `code` must define
///   struct Functor { FO_FN void operator()(float& p, float& s0, ..., float g,
///                                          fo_hypers h) const; };
/// where fo_hypers has one float field per hyper, named as given, plus `step`. It is
/// compiled as written: never build one from untrusted input.
struct TrustedFunctor {
  std::string name;  ///< for #line and the cache record
  std::string code;
  std::vector<std::pair<std::string, double>> states;  ///< name, constant initial value
  std::vector<std::pair<std::string, double>> hypers;  ///< name, default value
};

/// How a rule with reductions gets values of its last reduction pass into the update
/// (e.g. LAMB's update direction u, needed for ||u|| and again for the update).
enum class ReductionStrategy {
  Auto,       ///< whichever moves fewer bytes per step (stats() says which; ties: Recompute)
  Recompute,  ///< the update pass recomputes them from the tensors (no extra memory)
  Store,      ///< the last reduction pass finishes what it can and stores the values the
              ///< update needs in fp32 scratch tensors (4 bytes per element each)
};

/// "auto", "recompute", "store".
FUSEDOPT_API const char* to_string(ReductionStrategy strategy);
/// to_string's names back; UsageError naming the others for anything else.
FUSEDOPT_API ReductionStrategy parse_reduction_strategy(const std::string& name);

/// Where a kernel came from, from the cheapest to the dearest: the process's memory cache, the
/// disk cache, or a fresh compile.
enum class KernelOrigin { Memory, Disk, Compiled };
/// "memory", "disk", "compiled".
FUSEDOPT_API const char* to_string(KernelOrigin origin);

/// How compile_kernel gets a kernel.
struct CompileOptions {
  ReductionStrategy reduction_strategy = ReductionStrategy::Auto;
  /// The kernel cache folder. Empty: the process-wide cache (FUSEDOPT_CACHE_DIR,
  /// FUSEDOPT_CACHE). A folder: a disk cache there, whatever FUSEDOPT_CACHE says.
  std::filesystem::path cache_dir;
};

/// A compiled kernel as the cache holds it. A plain value: copies and moves are member-wise,
/// and a moved-from one is empty (null `binary`), as a moved-from std::string is.
struct CompiledKernel {
  std::string key;     ///< 32 hex digits (XXH3-128 of the key record)
  std::string origin;  ///< "compiled", "memory" or "disk"
  double seconds = 0;  ///< time to get it (compile time on a miss)
  Target target;
  DTypeBinding dtypes;
  std::shared_ptr<const std::string> binary;  ///< CUBIN or shared object bytes
  std::string source;                         ///< the generated translation unit
  /// The cache's disk entry holding the binary, or empty when the disk tier did not keep
  /// it (memory-only cache, or a disk failure: see `cache_note`).
  std::filesystem::path disk_entry;
  std::string cache_note;  ///< the last disk failure the cache worked around, or ""
};

/// One pass over the data of a kernel: the tensors (roles) it reads and writes.
struct KernelPass {
  bool update = false;  ///< the last pass; the others are reduction passes
  std::vector<std::string> reads;
  std::vector<std::string> writes;
  /// Read + written, with the binding's storage sizes (a 4-bit state's codes: 0.5 each way;
  /// the absmax per block not counted).
  double bytes_per_element = 0;
};

/// Registers and local memory of one CUDA entry point, as NVRTC's ptxas reports them.
struct KernelFunction {
  std::string name;  ///< e.g. "fusedopt_step"
  int registers = 0;
  int stack_bytes = 0;
  int spill_store_bytes = 0;
  int spill_load_bytes = 0;
};

/// What a rule compiles to for a target and binding, and what it costs, without a GPU.
struct KernelReport {
  ReductionStrategy strategy = ReductionStrategy::Recompute;  ///< the one chosen
  std::vector<KernelPass> passes;                             ///< reduction passes, then the update
  double bytes_per_element = 0;                               ///< per step: the sum over the passes
  std::vector<KernelFunction> functions;  ///< CUDA targets only (needs NVRTC); host: empty
};

/// Plans and, for a CUDA target, compiles `rule` once more with ptxas's report (not
/// cached). Throws CompileError, or UnavailableError without NVRTC.
FUSEDOPT_API KernelReport report_kernel(const Rule& rule, const Target& target,
                                        const DTypeBinding& dtypes = {},
                                        ReductionStrategy strategy = ReductionStrategy::Auto);

/// Generates, then compiles or fetches from the process-wide cache (FUSEDOPT_CACHE_DIR,
/// FUSEDOPT_CACHE). Compiling for sm_XX needs NVRTC but no GPU. Throws CompileError.
FUSEDOPT_API CompiledKernel compile_kernel(const Rule& rule, const Target& target,
                                           const DTypeBinding& dtypes = {},
                                           const CompileOptions& options = {});
/// The same for a trusted functor.
FUSEDOPT_API CompiledKernel compile_trusted_functor(const TrustedFunctor& functor,
                                                    const Target& target,
                                                    const DTypeBinding& dtypes = {},
                                                    const CompileOptions& options = {});

}  // namespace fusedopt
