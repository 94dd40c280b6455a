// Throughput of the fast CPU attention and cross-entropy kernels, with the
// plain reference timed in the same process for the ratio. Usage:
//   bench_attention [reps] [packed]   (threads from OMP_NUM_THREADS; "packed":
//   only the packed-row cases)
// FLOPs: causal forward 4*B*Hq*T*T*D/2 (two GEMMs over half the scores);
// backward 2.5x that (five GEMMs). Packed rows (cu_seqlens) are timed against
// plain causal attention over the same row; their useful FLOPs are the sum of
// the documents' own causal FLOPs. Cross-entropy bytes: logits read once for
// the loss; forward_backward reads them twice and writes dlogits once.
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <ctime>
#include <functional>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "cpu_time.h"
#include "ops/cpu/softmax_math.h"
#include "ops/ops.h"
#include "ops/ref/attention.h"

using namespace nk;

namespace {

using bench::cpu_now;

// Wall seconds per call. The machine may be shared, so the CPU seconds the
// process actually got are also summed into g_cpu_s: rate * threads / (cpu
// seconds) estimates the uncontended rate.
double g_cpu_s = 0;
double seconds(const std::function<void()>& fn, int reps) {
  fn();  // warm-up: scratch buffers, page faults
  const double c0 = cpu_now();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  g_cpu_s = (cpu_now() - c0) / reps;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

Tensor random_tensor(const Shape& s, DType dt, uint64_t seed, float std = 1.f) {
  Tensor f = Tensor::empty(s, DType::F32);
  Rng r(seed);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = float(r.normal()) * std;
  if (dt == DType::F32) return f;
  Tensor t = Tensor::empty(s, dt);
  for (int64_t i = 0; i < f.numel(); ++i) t.data<bf16>()[i] = f32_to_bf16(f.data<float>()[i]);
  return t;
}

void bench_attention(int64_t B, int64_t T, int64_t Hq, int64_t Hkv, int64_t D, DType dt, int reps,
                     bool with_ref) {
  const int64_t C = (Hq + 2 * Hkv) * D;
  Tensor qkv = random_tensor({B, T, C}, dt, 1);
  Tensor dout = random_tensor({B, T, Hq * D}, dt, 2);
  Tensor out = Tensor::empty({B, T, Hq * D}, dt), lse = Tensor::empty({B, Hq, T}, DType::F32);
  Tensor dqkv = Tensor::empty({B, T, C}, dt);
  const double fwd_flops = 4.0 * B * Hq * T * T * D / 2, bwd_flops = 2.5 * fwd_flops;
  const double tf = seconds([&] { ops::attention_forward(out, lse, qkv, Hq, Hkv); }, reps);
  const double cf = g_cpu_s;
  const double tb =
      seconds([&] { ops::attention_backward(dqkv, dout, qkv, out, lse, Hq, Hkv); }, reps);
  const double cb = g_cpu_s, nt = num_threads();
  fmt::print(
      "attention {:4} B={} T={} Hq={} Hkv={} D={}: fwd {:7.2f} ms {:6.1f} GFLOP/s | bwd {:7.2f} "
      "ms {:6.1f} GFLOP/s | fwd+bwd {:6.1f} GFLOP/s\n",
      dtype_name(dt), B, T, Hq, Hkv, D, tf * 1e3, fwd_flops / tf * 1e-9, tb * 1e3,
      bwd_flops / tb * 1e-9, (fwd_flops + bwd_flops) / (tf + tb) * 1e-9);
  fmt::print("  per CPU-second x {} threads: fwd {:.1f} bwd {:.1f} fwd+bwd {:.1f} GFLOP/s\n", nt,
             fwd_flops / cf * nt * 1e-9, bwd_flops / cb * nt * 1e-9,
             (fwd_flops + bwd_flops) / (cf + cb) * nt * 1e-9);
  if (!with_ref || dt != DType::F32) return;
  const ref::AttentionDims d{B, T, Hq, Hkv, D};
  std::vector<float> rout(out.numel()), rlse(lse.numel()), rd(qkv.numel());
  const float* q = qkv.data<float>();
  const double rf = seconds([&] { ref::attention_forward(rout.data(), rlse.data(), q, d); }, 1);
  const double rb = seconds(
      [&] {
        ref::attention_backward(rd.data(), dout.data<float>(), q, rout.data(), rlse.data(), d);
      },
      1);
  fmt::print(
      "  reference (1 thread, plain loops): fwd {:.1f} GFLOP/s, bwd {:.1f} GFLOP/s; "
      "fast/ref fwd {:.1f}x bwd {:.1f}x\n",
      fwd_flops / rf * 1e-9, bwd_flops / rb * 1e-9, rf / tf, rb / tb);
}

// One row of T tokens holding documents of the given lengths (summing to T),
// against plain causal attention over the same row.
void bench_packed(int64_t T, const std::vector<int32_t>& lengths, int64_t Hq, int64_t Hkv,
                  int64_t D, DType dt, int reps, const char* what) {
  const int64_t C = (Hq + 2 * Hkv) * D;
  Tensor qkv = random_tensor({1, T, C}, dt, 1);
  Tensor dout = random_tensor({1, T, Hq * D}, dt, 2);
  Tensor out = Tensor::empty({1, T, Hq * D}, dt), lse = Tensor::empty({1, Hq, T}, DType::F32);
  Tensor dqkv = Tensor::empty({1, T, C}, dt);
  Tensor cu = Tensor::empty({1, int64_t(lengths.size()) + 1}, DType::I32);
  int32_t* c = cu.data<int32_t>();
  c[0] = 0;
  double useful = 0;  // forward FLOPs of the documents' own causal attention
  for (size_t i = 0; i < lengths.size(); ++i) {
    c[i + 1] = c[i] + lengths[i];
    useful += 4.0 * Hq * double(lengths[i]) * double(lengths[i]) * double(D) / 2;
  }
  if (c[lengths.size()] != T) fmt::print("bench_packed: lengths do not sum to T\n");
  auto run = [&](const Tensor& boundaries) {
    const double tf =
        seconds([&] { ops::attention_forward(out, lse, qkv, Hq, Hkv, boundaries); }, reps);
    const double tb = seconds(
        [&] { ops::attention_backward(dqkv, dout, qkv, out, lse, Hq, Hkv, boundaries); }, reps);
    return std::make_pair(tf, tb);
  };
  const auto [pf, pb] = run(Tensor());
  const auto [kf, kb] = run(cu);
  fmt::print(
      "attention {:4} T={} Hq={} Hkv={} D={} {}: causal fwd {:6.2f} ms bwd {:6.2f} ms | packed "
      "fwd {:6.2f} ms bwd {:6.2f} ms | speed-up fwd {:.2f}x bwd {:.2f}x (useful work {:.2f}x "
      "less) | packed useful GFLOP/s fwd {:.1f} bwd {:.1f}\n",
      dtype_name(dt), T, Hq, Hkv, D, what, pf * 1e3, pb * 1e3, kf * 1e3, kb * 1e3, pf / kf, pb / kb,
      4.0 * Hq * double(T) * double(T) * double(D) / 2 / useful, useful / kf * 1e-9,
      2.5 * useful / kb * 1e-9);
}

void bench_cross_entropy(int64_t N, int64_t V, DType dt, int reps) {
  Tensor logits = random_tensor({N, V}, dt, 3, 3.f);
  Tensor targets = Tensor::empty({N}, DType::I32);
  Rng r(4);
  for (int64_t i = 0; i < N; ++i) targets.data<int32_t>()[i] = int32_t(r.below(uint64_t(V)));
  Tensor losses = Tensor::empty({N}, DType::F32), dl = Tensor::empty({N, V}, dt);
  const double bytes = double(logits.nbytes());
  const double tf =
      seconds([&] { ops::cross_entropy_forward(losses, logits, targets, -100); }, reps);
  const double tb = seconds(
      [&] { ops::cross_entropy_forward_backward(losses, dl, logits, targets, -100, 1.f / N); },
      reps);
  // Bandwidth ceiling in this session: one parallel max over the same bytes.
  std::vector<float> sink(N);
  const int64_t row_bytes = V * int64_t(dtype_size(dt));
  const double tr = seconds(
      [&] {
        parallel_for(N, 1, [&](int64_t b, int64_t e) {
          for (int64_t r = b; r < e; ++r)
            sink[r] = ops::cpu_avx2::softmax::max_of(
                reinterpret_cast<const float*>(static_cast<const char*>(logits.raw()) +
                                               r * row_bytes),
                row_bytes / 4);
        });
      },
      reps);
  fmt::print("  plain parallel read of the logits: {:.1f} GB/s\n", bytes / tr * 1e-9);
  fmt::print(
      "cross_entropy {:4} N={} V={}: fwd {:7.2f} ms {:5.1f} GB/s | fwd+bwd {:7.2f} ms "
      "{:5.1f} GB/s (3 passes over the logits)\n",
      dtype_name(dt), N, V, tf * 1e3, bytes / tf * 1e-9, tb * 1e3, 3 * bytes / tb * 1e-9);
}

}  // namespace

int main(int argc, char** argv) {
  const int reps = argc > 1 ? std::atoi(argv[1]) : 5;
  const bool packed_only = argc > 2 && std::string(argv[2]) == "packed";
  fmt::print("threads: {}\n", num_threads());
  for (DType dt : {DType::F32, DType::BF16}) {
    if (packed_only) break;
    bench_attention(8, 256, 12, 12, 64, dt, reps, true);  // GPT-2 124M
    bench_attention(8, 256, 32, 8, 64, dt, reps, false);  // Llama-like GQA
    bench_attention(1, 2048, 12, 12, 64, dt, 1, false);   // long context
  }
  for (DType dt : {DType::F32, DType::BF16}) {
    bench_packed(2048, std::vector<int32_t>(8, 256), 12, 12, 64, dt, reps, "8 docs x 256");
    // Boundaries off the 64-token tiles: every boundary cuts a tile.
    bench_packed(2048, {300, 200, 100, 500, 148, 400, 250, 150}, 12, 12, 64, dt, reps,
                 "8 ragged docs");
  }
  if (packed_only) return 0;
  for (DType dt : {DType::F32, DType::BF16}) bench_cross_entropy(1024, 50257, dt, reps);
  return 0;
}
