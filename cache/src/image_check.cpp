// The shapes of loadable binaries (image_check.hpp).
#include "cache/image_check.hpp"

#include <fmt/format.h>

#include <cstdint>
#include <cstring>

namespace fusedopt::cache {

namespace {

constexpr std::size_t kElfHeaderBytes = 64;  // ELF64
constexpr std::uint16_t kElfSharedObject = 3;
constexpr std::uint16_t kElfMachineCuda = 190;
/// The emulator's image: magic (8), ABI version (u32), reserved (u32), object size (u64).
constexpr std::size_t kEmuHeaderBytes = 24;

template <typename T>
T little_endian(std::string_view bytes, std::size_t at) {
  T v = 0;
  for (std::size_t i = 0; i < sizeof(T); ++i) {
    v |= static_cast<T>(static_cast<T>(static_cast<unsigned char>(bytes[at + i])) << (8 * i));
  }
  return v;
}

/// The first bytes of a file that is not what it should be, for the message.
std::string opening(std::string_view bytes) {
  std::string out;
  for (std::size_t i = 0; i < bytes.size() && i < 8; ++i) {
    const auto c = static_cast<unsigned char>(bytes[i]);
    out +=
        c >= 0x20 && c < 0x7f ? std::string(1, static_cast<char>(c)) : fmt::format("\\x{:02x}", c);
  }
  return out;
}

/// Why `bytes` is not a whole 64-bit little-endian ELF file ("" when it is): the header, then
/// the program and section header tables within the file.
std::string elf_problem(std::string_view bytes) {
  if (bytes.size() < 4 || std::memcmp(bytes.data(),
                                      "\x7f"
                                      "ELF",
                                      4) != 0) {
    return bytes.empty() ? "not an ELF file: it is empty"
                         : fmt::format("not an ELF file: {} bytes beginning '{}'", bytes.size(),
                                       opening(bytes));
  }
  if (bytes.size() < kElfHeaderBytes) {
    return fmt::format("a truncated ELF file: {} bytes, less than its header", bytes.size());
  }
  if (bytes[4] != 2 || bytes[5] != 1) return "not a 64-bit little-endian ELF file";
  // Each header table (program headers, section headers: where their offset, entry size and
  // count are) inside the file, without overflow whatever the header says.
  struct Table {
    std::size_t offset, entry_size, count;
  };
  for (const Table& t : {Table{32, 54, 56}, Table{40, 58, 60}}) {
    const auto start = little_endian<std::uint64_t>(bytes, t.offset);
    const std::uint64_t size =
        static_cast<std::uint64_t>(little_endian<std::uint16_t>(bytes, t.entry_size)) *
        little_endian<std::uint16_t>(bytes, t.count);
    if (size != 0 && (start > bytes.size() || bytes.size() - start < size)) {
      return fmt::format("a truncated ELF file: {} bytes, its header tables end at byte {}",
                         bytes.size(), start > ~size ? start : start + size);
    }
  }
  return "";
}

std::string shared_object_problem(std::string_view bytes) {
  std::string why = elf_problem(bytes);
  if (why.empty() && little_endian<std::uint16_t>(bytes, 16) != kElfSharedObject) {
    why = fmt::format("an ELF file of type {}, not a shared object",
                      little_endian<std::uint16_t>(bytes, 16));
  }
  return why;
}

}  // namespace

std::string image_problem(std::string_view ext, std::string_view payload) {
  if (ext == "so") return shared_object_problem(payload);
  if (ext == "emu") {
    if (payload.size() < kEmuHeaderBytes ||
        little_endian<std::uint64_t>(payload, 16) != payload.size() - kEmuHeaderBytes) {
      return fmt::format("not a CUDA emulator image: {} bytes beginning '{}'", payload.size(),
                         opening(payload));
    }
    const std::string why = shared_object_problem(payload.substr(kEmuHeaderBytes));
    return why.empty() ? "" : "a CUDA emulator image around " + why;
  }
  if (ext == "cubin") {
    std::string why = elf_problem(payload);
    if (why.empty() && little_endian<std::uint16_t>(payload, 18) != kElfMachineCuda) {
      why = fmt::format("an ELF file for machine {}, not a CUBIN (EM_CUDA, {})",
                        little_endian<std::uint16_t>(payload, 18), kElfMachineCuda);
    }
    return why;
  }
  if (ext == "ptx" && payload.find(".target") == std::string_view::npos) {
    return fmt::format("not PTX: {} bytes beginning '{}', without a .target directive",
                       payload.size(), opening(payload));
  }
  return "";
}

}  // namespace fusedopt::cache
