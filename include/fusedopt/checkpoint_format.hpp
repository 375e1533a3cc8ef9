// The checkpoint format, in one place: the metadata keys and format numbers that
// Optimizer::save writes and load reads, the params table ("name<TAB>numel<TAB>dtype" per
// parameter) that the sharded checkpoints and fusedopt-ckpt cut files by, tensor names
// ("<param>/<state>"; a state's safetensors dtype is fusedopt::safetensors_name of its
// DType). Part of the extension API
// (fusedopt/extension.hpp): the core (Optimizer::save, load) and the comm module (its sharded
// checkpoints), which are separate libraries, read and write the same format with the same
// code, and a tool may read a checkpoint with it. A malformed field is an IoError: the file
// was damaged or written by something else.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/error.hpp"
#include "fusedopt/export.hpp"

namespace fusedopt::checkpoint {

/// The layout of the metadata and tensor names. Bump when a key, a name pattern or a value's
/// format changes. 2: the file's checksum (io::kChecksumKey, over the whole file) is required.
/// 1 (before 2026-11-26): the same layout; a checksum of the data section when present.
inline constexpr int kFormat = 2;
inline constexpr int kOldestFormat = 1;

inline constexpr const char* kFormatKey = "fusedopt_checkpoint_format";
inline constexpr const char* kVersionKey = "fusedopt_version";
inline constexpr const char* kRuleKey = "rule";
inline constexpr const char* kRuleTextKey = "rule_text";
inline constexpr const char* kKernelKeysKey = "kernel_keys";
inline constexpr const char* kStepKey = "step";
inline constexpr const char* kHypersKey = "hypers";
inline constexpr const char* kStateDtypeKey = "state_dtype";
inline constexpr const char* kMasterWeightsKey = "master_weights";
/// The params table: what a tool needs to cut the file into shards; load() does not read it.
inline constexpr const char* kParamsKey = "params";
/// Only where some state is block-quantized: each rule state's storage ("m=q8s,v=q8u", "-"
/// for one kept in state_dtype) and the elements per absmax block ("256"). load() refuses a
/// file whose storage differs; the sharded checkpoints and fusedopt-ckpt cut by the block.
/// Files written before 2026-11-27 lack them (their tensors' dtypes and shapes still tell).
inline constexpr const char* kStateStorageKey = "state_storage";
inline constexpr const char* kQuantBlockKey = "quant_block";

/// The tensor of state `state` of parameter `param`: "<param>/<state>" (a state name holds
/// no '/').
inline std::string tensor_name(const std::string& param, const std::string& state) {
  return param + "/" + state;
}

/// The lines of `text` (each ended by '\n'; a last line without one counts too).
inline std::vector<std::string> lines(const std::string& text) {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (begin < text.size()) {
    const std::size_t end = text.find('\n', begin);
    out.push_back(text.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) break;
    begin = end + 1;
  }
  return out;
}

/// `line` split at `sep`.
inline std::vector<std::string> fields(const std::string& line, char sep = '\t') {
  std::vector<std::string> out;
  std::size_t begin = 0;
  while (true) {
    const std::size_t end = line.find(sep, begin);
    out.push_back(line.substr(begin, end == std::string::npos ? std::string::npos : end - begin));
    if (end == std::string::npos) return out;
    begin = end + 1;
  }
}

/// How a load refuses, its message starting with `prefix` ("cannot load checkpoint PATH"):
/// a file that does not fit the optimizer is a UsageError; a malformed one (damaged, or
/// written by something else) an IoError.
struct Refusal {
  std::string prefix;
  [[noreturn]] void misfit(const std::string& what) const {
    throw UsageError(prefix + ": " + what);
  }
  [[noreturn]] void malformed(const std::string& what) const {
    throw IoError(prefix + ": " + what);
  }
};

/// One row of the params table.
struct ParamEntry {
  std::string name;
  std::int64_t numel = 0;
  DType dtype = DType::F32;
};

/// The params table of `params`: a line "name<TAB>numel<TAB>dtype" each.
FUSEDOPT_API std::string format_params(const std::vector<ParamEntry>& params);

/// The params table `text`; IoError naming `where` and the bad line.
FUSEDOPT_API std::vector<ParamEntry> parse_params(const std::string& text,
                                                  const std::string& where);

}  // namespace fusedopt::checkpoint
