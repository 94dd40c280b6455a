// GEMM throughput of the linear op for the GPT-2 124M shapes at N = B*T rows,
// in f32 and bf16, against a 4096^3 product as the library's practical peak.
//
//   bench_gemm [--n 2048] [--reps 3] [--threads 0]
//   bench_gemm --few-rows 64 [--reps 3] [--threads 0]
//
// Columns: fwd = linear_forward (with bias); dx = dy@w and dw += dy^T@x are the
// two backward products timed alone through the same cached oneDNN primitives
// linear_backward uses; bwd = the whole linear_backward (dx, dw, db). Each is the
// best time of several runs (see best_time).
//
// --few-rows MAX: a bf16 weight's forward product at N = 1..MAX rows of bf16
// x, two ways: quant_linear_forward over the weight's bytes as QuantType::BF16
// rows (what `quantize=bf16` runs: the direct kernel up to 32 rows, panels
// beyond) and linear_forward on the dense weight (below avx512_bf16: oneDNN
// on f32 copies of the operands).
#include <fmt/format.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/cpu/dnnl_matmul.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace {

using nk::DType;
using nk::Tensor;

struct Shape {
  const char* name;
  int64_t in, out;
};

// Random values; the numbers do not matter, only that they are finite and dense.
Tensor random_tensor(const nk::Shape& shape, DType t, uint64_t seed) {
  Tensor x = Tensor::empty(shape, t);
  nk::Rng r(seed);
  for (int64_t i = 0; i < x.numel(); ++i) {
    float v = float(r.uniform() - 0.5);
    if (t == DType::F32)
      x.data<float>()[i] = v;
    else
      x.data<nk::bf16>()[i] = nk::f32_to_bf16(v);
  }
  return x;
}

// Best wall time, in seconds, of at least `reps` runs and at least 0.5 s of
// runs, after one warm-up run (which also creates the oneDNN primitive).
double best_time(int reps, const std::function<void()>& fn) {
  using clock = std::chrono::steady_clock;
  fn();
  double best = 1e30, total = 0;
  for (int i = 0; i < reps || total < 0.5; ++i) {
    auto t0 = clock::now();
    fn();
    double dt = std::chrono::duration<double>(clock::now() - t0).count();
    best = std::min(best, dt);
    total += dt;
  }
  return best;
}

struct Row {
  double fwd, dx, dw, bwd;  // GFLOP/s
};

// One layer's products at N rows: fwd, dx and dw are 2*N*in*out FLOP each.
Row bench_layer(int64_t n, int64_t in, int64_t out, DType t, int reps) {
  Tensor x = random_tensor({n, in}, t, 1), w = random_tensor({out, in}, t, 2);
  Tensor b = random_tensor({out}, t, 3), dy = random_tensor({n, out}, t, 4);
  Tensor y = Tensor::empty({n, out}, t), dx = Tensor::empty({n, in}, t);
  Tensor dw = Tensor::zeros({out, in}, DType::F32), db = Tensor::zeros({out}, DType::F32);
  const double gflop = 2.0 * double(n) * double(in) * double(out) * 1e-9;
  namespace cpu = nk::ops::cpu;
  cpu::MatmulSpec sdx{.m = n, .n = in, .k = out, .a = t, .b = t, .c = t};
  cpu::MatmulSpec sdw{.m = out, .n = in, .k = n, .a = t, .b = t, .c = DType::F32};
  sdw.trans_a = true;
  sdw.accumulate = true;
  Row r;
  r.fwd = gflop / best_time(reps, [&] { nk::ops::linear_forward(y, x, w, b); });
  r.dx = gflop / best_time(reps, [&] { cpu::dnnl_matmul(sdx, dy.raw(), w.raw(), dx.raw()); });
  r.dw = gflop / best_time(reps, [&] { cpu::dnnl_matmul(sdw, dy.raw(), x.raw(), dw.raw()); });
  r.bwd = 2 * gflop / best_time(reps, [&] { nk::ops::linear_backward(dx, dw, db, dy, x, w); });
  return r;
}

// The library's practical peak: linear_forward on a 4096^3 product, GFLOP/s.
double square_peak(DType t, int reps) {
  const int64_t m = 4096;
  Tensor x = random_tensor({m, m}, t, 5), w = random_tensor({m, m}, t, 6);
  Tensor y = Tensor::empty({m, m}, t);
  double sec = best_time(reps, [&] { nk::ops::linear_forward(y, x, w, Tensor()); });
  return 2.0 * double(m) * double(m) * double(m) * 1e-9 / sec;
}

// --few-rows: ms per product of the two paths at each N up to max_n.
void few_rows(int64_t max_n, int reps) {
  const Shape shapes[] = {{"2048->2048", 2048, 2048}, {"2048->8192", 2048, 8192}};
  fmt::print(
      "| weight (bf16) | N | bf16 rows ms | dense ms | dense / bf16 rows "
      "|\n|---|---:|---:|---:|---:|\n");
  for (const Shape& sh : shapes) {
    Tensor w = random_tensor({sh.out, sh.in}, DType::BF16, 7);
    nk::ops::QuantWeight q;
    q.type = nk::ops::QuantType::BF16;
    q.shape = w.shape();
    q.data = Tensor::from_blob(w.raw(), {w.numel() * 2}, DType::U8);
    for (int64_t n = 1; n <= max_n; n = n < 4 ? n + 1 : n < 16 ? n + 4 : n + 8) {
      Tensor x = random_tensor({n, sh.in}, DType::BF16, 8);
      Tensor y = Tensor::empty({n, sh.out}, DType::BF16);
      const double direct =
          best_time(reps, [&] { nk::ops::quant_linear_forward(y, x, q, Tensor()); });
      const double dnnl = best_time(reps, [&] { nk::ops::linear_forward(y, x, w, Tensor()); });
      fmt::print("| {} | {} | {:.3f} | {:.3f} | {:.2f} |\n", sh.name, n, direct * 1e3, dnnl * 1e3,
                 dnnl / direct);
    }
  }
}

// Nominal clock from /proc/cpuinfo (MHz), 0 if unknown.
double cpu_mhz() {
  std::ifstream f("/proc/cpuinfo");
  std::string line;
  while (std::getline(f, line))
    if (line.rfind("cpu MHz", 0) == 0) return std::atof(line.substr(line.find(':') + 1).c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 2048, few = 0;
  int reps = 3, threads = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--n"))
      n = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps"))
      reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--threads"))
      threads = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--few-rows"))
      few = std::atoll(argv[i + 1]);
    else {
      fmt::print(stderr,
                 "usage: bench_gemm [--n 2048 | --few-rows MAX] [--reps 3] [--threads 0]\n");
      return 2;
    }
  }
  nk::set_num_threads(threads);
  const int cores = nk::num_threads();
  if (few > 0) {
    fmt::print("# bench_gemm --few-rows: {} threads, best of >= {} runs and >= 0.5 s each\n\n",
               cores, reps);
    few_rows(few, reps);
    return 0;
  }

  // GPT-2 124M (C = 768, V padded to 50304) linear layers.
  const Shape shapes[] = {{"qkv", 768, 2304},
                          {"attn proj", 768, 768},
                          {"mlp fc", 768, 3072},
                          {"mlp proj", 3072, 768},
                          {"lm head", 768, 50304}};
  const DType dtypes[] = {DType::F32, DType::BF16};

  // Theoretical peak, an estimate: AVX-512 with two 512-bit FMA pipes per core
  // (Zen 5 / Xeon server cores) = 2 pipes * 16 lanes * 2 FLOP = 64 f32 FLOP per
  // cycle; vdpbf16ps does a 2-term dot per f32 lane, so 128 bf16 FLOP per cycle.
  // The clock is the nominal one; turbo makes the real peak somewhat higher.
  const double ghz = cpu_mhz() * 1e-3;
  fmt::print("# bench_gemm: N = {}, {} threads, best of >= {} runs and >= 0.5 s each\n\n", n, cores,
             reps);
  if (ghz > 0)
    fmt::print(
        "Theoretical peak (estimate: {} cores x {:.2f} GHz nominal x 64 f32 / 128 bf16 "
        "FLOP/cycle): f32 {:.0f} GFLOP/s, bf16 {:.0f} GFLOP/s\n\n",
        cores, ghz, cores * ghz * 64, cores * ghz * 128);

  // The VM's speed drifts (shared host), so the peak is measured before and after
  // the layers and the better of the two kept; rows are printed at the end.
  double peak[2];
  for (int d = 0; d < 2; ++d) peak[d] = square_peak(dtypes[d], reps);
  std::vector<Row> rows;
  for (DType t : dtypes)
    for (const Shape& s : shapes) {
      fmt::print(stderr, "{} {}...\n", nk::dtype_name(t), s.name);
      rows.push_back(bench_layer(n, s.in, s.out, t, reps));
    }
  for (int d = 0; d < 2; ++d) peak[d] = std::max(peak[d], square_peak(dtypes[d], reps));

  fmt::print(
      "Practical peak (linear_forward 4096x4096x4096): f32 {:.1f} GFLOP/s, bf16 {:.1f} "
      "GFLOP/s\n\n",
      peak[0], peak[1]);
  // At 64 f32 FLOP/cycle/core, the measured peak implies the clock the cores
  // really ran at (turbo); above the nominal one, the estimate above is low.
  fmt::print("Clock implied by the practical f32 peak at 64 FLOP/cycle/core: {:.2f} GHz\n\n",
             peak[0] / (cores * 64.0));
  fmt::print(
      "| layer | in->out | dtype | fwd GFLOP/s | dx GFLOP/s | dw GFLOP/s | bwd GFLOP/s |"
      " fwd % peak | dx % peak | dw % peak | bwd % peak |\n");
  fmt::print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n");
  size_t i = 0;
  for (int d = 0; d < 2; ++d)
    for (const Shape& s : shapes) {
      const Row& r = rows[i++];
      const double p = 100.0 / peak[d];
      fmt::print(
          "| {} | {}->{} | {} | {:.1f} | {:.1f} | {:.1f} | {:.1f} | {:.0f}% | {:.0f}% | "
          "{:.0f}% | {:.0f}% |\n",
          s.name, s.in, s.out, nk::dtype_name(dtypes[d]), r.fwd, r.dx, r.dw, r.bwd, r.fwd * p,
          r.dx * p, r.dw * p, r.bwd * p);
    }
  return 0;
}
