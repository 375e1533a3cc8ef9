// The floor the host step benchmarks and the demo divide by: an in-place stream that reads
// and writes exactly the bytes a step moves (OptimizerStats::traffic: per pass, the roles it
// only reads, the ones it updates in place, the ones it only writes, at their sizes), over
// buffers of the same sizes, with OpenMP's default team as the step's kernels use. It does
// the step's memory traffic with trivial arithmetic, so no step can beat it: a figure above
// 100% of it means the floor is wrong. (A memcpy of the same bytes, the old floor, is no
// floor: it pays for its destination's write-allocate reads, which an in-place update does
// not, and a fused AdamW ran at 153% of it.)
#pragma once

#ifndef _OPENMP
#error "bench/floor.hpp needs OpenMP (the floor runs on the step's thread team)"
#endif

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "fusedopt/optimizer.hpp"

namespace fusedopt::bench {

class InPlaceFloor {
 public:
  /// Buffers for `traffic` (a stats().traffic), shared by its passes (each uses the first
  /// slots of each kind, as large as the largest pass needs), touched once.
  explicit InPlaceFloor(std::vector<PassTraffic> traffic) : traffic_(std::move(traffic)) {
    std::vector<std::size_t> words[3];
    for (const PassTraffic& p : traffic_) {
      const std::vector<int>* kinds[3] = {&p.read_bits, &p.update_bits, &p.write_bits};
      for (int k = 0; k < 3; ++k) {
        if (words[k].size() < kinds[k]->size()) words[k].resize(kinds[k]->size(), 0);
        for (std::size_t r = 0; r < kinds[k]->size(); ++r) {
          words[k][r] = std::max(words[k][r], words_of(p.elements, (*kinds[k])[r]));
        }
      }
      for (int k = 0; k < 3; ++k) {
        for (int b : *kinds[k]) bytes_ += p.elements * b / 8 * (k == 1 ? 2 : 1);
      }
    }
    for (int k = 0; k < 3; ++k) {
      for (std::size_t n : words[k]) slots_[k].emplace_back(n, 1u);
    }
  }

  /// Bytes one run moves (read + written): the step's bytes_per_step.
  std::int64_t bytes() const { return bytes_; }

  /// Seconds of one run of every pass.
  double seconds() {
    const auto t0 = std::chrono::steady_clock::now();
    for (const PassTraffic& p : traffic_) run(p);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  /// The best of `runs` runs.
  double best_seconds(int runs) {
    double best = 1e30;
    for (int r = 0; r < runs; ++r) best = std::min(best, seconds());
    return best;
  }

 private:
  static constexpr std::int64_t kBlock = 4096;  // elements per OpenMP work item
  static constexpr std::int64_t kSub = 256;     // elements of each role in turn

  static std::size_t words_of(std::int64_t elements, int bits) {
    return static_cast<std::size_t>((elements * bits + 31) / 32);
  }

  /// One pass: block by block, each read role folded into a value that is kept, each
  /// updated role incremented in place, each written role set.
  void run(const PassTraffic& p) {
    const std::int64_t blocks = (p.elements + kBlock - 1) / kBlock;
    std::uint32_t sink = 0;
#pragma omp parallel for schedule(static) reduction(^ : sink)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t b0 = b * kBlock, b1 = std::min(p.elements, b0 + kBlock);
      std::uint32_t acc = 0;
      // Every role a sub-block at a time, as a kernel interleaves them (a role after another
      // over the whole block ran some steps' patterns slower than their kernels).
      for (std::int64_t e0 = b0; e0 < b1; e0 += kSub) {
        const std::int64_t e1 = std::min(b1, e0 + kSub);
        for (std::size_t r = 0; r < p.read_bits.size(); ++r) {
          const std::uint32_t* w = slots_[0][r].data();
          const std::int64_t w0 = e0 * p.read_bits[r] / 32, w1 = (e1 * p.read_bits[r] + 31) / 32;
#pragma omp simd reduction(^ : acc)
          for (std::int64_t j = w0; j < w1; ++j) acc ^= w[j];
        }
        for (std::size_t r = 0; r < p.update_bits.size(); ++r) {
          std::uint32_t* w = slots_[1][r].data();
          const std::int64_t w0 = e0 * p.update_bits[r] / 32,
                             w1 = (e1 * p.update_bits[r] + 31) / 32;
#pragma omp simd
          for (std::int64_t j = w0; j < w1; ++j) w[j] += 1u;
        }
        for (std::size_t r = 0; r < p.write_bits.size(); ++r) {
          std::uint32_t* w = slots_[2][r].data();
          const std::int64_t w0 = e0 * p.write_bits[r] / 32, w1 = (e1 * p.write_bits[r] + 31) / 32;
#pragma omp simd
          for (std::int64_t j = w0; j < w1; ++j) w[j] = static_cast<std::uint32_t>(j);
        }
      }
      sink ^= acc;
    }
    sink_ ^= sink;
  }

  std::vector<PassTraffic> traffic_;
  std::vector<std::vector<std::uint32_t>> slots_[3];  // read, updated, written
  std::int64_t bytes_ = 0;
  std::uint32_t sink_ = 0;  // what the reads folded into: kept, so they are not elided

 public:
  /// What the reads folded into (callers may ignore it).
  std::uint32_t sink() const { return sink_; }
};

}  // namespace fusedopt::bench
