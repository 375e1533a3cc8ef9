// Optimizer::save / load (pending the io module).
#include "fusedopt/error.hpp"
#include "runtime/optimizer_impl.hpp"

namespace fusedopt {
void Optimizer::save(const std::filesystem::path&) const { throw Error("save: not yet"); }
void Optimizer::load(const std::filesystem::path&) { throw Error("load: not yet"); }
}  // namespace fusedopt
