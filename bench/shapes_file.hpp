// A user's workload for fusedopt-bench (--workload FILE.json): the tensors of a model, each
// with its name, shape and dtype, read from a small JSON file:
//   {"name": "my-model", "tensors": [{"name": "wte", "shape": [50257, 768], "dtype": "bf16"},
//                                    {"name": "ln_f.bias", "shape": [768]}]}
// (a bare array of tensors is read as well; dtype defaults to fp32).
#pragma once

#include <string>

#include "workloads.hpp"

namespace fusedopt::bench {

/// The workload in `path`. Throws std::runtime_error naming the file, the line and the
/// column of what is wrong (malformed JSON, a missing shape, a bad dtype or dimension).
Workload read_shapes_file(const std::string& path);

}  // namespace fusedopt::bench
