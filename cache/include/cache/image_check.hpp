// What a stored binary must look like to be loadable, by its entry's extension: an ELF
// shared object ("so"), the CUDA emulator's image around one ("emu"), a CUBIN (ELF for
// EM_CUDA), PTX text. The kernel path checks each compile's output before the cache stores
// it, and each entry the cache loads (a compiler that exits 0 with anything else must not
// poison its key); `fusedopt-cache verify` flags an entry that fails. The shapes only: the
// cache still knows nothing of what the binaries do.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace fusedopt::cache {

/// Why `payload` cannot be a binary of kind `ext` ("" when it may be one, or when `ext` is
/// not one of the kinds above).
std::string image_problem(std::string_view ext, std::string_view payload);

/// A check of a payload stored under an extension: "" when it is fit to store and to load,
/// else why not (image_problem, or a caller's own).
using PayloadCheck = std::function<std::string(std::string_view ext, std::string_view payload)>;

}  // namespace fusedopt::cache
