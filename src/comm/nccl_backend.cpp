// The NCCL transport (device memory): not written yet.
#include "comm/backend.hpp"

namespace fusedopt::comm::detail {

namespace {
constexpr const char* kNoNccl = "the NCCL communicator is not implemented yet";
}

bool nccl_available(std::string* why) {
  if (why) *why = kNoNccl;
  return false;
}
std::shared_ptr<Backend> make_nccl(int, Backend&) { throw UnavailableError(kNoNccl); }
std::shared_ptr<Backend> wrap_nccl(void*, int) { throw UnavailableError(kNoNccl); }

}  // namespace fusedopt::comm::detail
