// What the comm tests share: the job's communicator (MPI_COMM_WORLD, made once) and fresh
// random seeds every rank agrees on (drawn by rank 0, broadcast).
#pragma once

#include <cstdint>

#include "fusedopt/comm.hpp"

namespace fusedopt_tests {

/// The job's communicator, with a short test deadline (20 s).
fusedopt::comm::Communicator& world();
/// A fresh seed, the same on every rank.
std::uint32_t shared_seed();

}  // namespace fusedopt_tests
