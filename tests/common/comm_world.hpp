// What the comm tests share: the job's communicator (MPI_COMM_WORLD, made once) and fresh
// random seeds every rank agrees on (drawn by rank 0, broadcast).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "fusedopt/comm.hpp"
#include "fusedopt/optimizer.hpp"

namespace fusedopt::testing {

/// The job's communicator, with a short test deadline (20 s).
fusedopt::comm::Communicator& world();
/// A fresh seed, the same on every rank.
std::uint32_t shared_seed();

/// A FlatArena of fp32 tensors "w0", "w1", ... of these sizes (params and grads zeroed).
fusedopt::FlatArena make_arena(const std::vector<std::int64_t>& sizes);
/// make_arena's, with its params and grads in shared buffers of `comm` (allocate_shared:
/// collective, every rank in the same order).
fusedopt::FlatArena make_shared_arena(fusedopt::comm::Communicator& comm,
                                      const std::vector<std::int64_t>& sizes);
/// One ParamGroup of every param and grad of `a`, in order.
std::vector<fusedopt::ParamGroup> group_of(fusedopt::FlatArena& a);
inline float* data(const fusedopt::Tensor& t) { return static_cast<float*>(t.data); }
/// memcmp(a, b, n) == 0, and true for n == 0 (an empty tensor's data may be null, which
/// memcmp must not be given).
inline bool same_bytes(const void* a, const void* b, std::size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}
/// Whether collectives over a shared buffer run in place on `comm` (one node of several
/// ranks, not hierarchical): from its transport line.
bool runs_in_place(const fusedopt::comm::Communicator& comm);
/// The number in "N collective(s) in place so far" of `comm`'s transport line, or 0.
long in_place_so_far(const fusedopt::comm::Communicator& comm);
/// The stalled-rank check the comm tests share: rank 1 sleeps 1.5 s, well past the others'
/// deadline, then starts the call and waits for it (so the job ends cleanly) and gets nothing
/// back; every other rank starts it at once, and waiting 0.3 s must get a CommError saying "not
/// complete after 0.3 s" between 0.3 and 1.4 s after the start (before rank 1 wakes), the
/// communicator broken after; its error comes back for the caller's own checks. The call is then
/// abandoned: the buffers `start` uses must outlive `comm`, which rank 1's joining writes into.
std::optional<fusedopt::comm::CommError> expect_stalled_rank_error(
    fusedopt::comm::Communicator& comm, const std::function<fusedopt::comm::Work()>& start);
/// Rank r's gradient of element k of tensor i at step `step`, in [-0.1, 0.1): any rank can
/// compute every rank's, for float64 references.
float grad_value(std::uint32_t seed, int r, int step, std::size_t i, std::int64_t k);
/// Every grad of `a` (fp32) set to rank `rank`'s grad_value at `step`.
void fill_grads(fusedopt::FlatArena& a, std::uint32_t seed, int rank, int step);
/// Every param of `a` (fp32) drawn from normal(0, 1) with `seed`: the same on every rank.
void fill_params(fusedopt::FlatArena& a, std::uint32_t seed);
/// Every param of `a` (fp32), one after the other.
std::vector<float> params_of(fusedopt::FlatArena& a);

}  // namespace fusedopt::testing
