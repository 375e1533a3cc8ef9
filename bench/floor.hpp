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
#include <array>
#include <chrono>
#include <cstdint>
#include <utility>
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
      for (std::vector<std::uint32_t>& slot : slots_[k]) ptrs_[k].push_back(slot.data());
      ptrs_[k].push_back(nullptr);  // never empty
    }
  }

  InPlaceFloor(const InPlaceFloor&) = delete;  // ptrs_ point into slots_
  InPlaceFloor& operator=(const InPlaceFloor&) = delete;

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
  static constexpr std::int64_t kGroup = 32;    // elements of every role in turn

  static std::size_t words_of(std::int64_t elements, int bits) {
    return static_cast<std::size_t>((elements * bits + 31) / 32);
  }

  /// One role's words of a group of kGroup elements (W words: a role of W bits per element).
  template <int W>
  static void read_group(const std::uint32_t* w, std::uint32_t& acc) {
    std::uint32_t a = 0;
#pragma omp simd reduction(^ : a)
    for (int j = 0; j < W; ++j) a ^= w[j];
    acc ^= a;
  }
  template <int W>
  static void update_group(std::uint32_t* w) {
#pragma omp simd
    for (int j = 0; j < W; ++j) w[j] += 1u;
  }
  template <int W>
  static void write_group(std::uint32_t* w, std::uint32_t v) {
#pragma omp simd
    for (int j = 0; j < W; ++j) w[j] = v + static_cast<std::uint32_t>(j);
  }

  /// Words [w0, w1) of one role: read (kind 0), updated (1) or written (2).
  static void words(int kind, std::uint32_t* w, std::int64_t w0, std::int64_t w1,
                    std::uint32_t& acc) {
    for (std::int64_t j = w0; j < w1; ++j) {
      if (kind == 0) acc ^= w[j];
      if (kind == 1) w[j] += 1u;
      if (kind == 2) w[j] = static_cast<std::uint32_t>(j);
    }
  }

  /// Group `g` (elements g * kGroup ...) of one role of `bits` bits: a role of b bits moves b
  /// words per group, fixed-size loops for the usual widths.
  static void group(int kind, int bits, std::uint32_t* base, std::int64_t g, std::uint32_t& acc) {
    std::uint32_t* w = base + g * bits;
#define FUSEDOPT_FLOOR_WIDTH(W)                                             \
  case W:                                                                   \
    if (kind == 0) read_group<W>(w, acc);                                   \
    if (kind == 1) update_group<W>(w);                                      \
    if (kind == 2) write_group<W>(w, static_cast<std::uint32_t>(g * bits)); \
    return;
    switch (bits) {
      FUSEDOPT_FLOOR_WIDTH(32)
      FUSEDOPT_FLOOR_WIDTH(16)
      FUSEDOPT_FLOOR_WIDTH(8)
      FUSEDOPT_FLOOR_WIDTH(4)
      default:
        words(kind, base, g * bits, (g + 1) * bits, acc);
    }
#undef FUSEDOPT_FLOOR_WIDTH
  }

  /// The most roles of each kind a pass of 32-bit roles streams in one fused loop.
  static constexpr int kMaxRead = 4, kMaxUpdate = 6, kMaxWrite = 3;

  /// Elements [e0, e1) of a pass whose roles are all 32 bits: one loop over the elements
  /// that reads, updates and writes every role, as a kernel's loop does (the group loop
  /// pays a dispatch per role and group, and a fused step beat it by up to 19% on a
  /// Zen 3 VM in its fast phases).
  template <int R, int U, int W>
  static void fused_block(std::uint32_t* const* rd, std::uint32_t* const* up,
                          std::uint32_t* const* wr, std::int64_t e0, std::int64_t e1,
                          std::uint32_t& acc) {
    std::array<const std::uint32_t*, R + 1> r{};
    std::array<std::uint32_t*, U + 1> u{};
    std::array<std::uint32_t*, W + 1> w{};
    for (int k = 0; k < R; ++k) r[k] = rd[k];
    for (int k = 0; k < U; ++k) u[k] = up[k];
    for (int k = 0; k < W; ++k) w[k] = wr[k];
    std::uint32_t a = 0;
#pragma omp simd reduction(^ : a)
    for (std::int64_t i = e0; i < e1; ++i) {
      for (int k = 0; k < R; ++k) a ^= r[k][i];
      for (int k = 0; k < U; ++k) u[k][i] += 1u;
      for (int k = 0; k < W; ++k) w[k][i] = static_cast<std::uint32_t>(i);
    }
    acc ^= a;
  }
  using FusedFn = void (*)(std::uint32_t* const*, std::uint32_t* const*, std::uint32_t* const*,
                           std::int64_t, std::int64_t, std::uint32_t&);
  template <std::size_t... I>
  static constexpr std::array<FusedFn, sizeof...(I)> fused_table(std::index_sequence<I...>) {
    constexpr int nu = kMaxUpdate + 1, nw = kMaxWrite + 1;
    return {{&fused_block<static_cast<int>(I) / (nu * nw), static_cast<int>(I) / nw % nu,
                          static_cast<int>(I) % nw>...}};
  }
  /// The fused loop for a pass's role counts, or null (a role not of 32 bits, or too many).
  static FusedFn fused_for(const PassTraffic& p) {
    const std::vector<int>* kinds[3] = {&p.read_bits, &p.update_bits, &p.write_bits};
    for (const std::vector<int>* k : kinds) {
      for (int b : *k) {
        if (b != 32) return nullptr;
      }
    }
    const int r = static_cast<int>(p.read_bits.size()), u = static_cast<int>(p.update_bits.size()),
              w = static_cast<int>(p.write_bits.size());
    if (r > kMaxRead || u > kMaxUpdate || w > kMaxWrite) return nullptr;
    static constexpr auto table = fused_table(
        std::make_index_sequence<(kMaxRead + 1) * (kMaxUpdate + 1) * (kMaxWrite + 1)>());
    return table[static_cast<std::size_t>((r * (kMaxUpdate + 1) + u) * (kMaxWrite + 1) + w)];
  }

  /// One pass: block by block, each read role folded into a value that is kept, each
  /// updated role incremented in place, each written role set. All roles advance together,
  /// as a kernel's loop advances them: a pass of 32-bit roles in one fused loop over the
  /// elements (fused_block), any other a group of 32 elements (one to four cache lines) of
  /// every role at a time. With each role a 256-element sub-block in turn (its first form),
  /// fused steps ran up to 1.9x this floor's speed on a Zen 3 VM (AVX2); with groups for
  /// 32-bit roles too (its second), up to 1.19x.
  void run(const PassTraffic& p) {
    const std::int64_t blocks = (p.elements + kBlock - 1) / kBlock;
    const std::vector<int>* kinds[3] = {&p.read_bits, &p.update_bits, &p.write_bits};
    std::uint32_t sink = 0;
    if (const FusedFn fused = fused_for(p)) {  // the pass's roles are the first slots
#pragma omp parallel for schedule(static) reduction(^ : sink)
      for (std::int64_t b = 0; b < blocks; ++b) {
        std::uint32_t acc = 0;
        fused(ptrs_[0].data(), ptrs_[1].data(), ptrs_[2].data(), b * kBlock,
              std::min(p.elements, (b + 1) * kBlock), acc);
        sink ^= acc;
      }
      sink_ ^= sink;
      return;
    }
#pragma omp parallel for schedule(static) reduction(^ : sink)
    for (std::int64_t b = 0; b < blocks; ++b) {
      const std::int64_t e0 = b * kBlock, e1 = std::min(p.elements, e0 + kBlock);
      const std::int64_t g0 = e0 / kGroup, g1 = e1 / kGroup;  // whole groups
      std::uint32_t acc = 0;
      for (std::int64_t g = g0; g < g1; ++g) {
        for (int k = 0; k < 3; ++k) {
          for (std::size_t r = 0; r < kinds[k]->size(); ++r) {
            group(k, (*kinds[k])[r], slots_[k][r].data(), g, acc);
          }
        }
      }
      if (g1 * kGroup < e1) {  // the last block's partial group
        for (int k = 0; k < 3; ++k) {
          for (std::size_t r = 0; r < kinds[k]->size(); ++r) {
            const int bits = (*kinds[k])[r];
            words(k, slots_[k][r].data(), g1 * kGroup * bits / 32, (e1 * bits + 31) / 32, acc);
          }
        }
      }
      sink ^= acc;
    }
    sink_ ^= sink;
  }

  std::vector<PassTraffic> traffic_;
  std::vector<std::vector<std::uint32_t>> slots_[3];  // read, updated, written
  std::vector<std::uint32_t*> ptrs_[3];               // their data, then a null
  std::int64_t bytes_ = 0;
  std::uint32_t sink_ = 0;  // what the reads folded into: kept, so they are not elided

 public:
  /// What the reads folded into (callers may ignore it).
  std::uint32_t sink() const { return sink_; }
  /// The words of role `role` of kind `kind` (0 read, 1 updated, 2 written), for tests.
  const std::vector<std::uint32_t>& slot(int kind, std::size_t role) const {
    return slots_[kind][role];
  }
};

}  // namespace fusedopt::bench
