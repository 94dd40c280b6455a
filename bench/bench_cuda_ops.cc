// Throughput of each CUDA kernel at GPT-2 124M's training shapes (batch 16 x
// 1024, d_model 768, 12 heads of 64, vocabulary 50257, bf16), against the two
// ceilings of the card measured in the same run: a device-to-device copy
// (bytes read + written per second) and a large bf16 GEMM through the same
// cuBLASLt path (8192^3). Each op is timed with CUDA events around `reps`
// calls after a warm-up; the median of 5 such rounds is printed. Usage:
//   bench_cuda_ops [reps]
// FLOPs: a linear layer 2*N*in*out (backward: dx and dw, twice that);
// causal attention forward 4*B*H*T*T*D/2, backward 2.5x that. Bytes: each
// input read once and each output written once (the fewest a kernel can move).
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "ops/ops.h"
#ifdef NK_WITH_CUDA
#include "core/cuda/runtime.h"
#endif

using namespace nk;

#ifndef NK_WITH_CUDA
int main() {
  fmt::print("bench_cuda_ops: this build has no CUDA backend\n");
  return 0;
}
#else

namespace {

int g_reps = 20;

// Milliseconds per call: the median over 5 rounds of `g_reps` calls.
double ms(const std::function<void()>& fn) {
  fn();
  nk::cuda::synchronize();
  std::vector<double> rounds;
  for (int r = 0; r < 5; ++r) {
    nk::cuda::Event a(true), b(true);
    a.record(nk::cuda::stream());
    for (int i = 0; i < g_reps; ++i) fn();
    b.record(nk::cuda::stream());
    b.synchronize();
    rounds.push_back(double(b.elapsed_ms(a)) / g_reps);
  }
  std::sort(rounds.begin(), rounds.end());
  return rounds[2];
}

// Uniform values in [-scale, scale) on the device (never zeros: METHOD.md).
Tensor rand_dev(const Shape& s, DType dt, uint64_t seed, float scale = 1.f) {
  std::vector<float> h(static_cast<size_t>(shape_numel(s)));
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& v : h) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    v = scale * (float(x >> 40) / float(1 << 23) - 1.f);
  }
  Tensor t = Tensor::empty(s, dt, Device::CUDA);
  ops::copy_from_host(t, h.data());
  return t;
}

Tensor tokens_dev(int64_t n, int64_t vocab) {
  std::vector<int32_t> h(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) h[size_t(i)] = int32_t((i * 7919) % vocab);
  Tensor t = Tensor::empty({n}, DType::I32, Device::CUDA);
  ops::copy_bytes_from_host(t, h.data());
  return t;
}

double g_tflops_ceiling = 0, g_gbs_ceiling = 0;

void row_flops(const char* name, double flops, double t_ms) {
  const double tf = flops / (t_ms * 1e-3) / 1e12;
  fmt::print("{:<34} {:9.3f} ms {:9.1f} TFLOP/s  {:5.1f}% of GEMM ceiling\n", name, t_ms, tf,
             100 * tf / g_tflops_ceiling);
}
void row_bytes(const char* name, double bytes, double t_ms) {
  const double gbs = bytes / (t_ms * 1e-3) / 1e9;
  fmt::print("{:<34} {:9.3f} ms {:9.0f} GB/s     {:5.1f}% of copy ceiling\n", name, t_ms, gbs,
             100 * gbs / g_gbs_ceiling);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) g_reps = std::max(1, std::atoi(argv[1]));
  fmt::print("{}\n", nk::cuda::device_description());
  const DType bf = DType::BF16;
  {                                      // ceilings
    const int64_t n = int64_t(1) << 29;  // 1 GiB of bytes, copied
    Tensor a = Tensor::empty({n}, DType::U8, Device::CUDA),
           b = Tensor::empty({n}, DType::U8, Device::CUDA);
    nk::cuda::memset_zero(a.raw(), a.nbytes());
    const double t = ms([&] { nk::cuda::copy_on_device(b.raw(), a.raw(), size_t(n)); });
    g_gbs_ceiling = 2.0 * double(n) / (t * 1e-3) / 1e9;
    const int64_t g = 8192;
    Tensor x = rand_dev({g, g}, bf, 1), w = rand_dev({g, g}, bf, 2),
           y = Tensor::empty({g, g}, bf, Device::CUDA);
    const double tg = ms([&] { ops::linear_forward(y, x, w, Tensor()); });
    g_tflops_ceiling = 2.0 * double(g) * g * g / (tg * 1e-3) / 1e12;
    fmt::print("ceilings: copy {:.0f} GB/s (read + write), bf16 GEMM 8192^3 {:.1f} TFLOP/s\n\n",
               g_gbs_ceiling, g_tflops_ceiling);
  }
  const int64_t B = 16, T = 1024, C = 768, H = 12, D = 64, V = 50257, N = B * T;
  Tensor x = rand_dev({N, C}, bf, 3), dx = Tensor::empty({N, C}, bf, Device::CUDA);
  for (auto [name, in, out] : {std::tuple{"linear qkv 768->2304", C, 3 * C},
                               {"linear fc 768->3072", C, 4 * C},
                               {"linear proj 3072->768", 4 * C, C},
                               {"linear lm head 768->50257", C, V}}) {
    Tensor xi = rand_dev({N, in}, bf, 4), w = rand_dev({out, in}, bf, 5, 0.05f);
    Tensor b = rand_dev({out}, DType::F32, 6), y = Tensor::empty({N, out}, bf, Device::CUDA);
    Tensor dy = rand_dev({N, out}, bf, 7), dxi = Tensor::empty({N, in}, bf, Device::CUDA);
    Tensor dw = Tensor::zeros({out, in}, DType::F32, Device::CUDA);
    Tensor db = Tensor::zeros({out}, DType::F32, Device::CUDA);
    const double f = 2.0 * double(N) * double(in) * double(out);
    Tensor b16 = rand_dev({out}, bf, 6);
    row_flops(fmt::format("{} fwd", name).c_str(), f,
              ms([&] { ops::linear_forward(y, xi, w, Tensor()); }));
    row_flops(fmt::format("{} fwd+bias bf16", name).c_str(), f,
              ms([&] { ops::linear_forward(y, xi, w, b16); }));
    row_flops(fmt::format("{} fwd+bias f32", name).c_str(), f,
              ms([&] { ops::linear_forward(y, xi, w, b); }));
    row_flops(fmt::format("{} bwd dx+dw", name).c_str(), 2 * f,
              ms([&] { ops::linear_backward(dxi, dw, Tensor(), dy, xi, w); }));
    row_bytes(fmt::format("{} bwd db", name).c_str(), double(N * out) * 2,
              ms([&] { ops::linear_backward(Tensor(), Tensor(), db, dy, xi, w); }));
  }
  {
    Tensor qkv = rand_dev({B, T, 3 * C}, bf, 8), dout = rand_dev({B, T, C}, bf, 9);
    Tensor out = Tensor::empty({B, T, C}, bf, Device::CUDA);
    Tensor lse = Tensor::empty({B, H, T}, DType::F32, Device::CUDA);
    Tensor dqkv = Tensor::empty({B, T, 3 * C}, bf, Device::CUDA);
    const double f = 4.0 * B * H * double(T) * T * D / 2;
    row_flops("attention causal fwd", f, ms([&] { ops::attention_forward(out, lse, qkv, H, H); }));
    row_flops("attention causal bwd", 2.5 * f,
              ms([&] { ops::attention_backward(dqkv, dout, qkv, out, lse, H, H); }));
  }
  {
    Tensor y = Tensor::empty({N, C}, bf, Device::CUDA), w = rand_dev({C}, bf, 10),
           b = rand_dev({C}, bf, 11);
    Tensor mean = Tensor::empty({N}, DType::F32, Device::CUDA),
           rstd = Tensor::empty({N}, DType::F32, Device::CUDA);
    Tensor dw = Tensor::zeros({C}, DType::F32, Device::CUDA),
           db = Tensor::zeros({C}, DType::F32, Device::CUDA);
    const double act = double(N * C) * 2;
    row_bytes("layernorm fwd", 2 * act,
              ms([&] { ops::layernorm_forward(y, mean, rstd, x, w, b, 1e-5f); }));
    row_bytes("layernorm bwd (dx, dw, db)", 4 * act,
              ms([&] { ops::layernorm_backward(dx, dw, db, y, x, w, mean, rstd); }));
    Tensor r = Tensor::empty({N}, DType::F32, Device::CUDA);
    row_bytes("rmsnorm fwd", 2 * act, ms([&] { ops::rmsnorm_forward(y, r, x, w, 1e-5f); }));
    Tensor h = rand_dev({N, 4 * C}, bf, 12), g = Tensor::empty({N, 4 * C}, bf, Device::CUDA);
    row_bytes("gelu fwd", 2 * 4 * act, ms([&] { ops::gelu_forward(g, h); }));
    row_bytes("gelu bwd", 3 * 4 * act, ms([&] { ops::gelu_backward(g, g, h); }));
    Tensor gu = rand_dev({N, 8 * C}, bf, 13), s = Tensor::empty({N, 4 * C}, bf, Device::CUDA);
    row_bytes("swiglu fwd", 3 * 4 * act, ms([&] { ops::swiglu_forward(s, gu); }));
    row_bytes("add (residual)", 3 * act, ms([&] { ops::add(y, x, dx); }));
  }
  {
    Tensor tok = tokens_dev(N, V), wte = rand_dev({V, C}, bf, 14), wpe = rand_dev({T, C}, bf, 15);
    Tensor out = Tensor::empty({B, T, C}, bf, Device::CUDA), tok2 = tok.view({B, T});
    row_bytes("embedding fwd (wte + wpe)", 3 * double(N * C) * 2,
              ms([&] { ops::embedding_forward(out, tok2, wte, wpe); }));
    Tensor dwte = Tensor::zeros({V, C}, DType::F32, Device::CUDA),
           dwpe = Tensor::zeros({T, C}, DType::F32, Device::CUDA);
    row_bytes("embedding bwd (dwte, dwpe)", double(N * C) * (2 + 8),
              ms([&] { ops::embedding_backward(dwte, dwpe, out, tok2, Tensor()); }));
  }
  {
    Tensor logits = rand_dev({N, V}, bf, 16, 4.f), tgt = tokens_dev(N, V);
    Tensor losses = Tensor::empty({N}, DType::F32, Device::CUDA);
    row_bytes("cross-entropy fwd+bwd (in place)", 3 * double(N) * V * 2, ms([&] {
                ops::cross_entropy_forward_backward(losses, logits, logits, tgt, -100, 1.f / N);
              }));
  }
  {
    const int64_t P = 124'000'000;
    Tensor p = rand_dev({P}, DType::F32, 17), g = rand_dev({P}, DType::F32, 18);
    Tensor m = Tensor::zeros({P}, DType::F32, Device::CUDA),
           v = Tensor::zeros({P}, DType::F32, Device::CUDA);
    Tensor copy = Tensor::empty({P}, bf, Device::CUDA);
    ops::AdamWParams ap{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 1};
    row_bytes("adamw 124M f32 state + bf16 copy", double(P) * (4 * 4 + 3 * 4 + 2),
              ms([&] { ops::adamw_step(p, g, m, v, ap, copy); }));
    row_bytes("sum_squares 124M f32 (grad norm)", double(P) * 4, ms([&] { ops::sum_squares(g); }));
  }
  return 0;
}

#endif  // NK_WITH_CUDA
