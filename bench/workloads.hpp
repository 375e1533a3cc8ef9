// Parameter shapes the step benchmarks and the demo run on, by name (fusedopt-bench
// --workload): BERT-base (201 tensors, 109.5 M elements, the model of Bagua's published
// benchmark), GPT-2 small (148 tensors, 124.4 M elements), its 48 hidden matrices alone (the
// params Muon steps) and 5,000 small tensors; plus the copy floor every step is measured
// against.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "fusedopt/dtype.hpp"

namespace fusedopt::bench {

struct Workload {
  std::string name;
  std::vector<std::int64_t> sizes;
  /// Each tensor's shape as torch has it (empty: 1-D, or not known).
  std::vector<std::vector<std::int64_t>> shapes;
  /// Each tensor's dtype (empty: every one fp32) and name (empty: p0, p1, ...).
  std::vector<DType> dtypes;
  std::vector<std::string> names;
  DType dtype(std::size_t i) const { return i < dtypes.size() ? dtypes[i] : DType::F32; }
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
  Workload w;
  w.name = "bert_base";
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
  Workload w;
  w.name = "small_5000";
  std::mt19937 rng(5000);
  std::uniform_int_distribution<std::int64_t> size(1024, 65536);
  for (int i = 0; i < 5000; ++i) w.sizes.push_back(size(rng));
  return w;
}

/// GPT-2 small (Hugging Face's GPT2LMHeadModel; the head shares wte): 148 tensors,
/// 124,439,808 elements. Its Conv1D weights are [in, out].
inline Workload gpt2_small() {
  const std::int64_t h = 768;
  Workload w;
  w.name = "gpt2_small";
  auto add = [&](std::vector<std::int64_t> shape) {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    w.sizes.push_back(n);
    w.shapes.push_back(std::move(shape));
  };
  add({50257, h});  // wte
  add({1024, h});   // wpe
  for (int layer = 0; layer < 12; ++layer) {
    add({h});  // ln_1
    add({h});
    add({h, 3 * h});  // attn.c_attn
    add({3 * h});
    add({h, h});  // attn.c_proj
    add({h});
    add({h});  // ln_2
    add({h});
    add({h, 4 * h});  // mlp.c_fc
    add({4 * h});
    add({4 * h, h});  // mlp.c_proj
    add({h});
  }
  add({h});  // ln_f
  add({h});
  return w;
}

/// GPT-2 small's hidden matrices alone, the params Muon steps (embeddings, head and 1-D
/// params belong on AdamW): 12 layers of c_attn [768, 2304], attn.c_proj [768, 768],
/// mlp.c_fc [768, 3072] and mlp.c_proj [3072, 768] (Conv1D's [in, out]) = 48 tensors,
/// 84,934,656 elements.
inline Workload gpt2_small_matrices() {
  const std::int64_t h = 768;
  Workload w;
  w.name = "gpt2_small_matrices";
  for (int layer = 0; layer < 12; ++layer) {
    for (std::vector<std::int64_t> shape :
         std::vector<std::vector<std::int64_t>>{{h, 3 * h}, {h, h}, {h, 4 * h}, {4 * h, h}}) {
      w.sizes.push_back(shape[0] * shape[1]);
      w.shapes.push_back(std::move(shape));
    }
  }
  return w;
}

/// The workloads by name ("bert-base", "gpt2-small", "gpt2-small-matrices", "small-5000";
/// '_' for '-' too).
inline std::vector<std::string> workload_names() {
  return {"bert-base", "gpt2-small", "gpt2-small-matrices", "small-5000"};
}
inline std::optional<Workload> named_workload(std::string name) {
  std::replace(name.begin(), name.end(), '_', '-');
  if (name == "bert-base") return bert_base();
  if (name == "gpt2-small") return gpt2_small();
  if (name == "gpt2-small-matrices") return gpt2_small_matrices();
  if (name == "small-5000") return small_tensors();
  return std::nullopt;
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
