// The cost of NF4 weights in a linear layer: the fused products
// (nf4_linear_forward, nf4_linear_backward_input: dequantise a panel of W,
// then oneDNN's product) against the dense ops on the same weight, in f32 and
// bf16, timed in the same process. Also the whole weight's dequantisation
// alone, and the weight's bytes.
//
//   bench_nf4 [--n 512] [--in 2048] [--out 2048] [--reps 5]
//
// (threads from OMP_NUM_THREADS). Times are the best of several runs, the
// ratios the median of paired runs (see time_pair).
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "core/rng.h"
#include "ops/ops.h"

namespace {

using nk::DType;
using nk::Tensor;

Tensor random_tensor(const nk::Shape& shape, DType t, uint64_t seed, double std) {
  Tensor f = Tensor::empty(shape, DType::F32);
  nk::Rng r(seed);
  for (int64_t i = 0; i < f.numel(); ++i) f.data<float>()[i] = float(r.normal() * std);
  if (t == DType::F32) return f;
  Tensor out = Tensor::empty(shape, t);
  nk::ops::convert(out, f);
  return out;
}

double seconds(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The dense op and its NF4 twin timed in turns, so that both see the same
// load on a shared machine: the best time of each, and the median of the
// per-turn ratios nf4 / dense. At least `reps` turns and 1 s, after a warm-up
// turn (oneDNN primitives, scratch buffers).
struct Pair {
  double dense, nf4, ratio;
};
Pair time_pair(int reps, const std::function<void()>& dense, const std::function<void()>& nf4) {
  dense();
  nf4();
  std::vector<double> ratios;
  Pair p{1e30, 1e30, 0};
  for (double total = 0; int(ratios.size()) < reps || total < 1.0;) {
    const double d = seconds(dense), q = seconds(nf4);
    p.dense = std::min(p.dense, d);
    p.nf4 = std::min(p.nf4, q);
    ratios.push_back(q / d);
    total += d + q;
  }
  std::sort(ratios.begin(), ratios.end());
  p.ratio = ratios[ratios.size() / 2];
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t n = 512, in = 2048, out = 2048;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    const int64_t v = std::atoll(argv[i + 1]);
    if (a == "--n") n = v;
    if (a == "--in") in = v;
    if (a == "--out") out = v;
    if (a == "--reps") reps = int(v);
  }
  namespace ops = nk::ops;
  const Tensor w32 = random_tensor({out, in}, DType::F32, 1, 0.02);
  ops::Nf4Weight q = ops::Nf4Weight::empty({out, in});
  ops::nf4_quantize(q, w32);
  fmt::print("N={} in={} out={} threads={}: weight {:.2f} MiB as NF4, {:.2f} MiB as bf16\n", n, in,
             out, nk::num_threads(), double(q.nbytes()) / (1 << 20),
             double(out * in * 2) / (1 << 20));
  const double gflop = 2.0 * double(n) * double(in) * double(out) * 1e-9;
  fmt::print("{:5} {:>10} {:>10} {:>7} {:>10} {:>10} {:>7} {:>12}\n", "dtype", "fwd ms", "nf4 fwd",
             "ratio", "dx ms", "nf4 dx", "ratio", "dequant ms");
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor w = Tensor::empty({out, in}, t);
    ops::nf4_dequantize(w, q);
    const Tensor x = random_tensor({n, in}, t, 2, 1.0), b = random_tensor({out}, t, 3, 1.0);
    const Tensor dy = random_tensor({n, out}, t, 4, 1.0);
    Tensor y = Tensor::empty({n, out}, t), dx = Tensor::empty({n, in}, t);
    const Pair fwd = time_pair(
        reps, [&] { ops::linear_forward(y, x, w, b); },
        [&] { ops::nf4_linear_forward(y, x, q, b); });
    const Pair dx_pair = time_pair(
        reps, [&] { ops::linear_backward(dx, Tensor(), Tensor(), dy, x, w); },
        [&] { ops::nf4_linear_backward_input(dx, dy, q); });
    double deq = 1e30;
    for (int i = 0; i < reps; ++i) deq = std::min(deq, seconds([&] { ops::nf4_dequantize(w, q); }));
    fmt::print("{:5} {:10.3f} {:10.3f} {:7.2f} {:10.3f} {:10.3f} {:7.2f} {:12.3f}\n",
               nk::dtype_name(t), fwd.dense * 1e3, fwd.nf4 * 1e3, fwd.ratio, dx_pair.dense * 1e3,
               dx_pair.nf4 * 1e3, dx_pair.ratio, deq * 1e3);
    fmt::print("      GFLOP/s (best): fwd {:.1f}, nf4 fwd {:.1f}, dx {:.1f}, nf4 dx {:.1f}\n",
               gflop / fwd.dense, gflop / fwd.nf4, gflop / dx_pair.dense, gflop / dx_pair.nf4);
  }
  return 0;
}
