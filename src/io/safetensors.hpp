// Reading and writing checkpoints in the safetensors format (an 8-byte little-endian header
// length, a JSON header, then the raw tensor bytes), so that optimizer state can be exchanged
// with PyTorch, JAX and numpy tooling.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "fusedopt/dtype.hpp"

namespace fusedopt::io {

/// The metadata entry holding the XXH3-64 (16 hex digits) of the whole file as written with
/// this entry's value as 16 '0's: the length field, the header (every metadata entry, every
/// tensor's name, dtype, shape and offsets, the padding) and the data section, so that any
/// changed byte is refused. write_safetensors() always adds it; read_safetensors() checks it
/// when present (files from other writers have none, and load unchecked, as safetensors
/// itself has no checksum).
inline constexpr const char* kChecksumKey = "fusedopt_xxh3_64";

/// The entry of files written before 2026-11-26: the XXH3-64 of the data section alone.
/// Still checked when present; never written, and reserved like kChecksumKey.
inline constexpr const char* kDataChecksumKey = "fusedopt_data_xxh3_64";

/// One tensor to write: its bytes are borrowed, not copied, and must stay alive for the call.
struct TensorView {
  std::string name;
  std::string dtype;  ///< safetensors dtype name: "F32", "F16", "BF16", "I64", ...
  std::vector<std::int64_t> shape;
  const void* data;
  std::size_t bytes;
};

/// Writes atomically (temp file in the same folder, fsync, rename, fsync folder); tensors are
/// written in the order given; names must be unique and non-empty; bytes must equal
/// product(shape) * dtype size; at most 1 M tensors and a 100 MB header (what
/// read_safetensors() accepts); a stale temp file of a crashed writer in the folder is
/// removed, and an overwritten file keeps its permissions; adds kChecksumKey to the
/// metadata (which must hold neither it nor kDataChecksumKey); throws fusedopt::Error naming the
/// tensor and the problem; never leaves a half-written file at `path`.
void write_safetensors(const std::filesystem::path& path, const std::vector<TensorView>& tensors,
                       const std::map<std::string, std::string>& metadata);

/// Fills tensor `index`'s bytes (tensors[index].bytes of them) into `out`.
using TensorSource = std::function<void(std::size_t index, void* out)>;

/// write_safetensors with the data produced one tensor at a time by `source` (the views'
/// `data` is ignored): at most one tensor is held in memory. The same atomicity, checks and
/// checksum; an exception from `source` is an IoError and leaves nothing at `path`.
void write_safetensors_streamed(const std::filesystem::path& path,
                                const std::vector<TensorView>& tensors,
                                const std::map<std::string, std::string>& metadata,
                                const TensorSource& source);

/// A whole safetensors file read into memory and validated.
struct SafetensorsFile {
  struct Entry {
    std::string dtype;
    std::vector<std::int64_t> shape;
    std::uint64_t begin = 0, end = 0;  ///< byte range within `data`
  };
  std::map<std::string, std::string> metadata;  ///< as written (without the checksum entry)
  std::map<std::string, Entry> tensors;
  /// The file had kChecksumKey (or an older file kDataChecksumKey), and it matched.
  bool data_checked = false;
  /// The value of kChecksumKey as recorded (16 hex digits), "" when the file has none;
  /// read_safetensors_header() fills it without checking it.
  std::string checksum;
  std::string data;  ///< the whole data section
  /// Pointer to a tensor's bytes; throws fusedopt::Error if absent.
  const void* tensor_data(const std::string& name) const;
};

/// Reads and validates the whole file; any defect (too short, header length beyond the file
/// or above 100 MB, more than 1 M tensors or 64 dimensions, malformed JSON, unknown dtype,
/// shape/offset size mismatch, offsets out of bounds or overlapping or not covering the data
/// exactly, duplicate names, non-string metadata, a file that does not match its
/// kChecksumKey or kDataChecksumKey) throws fusedopt::Error("<path>: <what is wrong>").
SafetensorsFile read_safetensors(const std::filesystem::path& path);

/// The header of a file, validated as read_safetensors does it (entries, tiling of the
/// data section, which is not read: `data` stays empty, the checksum unchecked);
/// `*data_offset` is where the data section starts in the file, for reading ranges of it.
SafetensorsFile read_safetensors_header(const std::filesystem::path& path,
                                        std::uint64_t* data_offset);

/// Bytes per element of any safetensors dtype, the ones fusedopt does not store included (F32
/// 4, F16 2, BF16 2, F64 8, I64 8, I32 4, U8 1, ...: what a file from another writer may hold;
/// fusedopt's own DTypes are named by fusedopt::safetensors_name); 0 for an unknown name or a
/// sub-byte type.
int dtype_bytes(const std::string& st_dtype);

}  // namespace fusedopt::io
