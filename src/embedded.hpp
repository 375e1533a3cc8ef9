// Files from templates/ (kernel skeletons, preset rules) embedded in the library at build
// time, looked up by their path relative to templates/ (e.g. "rules/adamw.rule").
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace fusedopt {

struct EmbeddedFile {
  const char* path;
  const char* data;
  std::size_t size;
};

/// The whole table (defined in the generated embedded.cpp).
const EmbeddedFile* embedded_files(std::size_t* count);

/// The contents of `path`; throws InternalError if it was not embedded.
std::string_view embedded_file(std::string_view path);

/// Paths under `folder` (e.g. "rules/"), sorted.
std::vector<std::string> embedded_paths(std::string_view folder);

}  // namespace fusedopt
