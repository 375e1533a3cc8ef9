// What the comm cases need beyond NVRTC and a device (common/requirements.hpp): MPI for a
// bootstrap (an MPI singleton: one rank, no mpiexec), several ranks, and collectives that run
// in place over shared buffers. Decided when the cases are registered, without initialising MPI.
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

/// The world size mpiexec gives its ranks in their environment (Open MPI, PMIx, MPICH and
/// Intel MPI name it), or 1 without mpiexec.
inline int launched_world_size() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_SIZE", "PMI_SIZE"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && std::atoi(v) > 0) return std::atoi(v);
  }
  return 1;
}

inline const Availability& several_ranks_availability() {
  static const Availability a = [] {
    Availability out;
    if (launched_world_size() < 2) {
      out.present = false;
      out.why = "the case is about ranks that differ or stall, and this job has one rank";
    }
    return out;
  }();
  return a;
}

/// Decorator for a case that needs two ranks or more (judged from the job's environment; the
/// case requires Communicator::size() to agree).
inline Requires needs_several_ranks() { return Requires(several_ranks_availability()); }

inline const Availability& in_place_availability() {
  static const Availability a = [] {
    Availability out;
    auto set = [](const char* name) {
      const char* v = std::getenv(name);
      return v != nullptr && *v != '\0';
    };
    const char* shm = std::getenv("FUSEDOPT_COMM_SHM");
    if (launched_world_size() < 2) {
      out.why = "collectives run in place between ranks, and this job has one";
    } else if (shm != nullptr && std::string(shm) == "0") {
      out.why = "collectives run in place on shared memory, which FUSEDOPT_COMM_SHM=0 turns off";
    } else if (set("FUSEDOPT_COMM_RANKS_PER_NODE")) {
      out.why = "collectives do not run in place across (pretend) nodes: " +
                std::string("FUSEDOPT_COMM_RANKS_PER_NODE is set");
    }
    out.present = out.why.empty();
    return out;
  }();
  return a;
}

/// Decorator for a case about collectives in place over shared buffers (several ranks on one
/// node, shared memory on, not hierarchical), judged from the job's environment. The case
/// itself requires Communicator::transport() to agree: a wrong judgement fails, never skips.
inline Requires needs_in_place_collectives() { return Requires(in_place_availability()); }

}  // namespace fusedopt::testing
