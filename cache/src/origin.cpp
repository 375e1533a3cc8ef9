// Names of the cache origins (see origin.hpp).
#include "cache/origin.hpp"

namespace fusedopt::cache {

const char* to_string(Origin origin) {
  switch (origin) {
    case Origin::Memory:
      return "memory";
    case Origin::Disk:
      return "disk";
    case Origin::Compiled:
      return "compiled";
  }
  return "unknown";
}

}  // namespace fusedopt::cache
