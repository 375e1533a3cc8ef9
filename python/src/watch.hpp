// fusedopt._fusedopt._Watch: what a fusedopt.torch.Optimizer's params and grads were at the
// end of its last step, so that a steady step proves nothing moved in one call over the
// param groups (the objects, and the addresses of their memory) instead of per-tensor Python.
#pragma once

#include <nanobind/nanobind.h>

namespace fusedopt::python {

/// Adds _Watch to the module.
void bind_watch(nanobind::module_& m);

}  // namespace fusedopt::python
