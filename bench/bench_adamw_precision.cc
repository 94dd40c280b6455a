// One AdamW step over N parameters with each optim.* choice, against the
// default f32 kernel in the same process: ms per step and GB/s of state
// traffic (bytes read and written per parameter, counted below).
//
//   bench_adamw_precision [N=16777216] [reps=10] [threads=0: all cores]
//
// Each figure is the best of `reps` steps, the variants alternating.
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

Tensor filled(int64_t n, DType dt, float scale, uint64_t seed) {
  Tensor f = Tensor::empty({n}, DType::F32);
  nk::Rng rng(seed);
  float* x = f.data<float>();
  for (int64_t i = 0; i < n; ++i) x[i] = float(rng.normal() * scale);
  if (dt == DType::F32) return f;
  Tensor t = Tensor::empty({n}, dt);
  nk::ops::convert(t, f);
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t n = argc > 1 ? std::atoll(argv[1]) : int64_t(1) << 24;
  const int reps = argc > 2 ? std::atoi(argv[2]) : 10;
  nk::set_num_threads(argc > 3 ? std::atoi(argv[3]) : 0);
  const Tensor grad = filled(n, DType::F32, 1e-3f, 1);
  struct Variant {
    std::string name;
    int bytes;  // per parameter, read + written
    std::function<void(int64_t)> step;
  };
  // Default: f32 master (r/w 8), grad (r 4), m, v (r/w 16), bf16 copy (w 2) = 30.
  Tensor p32 = filled(n, DType::F32, 0.02f, 2), m32 = Tensor::zeros({n}, DType::F32),
         v32 = Tensor::zeros({n}, DType::F32), copy = Tensor::empty({n}, DType::BF16);
  Tensor pb = filled(n, DType::F32, 0.02f, 2), mb = Tensor::zeros({n}, DType::BF16),
         vb = Tensor::zeros({n}, DType::BF16), copyb = Tensor::empty({n}, DType::BF16);
  Tensor pf = filled(n, DType::F32, 0.02f, 2), mf = Tensor::zeros({n}, DType::F16),
         vf = Tensor::zeros({n}, DType::F16), copyf = Tensor::empty({n}, DType::BF16),
         scales = Tensor::empty({2}, DType::F32);
  nk::ops::fill(scales, 1.f);
  Tensor hi = filled(n, DType::BF16, 0.02f, 2), rem = Tensor::zeros({n}, DType::BF16),
         mh = Tensor::zeros({n}, DType::BF16), vh = Tensor::zeros({n}, DType::BF16);
  Tensor plain = filled(n, DType::BF16, 0.02f, 2), mp = Tensor::zeros({n}, DType::BF16),
         vp = Tensor::zeros({n}, DType::BF16);
  auto params = [](int64_t s) {
    return nk::ops::AdamWParams{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s, 1.f};
  };
  std::vector<Variant> variants = {
      {"f32 master, f32 moments (adamw_step)", 30,
       [&](int64_t s) { nk::ops::adamw_step(p32, grad, m32, v32, params(s), copy); }},
      {"f32 master, bf16 moments", 22,
       [&](int64_t s) {
         nk::ops::adamw_step_mixed(pb, Tensor(), grad, mb, vb, Tensor(), params(s), copyb);
       }},
      {"f32 master, f16 moments (2 passes)", 30,
       [&](int64_t s) {
         nk::ops::adamw_step_mixed(pf, Tensor(), grad, mf, vf, scales, params(s), copyf);
       }},
      {"bf16 master + remainder, bf16 moments", 20,
       [&](int64_t s) { nk::ops::adamw_step_mixed(hi, rem, grad, mh, vh, Tensor(), params(s)); }},
      {"plain bf16 master, bf16 moments", 16,
       [&](int64_t s) {
         nk::ops::adamw_step_mixed(plain, Tensor(), grad, mp, vp, Tensor(), params(s));
       }},
  };
  std::vector<double> best(variants.size(), 1e30);
  for (int r = 0; r < reps; ++r)
    for (size_t i = 0; i < variants.size(); ++i) {
      auto t0 = std::chrono::steady_clock::now();
      variants[i].step(r + 1);
      best[i] = std::min(
          best[i], std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
  fmt::print("AdamW step over {} parameters, {} threads, best of {}\n", n, nk::num_threads(), reps);
  fmt::print("| variant | ms/step | vs f32 | state traffic GB/s |\n|---|---:|---:|---:|\n");
  for (size_t i = 0; i < variants.size(); ++i)
    fmt::print("| {} | {:.2f} | {:.2f}x | {:.1f} |\n", variants[i].name, best[i] * 1e3,
               best[i] / best[0], double(variants[i].bytes) * double(n) / best[i] / 1e9);
  return 0;
}
