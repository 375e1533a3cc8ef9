#include "comm/comm_support.hpp"

#include <random>
#include <vector>

namespace fusedopt_tests {

fusedopt::comm::Communicator& world() {
  static fusedopt::comm::Communicator comm = [] {
    fusedopt::comm::Communicator c = fusedopt::comm::Communicator::mpi();
    c.set_timeout(std::chrono::seconds(20));
    return c;
  }();
  return comm;
}

std::uint32_t shared_seed() {
  // 24 bits travel exactly in one fp32.
  float seed = static_cast<float>(std::random_device{}() & 0xffffffu);
  world().broadcast(&seed, 1, fusedopt::DType::F32, 0).wait();
  return static_cast<std::uint32_t>(seed);
}

}  // namespace fusedopt_tests
