// Checkpoint files in the safetensors format, for programs and libraries that assemble or
// split checkpoints: read a tensor, or a byte range of one, without loading the whole file,
// and write a file atomically. Optimizer::save and the sharded checkpoints write with this
// very writer.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "fusedopt/dtype.hpp"
#include "fusedopt/export.hpp"

namespace fusedopt {

/// An open safetensors file: its header is read and validated at construction (entries,
/// shapes, offsets tiling the data section); tensors are read on demand with pread. Range
/// reads do not check the whole-file checksum fusedopt writes (verify() does, reading
/// everything). Throws IoError naming the file and the defect.
class FUSEDOPT_API SafetensorsReader {
 public:
  struct Entry {
    std::string dtype;  ///< safetensors dtype name: "F32", "BF16", "F16", ...
    std::vector<std::int64_t> shape;
    std::uint64_t bytes = 0;
  };

  explicit SafetensorsReader(const std::filesystem::path& path);
  ~SafetensorsReader();
  SafetensorsReader(SafetensorsReader&&) noexcept;
  SafetensorsReader& operator=(SafetensorsReader&&) noexcept;

  const std::filesystem::path& path() const;
  /// The metadata as written (without fusedopt's checksum entry).
  const std::map<std::string, std::string>& metadata() const;
  std::vector<std::string> names() const;
  bool has(const std::string& name) const;
  /// IoError when the file has no tensor `name`.
  Entry entry(const std::string& name) const;
  /// Bytes [begin, begin + bytes) of tensor `name` into `out`; IoError when the range is
  /// not inside the tensor or the read fails.
  void read(const std::string& name, std::uint64_t begin, std::uint64_t bytes, void* out) const;
  /// Reads the whole file and checks it against the checksum fusedopt wrote (true), false
  /// when the file has none; IoError when it does not match.
  bool verify() const;
  /// The checksum fusedopt recorded in the header (16 hex digits, covering the whole file),
  /// as recorded: verify() checks it; "" when the file has none.
  const std::string& checksum() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// One tensor to write: `numel` elements of `dtype` at `data` (borrowed for the call).
struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::F32;
  std::int64_t numel = 0;
  const void* data = nullptr;
};

/// Writes `tensors` (1-D) and `metadata` atomically (a temp file, fsync, rename: never a
/// half-written file at `path`), with fusedopt's checksum of the data section.
FUSEDOPT_API void write_safetensors(const std::filesystem::path& path,
                                    const std::vector<SafetensorsTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata);

/// write_safetensors with tensor i's bytes produced by `source(i, out)` one tensor at a time
/// (the tensors' `data` is ignored): at most one tensor is held in memory, for checkpoints
/// bigger than memory. An exception from `source` leaves nothing at `path`.
FUSEDOPT_API void write_safetensors(const std::filesystem::path& path,
                                    const std::vector<SafetensorsTensor>& tensors,
                                    const std::map<std::string, std::string>& metadata,
                                    const std::function<void(std::size_t, void*)>& source);

}  // namespace fusedopt
