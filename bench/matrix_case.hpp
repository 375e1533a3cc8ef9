// A step of a rule with a matrix stage (orthogonalize: the muon preset's Newton-Schulz
// iteration) on the host, timed beside its GEMM floor (gemm_floor.hpp) rather than a
// memory floor: the iteration's GEMMs, not its bytes, bound such a step.
#pragma once

#include <benchmark/benchmark.h>

#include <string>

#include "fusedopt/kernel.hpp"
#include "fusedopt/optimizer.hpp"
#include "workloads.hpp"

namespace fusedopt::bench {

/// Whether `rule` calls orthogonalize() (its text, comments left out).
bool has_matrix_stage(const Rule& rule);

/// The step of `rule` over `w` (one optimizer, every tensor; each must be a matrix) under
/// `state`, the GEMM floor run (untimed) before each step; the counters floor_fraction (the
/// median of GEMM floor / step), gemm_floor_ms, the GFLOP/s of the step and of the floor,
/// the BLAS's threads, and the element-wise part alone (the same rule with each
/// orthogonalize(x, ...) replaced by x: elementwise_ms, and iteration_floor_fraction, the
/// floor over the step less that part); a results() line for each.
void run_matrix_case(benchmark::State& state, const Workload& w, const Rule& rule,
                     const OptimizerOptions& options, const std::string& case_name,
                     const std::string& what);

}  // namespace fusedopt::bench
