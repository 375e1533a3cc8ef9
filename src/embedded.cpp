// Lookup over the table that cmake/EmbedScript.cmake generates.
#include "embedded.hpp"

#include <algorithm>

#include "fusedopt/error.hpp"

namespace fusedopt {

std::string_view embedded_file(std::string_view path) {
  std::size_t n = 0;
  const EmbeddedFile* files = embedded_files(&n);
  for (std::size_t i = 0; i < n; ++i) {
    if (path == files[i].path) return {files[i].data, files[i].size};
  }
  throw InternalError("no embedded file '" + std::string(path) + "'");
}

std::vector<std::string> embedded_paths(std::string_view folder) {
  std::size_t n = 0;
  const EmbeddedFile* files = embedded_files(&n);
  std::vector<std::string> out;
  for (std::size_t i = 0; i < n; ++i) {
    std::string_view p = files[i].path;
    if (p.substr(0, folder.size()) == folder) out.emplace_back(p);
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace fusedopt
