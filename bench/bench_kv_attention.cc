// Decode attention over a KV cache: the contiguous layout (one block of L
// positions per sequence) against paged layouts of the same history, blocks
// consecutive or scattered through the pool. Usage:
//   bench_kv_attention [reps] [context]   (threads from OMP_NUM_THREADS)
// One call = one decode step of 8 sequences at position `context` (512 by
// default) for one layer: ops::kv_cache_store + ops::attention_cached. Shapes:
// GPT-2 124M (12 heads of 64) and Llama 3.2 1B (32 query, 8 kv heads of 64).
// Time is the CPU time of the process per call (the machine may be shared),
// best of 5 rounds of `reps` calls.
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <ctime>
#include <numeric>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "cpu_time.h"
#include "ops/ops.h"

using namespace nk;

namespace {

using bench::cpu_now;

Tensor i32(const Shape& s, const std::vector<int32_t>& v) {
  Tensor t = Tensor::empty(s, DType::I32);
  ops::copy_bytes_from_host(t, v.data());
  return t;
}

// ms per call of one decode step over `block` positions per block (0: one
// block of L per sequence); scattered: blocks dealt in a shuffled order.
double time_layout(int64_t Hq, int64_t Hkv, int64_t D, int64_t ctx, int64_t block, bool scattered,
                   int reps) {
  const int64_t S = 8, L = ctx + 1, B = block ? block : L, M = (L + B - 1) / B, NB = S * M;
  Tensor kc = Tensor::empty({NB, Hkv, B, D}, DType::F32),
         vc = Tensor::empty({NB, Hkv, B, D}, DType::F32);
  Rng rng(1);
  ops::fill(kc, 0.5f);
  ops::fill(vc, 0.25f);
  std::vector<int32_t> order(static_cast<size_t>(NB));
  std::iota(order.begin(), order.end(), 0);
  if (scattered)
    for (int64_t i = NB - 1; i > 0; --i)
      std::swap(order[size_t(i)], order[rng.below(uint64_t(i + 1))]);
  Tensor table = i32({S, M}, order);
  std::vector<int32_t> seqs(static_cast<size_t>(S)), pos(static_cast<size_t>(S), int32_t(ctx));
  std::iota(seqs.begin(), seqs.end(), 0);
  Tensor sq = i32({S}, seqs), ps = i32({S}, pos);
  Tensor qkv = Tensor::empty({S, (Hq + 2 * Hkv) * D}, DType::F32),
         out = Tensor::empty({S, Hq * D}, DType::F32);
  ops::fill(qkv, 0.1f);
  auto call = [&] {
    ops::kv_cache_store(kc, vc, qkv, Hq, table, sq, ps);
    ops::attention_cached(out, qkv, kc, vc, Hq, table, sq, ps);
  };
  call();
  double best = 1e30;
  for (int round = 0; round < 5; ++round) {
    const double t0 = cpu_now();
    for (int r = 0; r < reps; ++r) call();
    best = std::min(best, (cpu_now() - t0) / reps);
  }
  return 1e3 * best;
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 50;
  const int64_t ctx = argc > 2 ? std::atoll(argv[2]) : 512;
  struct Shape3 {
    const char* name;
    int64_t Hq, Hkv, D;
  };
  for (const Shape3& s : {Shape3{"gpt2-124m", 12, 12, 64}, Shape3{"llama-1b", 32, 8, 64}}) {
    const double base = time_layout(s.Hq, s.Hkv, s.D, ctx, 0, false, reps);
    fmt::print("{} threads={} context={}: contiguous {:.3f} ms/layer-step\n", s.name, num_threads(),
               ctx, base);
    for (int64_t b : {16, 64})
      for (bool sc : {false, true}) {
        const double t = time_layout(s.Hq, s.Hkv, s.D, ctx, b, sc, reps);
        fmt::print("  block {:>3} {:<11} {:.3f} ms ({:.3f}x)\n", b,
                   sc ? "scattered" : "consecutive", t, t / base);
      }
  }
  return 0;
}
