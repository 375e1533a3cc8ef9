// detail::block_layout, the one classification of a reduce_scatter's or an all_gather's
// buffers that Communicator's check and plain MPI's refusal share: apart, this rank's own
// block, or overlapping, at every edge (touching either end, one element off the own block,
// the first and the last rank), for each element size (fp32, fp16, fp64), and counts whose
// bytes would wrap around 64 bits.
#include <doctest/doctest.h>

#include <cstdint>

#include "comm/backend.hpp"

TEST_SUITE_BEGIN("comm");

namespace fusedopt::testing {
namespace {

using fusedopt::DType;
using fusedopt::comm::detail::block_layout;
using fusedopt::comm::detail::BlockLayout;
using fusedopt::comm::detail::Collective;

/// A collective of `count` elements whose one-block buffer starts `small` bytes and whose
/// buffer of all blocks starts `big` bytes into an address space (never dereferenced).
Collective at(Collective::Kind kind, std::uintptr_t small, std::uintptr_t big, std::int64_t count,
              DType dtype, bool f64 = false) {
  Collective c;
  c.kind = kind;
  const auto base = std::uintptr_t{1} << 20;
  void* s = reinterpret_cast<void*>(base + small);
  void* b = reinterpret_cast<void*>(base + big);
  c.send = kind == Collective::Kind::ReduceScatter ? b : s;  // reduce_scatter: send holds all
  c.recv = kind == Collective::Kind::ReduceScatter ? s : b;
  c.count = count;
  c.dtype = dtype;
  c.f64 = f64;
  return c;
}

TEST_CASE("block_layout: apart, this rank's own block, or an overlap") {
  for (const auto kind : {Collective::Kind::ReduceScatter, Collective::Kind::AllGather}) {
    for (const int size : {1, 2, 3, 4}) {
      for (const int rank : {0, size - 1}) {
        CAPTURE(size);
        CAPTURE(rank);
        // 10 fp32 elements a block: 40 bytes; the big buffer at 1000, size blocks long.
        const std::uintptr_t big = 1000, block = 40, end = big + block * size;
        auto layout = [&](std::uintptr_t small) {
          return block_layout(at(kind, small, big, 10, DType::F32), rank, size);
        };
        CHECK(layout(big - block) == BlockLayout::Apart);  // touching its start
        CHECK(layout(end) == BlockLayout::Apart);          // touching its end
        CHECK(layout(0) == BlockLayout::Apart);
        CHECK(layout(big + block * rank) == BlockLayout::OwnBlock);
        CHECK(layout(big - block + 4) == BlockLayout::Overlap);         // one element in
        CHECK(layout(end - 4) == BlockLayout::Overlap);                 // its last element
        CHECK(layout(big + block * rank + 4) == BlockLayout::Overlap);  // one off its block
        if (size > 1) {
          const int other = (rank + 1) % size;
          CHECK(layout(big + block * other) == BlockLayout::Overlap);  // another rank's block
        }
      }
    }
  }
  // The element size: fp16 blocks of 10 are 20 bytes, fp64 ones 80.
  CHECK(block_layout(at(Collective::Kind::AllGather, 1020, 1000, 10, DType::F16), 1, 2) ==
        BlockLayout::OwnBlock);
  CHECK(block_layout(at(Collective::Kind::AllGather, 1040, 1000, 10, DType::F16), 1, 2) ==
        BlockLayout::Apart);
  CHECK(block_layout(at(Collective::Kind::AllGather, 1080, 1000, 10, DType::F32, true), 1, 2) ==
        BlockLayout::OwnBlock);
  CHECK(block_layout(at(Collective::Kind::AllGather, 1040, 1000, 10, DType::F32, true), 1, 2) ==
        BlockLayout::Overlap);
  // A count near 2^62 elements: its bytes do not wrap around into "apart".
  const std::int64_t huge = std::int64_t{1} << 62;
  CHECK(block_layout(at(Collective::Kind::ReduceScatter, 2000, 1000, huge, DType::F32), 0, 4) ==
        BlockLayout::Overlap);
  CHECK(block_layout(at(Collective::Kind::AllGather, 0, 1000, huge, DType::F32), 1, 2) ==
        BlockLayout::Overlap);
}

}  // namespace
}  // namespace fusedopt::testing

TEST_SUITE_END();
