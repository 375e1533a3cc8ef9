// Parameter shapes the step benchmarks and the demo run on: BERT-base (201 tensors,
// 109.5 M elements, the model of Bagua's published benchmark) and 5,000 small tensors, plus
// the copy floor every step is measured against.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace fusedopt::bench {

struct Workload {
  std::string name;
  std::vector<std::int64_t> sizes;
  /// Each tensor's shape as torch has it (empty: 1-D, or not known).
  std::vector<std::vector<std::int64_t>> shapes;
  std::int64_t elements() const {
    std::int64_t n = 0;
    for (std::int64_t s : sizes) n += s;
    return n;
  }
};

/// BERT-base (uncased) with a 2-class head: embeddings, 12 layers of 16 tensors, pooler,
/// classifier = 201 tensors, 109,483,778 elements.
inline Workload bert_base() {
  const std::int64_t h = 768, ffn = 3072;
  Workload w{"bert_base", {}, {}};
  auto add = [&](std::vector<std::int64_t> shape) {  // torch's shapes: Linear is [out, in]
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    w.sizes.push_back(n);
    w.shapes.push_back(std::move(shape));
  };
  add({30522, h});  // word, position and token-type embeddings, LayerNorm
  add({512, h});
  add({2, h});
  add({h});
  add({h});
  for (int layer = 0; layer < 12; ++layer) {
    for (int proj = 0; proj < 4; ++proj) {  // query, key, value, attention output
      add({h, h});
      add({h});
    }
    add({h});  // attention LayerNorm
    add({h});
    add({ffn, h});  // intermediate
    add({ffn});
    add({h, ffn});  // output
    add({h});
    add({h});  // output LayerNorm
    add({h});
  }
  add({h, h});  // pooler
  add({h});
  add({2, h});  // classifier
  add({2});
  return w;
}

/// 5,000 tensors of 1 K to 64 K elements (a fixed seed: the same list every run).
inline Workload small_tensors() {
  Workload w{"small_5000", {}, {}};
  std::mt19937 rng(5000);
  std::uniform_int_distribution<std::int64_t> size(1024, 65536);
  for (int i = 0; i < 5000; ++i) w.sizes.push_back(size(rng));
  return w;
}

/// Seconds of one plain copy of `n` bytes from `src` to `dst`: the faster of memcpy on
/// one thread and memcpy split across every core.
inline double copy_seconds(char* dst, const char* src, std::size_t n) {
  auto t0 = std::chrono::steady_clock::now();
  std::memcpy(dst, src, n);
  const double one = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());
  t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (unsigned t = 0; t < threads; ++t) {
    pool.emplace_back([=] {
      std::size_t b = n * t / threads, e = n * (t + 1) / threads;
      std::memcpy(dst + b, src + b, e - b);
    });
  }
  for (auto& th : pool) th.join();
  const double all = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return std::min(one, all);
}

/// Bytes per second of the best plain copy this machine does (best of 5), counting bytes
/// read plus bytes written, over `bytes` of traffic.
inline double copy_bandwidth(std::size_t bytes) {
  const std::size_t n = bytes / 2;
  std::vector<char> src(n, 1), dst(n, 2);
  double best = 1e30;
  for (int r = 0; r < 5; ++r) best = std::min(best, copy_seconds(dst.data(), src.data(), n));
  return 2.0 * static_cast<double>(n) / best;
}

}  // namespace fusedopt::bench
