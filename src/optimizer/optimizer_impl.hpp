// The Optimizer's private state: a façade over its pieces, each with its own job and file
// pair: the params (params.hpp), the state store (state_store.hpp), the hypers
// (hypers.hpp), the step runner (step_runner.hpp); checkpoints (checkpoint.cpp) and the
// reports (optimizer_report.cpp) read them. Construction is optimizer_build.cpp.
#pragma once

#include <fmt/format.h>

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "device/backend.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/extension.hpp"
#include "fusedopt/optimizer.hpp"
#include "io/safetensors.hpp"
#include "optimizer/hypers.hpp"
#include "optimizer/state_store.hpp"
#include "optimizer/step_runner.hpp"

namespace fusedopt {

namespace runtime {

/// What the optimizer tells about itself (stats(), FUSEDOPT_LOG=info): what fusing bought,
/// and what each pass of each binding reads and writes.
struct Reports {
  std::string fusion;
  std::string schedule;
};

/// The reports of an optimizer built of these pieces (optimizer_report.cpp); logs them.
Reports make_reports(const Rule& rule, const StateStore& store, const StepRunner& runner,
                     const Backend& backend);

}  // namespace runtime

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

  Rule rule;  ///< the rule, its clipping applied
  OptimizerOptions options;
  Device device;
  /// The device: memory and kernels. Declared before the pieces that hold its memory so it
  /// outlives them; shared with the device GradScalers made for this optimizer.
  std::shared_ptr<runtime::Backend> backend;
  runtime::StateStore store;
  runtime::Hypers hypers;
  /// Declared after the store: destroyed first (its kernels' launches use the states).
  runtime::StepRunner runner;
  runtime::Reports reports;

  explicit Impl(const Rule& r) : rule(r) {}
  /// Everything Optimizer's constructor does: checks, arenas, kernels (origins: see
  /// OptimizerExtension::make; empty: whole params).
  static std::unique_ptr<Impl> build(const Rule& rule, std::vector<ParamGroup> groups,
                                     const OptimizerOptions& options,
                                     std::vector<PieceOrigin> origins);

  /// Loads a checkpoint read into memory (Optimizer::load's checks and copies; `where`
  /// names it in errors; checkpoint.cpp).
  /// Checks `file` against this optimizer and loads it, or (check_only) only checks it.
  void load_file(const io::SafetensorsFile& file, const std::string& where,
                 bool check_only = false);
};

}  // namespace fusedopt
