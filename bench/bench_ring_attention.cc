// Context parallelism's attention work per rank (nn/context_parallel.h) on
// one process: for cp = 1, 2, 4 the row of T tokens is cut into 2·cp chunks,
// rank r holding chunks r and 2·cp−1−r, and each simulated rank's share of
// the ring (its queries against every rank's key/value block, forward then
// backward: ops::attention_block_*) is timed on its own. What a rank with
// its own cores would spend on attention is that share; the slowest rank
// bounds the step. The one-process kernel (ops::attention_forward/backward
// over the whole row) is timed beside it. The K/V exchanges are not in
// these figures (no network: the blocks are local tensors).
//
// The all-to-all variant (parallel.cp_comm_type=a2a) beside it: each
// simulated rank's heads (Hq/cp query, Hkv/cp key/value) over the whole row,
// the one-process kernel's forward and backward, timed the same way; its
// two all-to-alls (four in the backward) are not in the figures either.
//
// The all-gather variant (parallel.cp_comm_type=all_gather) too: each
// simulated rank's queries against the whole row's keys and values (one
// call of the block kernel at the global positions, forward then backward,
// the row's dK/dV of its queries); its all-gathers and reduce-scatter are
// not in the figures.
// Usage:
//   bench_ring_attention [T] [reps] [cp]   (threads from OMP_NUM_THREADS;
//   cp: that size only, else 1, 2 and 4)
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "cpu_time.h"
#include "nn/context_parallel.h"
#include "ops/ops.h"

using namespace nk;

namespace {

struct Timing {
  double wall = 0, cpu = 0;  // seconds per call; CPU seconds the process got
};

Timing timed(const std::function<void()>& fn, int reps) {
  fn();  // warm-up: scratch buffers, page faults
  const double c0 = bench::cpu_now();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps,
          (bench::cpu_now() - c0) / reps};
}

Tensor randn(const Shape& s, uint64_t seed) {
  Tensor t = Tensor::empty(s, DType::F32);
  Rng r(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal());
  return t;
}

// Rank r's rows of the whole [1, T, W] tensor (columns [col0, col0 + w)).
Tensor local_rows(const Tensor& whole, int64_t r, int64_t cp, int64_t c, int64_t col0, int64_t w) {
  const int64_t Tl = 2 * c;
  Tensor t = Tensor::empty({1, Tl, w}, DType::F32);
  for (int64_t i = 0; i < Tl; ++i) {
    const int64_t g = nn::cp_global_position(i, r, cp, c);
    std::copy_n(whole.data<float>() + g * whole.dim(2) + col0, w, t.data<float>() + i * w);
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t T = argc > 1 ? std::atoll(argv[1]) : 16384;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 1;
  const int64_t only = argc > 3 ? std::atoll(argv[3]) : 0;
  const int64_t Hq = 8, Hkv = 4, D = 64, C = (Hq + 2 * Hkv) * D, OC = Hq * D, KC = 2 * Hkv * D;
  const double threads = num_threads();
  Tensor qkv = randn({1, T, C}, 1), dout = randn({1, T, OC}, 2);
  fmt::print("attention f32, one row of T={} tokens, Hq={} Hkv={} D={}, {} threads\n", T, Hq, Hkv,
             D, threads);

  Tensor out = Tensor::empty({1, T, OC}, DType::F32), lse = Tensor::empty({1, Hq, T}, DType::F32);
  Tensor dqkv = Tensor::empty({1, T, C}, DType::F32);
  const Timing whole = timed(
      [&] {
        ops::attention_forward(out, lse, qkv, Hq, Hkv);
        ops::attention_backward(dqkv, dout, qkv, out, lse, Hq, Hkv);
      },
      reps);
  fmt::print("one process, whole-row kernel: fwd+bwd {:.2f} s (CPU {:.2f} s)\n", whole.wall,
             whole.cpu);

  for (int64_t cp : {1, 2, 4}) {
    if (T % (2 * cp) || (only > 0 && cp != only)) continue;
    const int64_t c = T / (2 * cp), Tl = 2 * c;
    std::vector<Tensor> q, kv, g, pos;
    for (int64_t r = 0; r < cp; ++r) {
      q.push_back(local_rows(qkv, r, cp, c, 0, C));
      kv.push_back(local_rows(qkv, r, cp, c, OC, KC));
      g.push_back(local_rows(dout, r, cp, c, 0, OC));
      pos.push_back(Tensor::empty({Tl}, DType::I32));
      for (int64_t i = 0; i < Tl; ++i)
        pos.back().data<int32_t>()[i] = int32_t(nn::cp_global_position(i, r, cp, c));
    }
    double slowest = 0, sum = 0, cpu_sum = 0;
    for (int64_t r = 0; r < cp; ++r) {
      Tensor o = Tensor::empty({1, Tl, OC}, DType::F32), l = Tensor::empty({1, Hq, Tl}, DType::F32);
      Tensor dq = Tensor::empty({1, Tl, OC}, DType::F32);
      Tensor dkv = Tensor::empty({1, Tl, KC}, DType::F32);
      const Timing t = timed(
          [&] {
            ops::fill(o, 0.f);
            ops::fill(l, -INFINITY);
            for (int64_t s = 0; s < cp; ++s) {
              const int64_t owner = (r - s + cp) % cp;
              ops::attention_block_forward(o, l, q[size_t(r)], kv[size_t(owner)], pos[size_t(r)],
                                           pos[size_t(owner)], Hq, Hkv);
            }
            ops::fill(dq, 0.f);
            for (int64_t s = 0; s < cp; ++s) {
              const int64_t owner = (r - s + cp) % cp;
              ops::fill(dkv, 0.f);  // each block's gradient travels on; only the work counts
              ops::attention_block_backward(dq, dkv, g[size_t(r)], o, l, q[size_t(r)],
                                            kv[size_t(owner)], pos[size_t(r)], pos[size_t(owner)],
                                            Hq, Hkv);
            }
          },
          reps);
      slowest = std::max(slowest, t.wall);
      sum += t.wall;
      cpu_sum += t.cpu;
    }
    fmt::print(
        "cp {}: ring blocks per rank fwd+bwd: slowest {:.2f} s, mean {:.2f} s (CPU {:.2f} s); "
        "whole-row kernel / slowest rank {:.2f}x\n",
        cp, slowest, sum / double(cp), cpu_sum / double(cp), whole.wall / slowest);
    slowest = sum = cpu_sum = 0;
    {
      Tensor whole_kv = Tensor::empty({1, T, KC}, DType::F32),
             keys = Tensor::empty({T}, DType::I32);
      for (int64_t i = 0; i < T; ++i) {
        std::copy_n(qkv.data<float>() + i * C + OC, KC, whole_kv.data<float>() + i * KC);
        keys.data<int32_t>()[i] = int32_t(i);
      }
      Tensor dkv = Tensor::empty({1, T, KC}, DType::F32);
      for (int64_t r = 0; r < cp; ++r) {
        Tensor o = Tensor::empty({1, Tl, OC}, DType::F32),
               l = Tensor::empty({1, Hq, Tl}, DType::F32);
        Tensor dq = Tensor::empty({1, Tl, OC}, DType::F32);
        const Timing t = timed(
            [&] {
              ops::fill(o, 0.f);
              ops::fill(l, -INFINITY);
              ops::attention_block_forward(o, l, q[size_t(r)], whole_kv, pos[size_t(r)], keys, Hq,
                                           Hkv);
              ops::fill(dq, 0.f);
              ops::fill(dkv, 0.f);
              ops::attention_block_backward(dq, dkv, g[size_t(r)], o, l, q[size_t(r)], whole_kv,
                                            pos[size_t(r)], keys, Hq, Hkv);
            },
            reps);
        slowest = std::max(slowest, t.wall);
        sum += t.wall;
        cpu_sum += t.cpu;
      }
    }
    fmt::print(
        "cp {}: all-gather, whole-row K/V per rank fwd+bwd: slowest {:.2f} s, mean {:.2f} s (CPU "
        "{:.2f} s); whole-row kernel / slowest rank {:.2f}x\n",
        cp, slowest, sum / double(cp), cpu_sum / double(cp), whole.wall / slowest);
    slowest = sum = cpu_sum = 0;
    const int64_t hq = Hq / cp, hk = Hkv / cp, w = (hq + 2 * hk) * D;
    for (int64_t r = 0; r < cp; ++r) {
      Tensor mine = Tensor::empty({1, T, w}, DType::F32),
             dmine = Tensor::empty({1, T, w}, DType::F32);
      for (int64_t i = 0; i < T; ++i) {  // rank r's share of the q, k and v columns
        const float* row = qkv.data<float>() + i * C;
        float* to = mine.data<float>() + i * w;
        to = std::copy_n(row + r * hq * D, hq * D, to);
        to = std::copy_n(row + OC + r * hk * D, hk * D, to);
        std::copy_n(row + OC + Hkv * D + r * hk * D, hk * D, to);
      }
      Tensor gr = Tensor::empty({1, T, hq * D}, DType::F32),
             o = Tensor::empty({1, T, hq * D}, DType::F32);
      for (int64_t i = 0; i < T; ++i)
        std::copy_n(dout.data<float>() + i * OC + r * hq * D, hq * D,
                    gr.data<float>() + i * hq * D);
      Tensor l = Tensor::empty({1, hq, T}, DType::F32);
      const Timing t = timed(
          [&] {
            ops::attention_forward(o, l, mine, hq, hk);
            ops::attention_backward(dmine, gr, mine, o, l, hq, hk);
          },
          reps);
      slowest = std::max(slowest, t.wall);
      sum += t.wall;
      cpu_sum += t.cpu;
    }
    fmt::print(
        "cp {}: all-to-all heads per rank ({} of {} query heads, whole row) fwd+bwd: slowest "
        "{:.2f} s, mean {:.2f} s (CPU {:.2f} s); whole-row kernel / slowest rank {:.2f}x\n",
        cp, hq, Hq, slowest, sum / double(cp), cpu_sum / double(cp), whole.wall / slowest);
  }
  return 0;
}
