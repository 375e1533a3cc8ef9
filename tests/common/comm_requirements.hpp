// What the single-process comm cases need beyond NVRTC and a device (support/
// requirements.hpp): MPI for a bootstrap (an MPI singleton: one rank, no mpiexec).
// Decided when the cases are registered, without initialising MPI.
#pragma once

#include <cstdlib>
#include <string>

#include "common/skip.hpp"
#include "fusedopt/comm.hpp"

namespace fusedopt::testing {

inline const Availability& mpi_availability() {
  static const Availability a = [] {
    Availability out;
    std::string why;
    if (!comm::Communicator::available("mpi", &why)) {
      out.present = false;
      out.why = "no MPI for the bootstrap: " + why;
    }
    return out;
  }();
  return a;
}

/// Decorator for a case that bootstraps over an MPI singleton.
inline Requires needs_mpi() { return Requires(mpi_availability()); }

}  // namespace fusedopt::testing
