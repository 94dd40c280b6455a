// Parameter-efficient adapters a linear layer carries, with W untouched:
//  - LoRA (Hu et al., 2021): each adapted part of the output (a whole layer,
//    or one fused part such as q of [q | k | v]) gains
//      y[:, part] += scale * dropout(x) A^T B^T,   A [r, in], B [rows, r];
//    over fused layers each part has its own A and B, as Hugging Face PEFT
//    adapts q_proj, k_proj and v_proj separately.
//  - IA3 (Liu et al., 2022): learned vectors that rescale output parts,
//      y[:, part] = l * (x W^T + b)[:, part],
//    or, for a feedforward module, the input: y = (x * l) W^T + b.
//  - Bottleneck adapters (NeMo's canonical adapters, model/peft.h): after
//    the whole output, y' = y + W_out silu(W_in LN(y)).
#pragma once
#include <vector>

#include "ops/ops.h"

namespace nk::nn {

struct LoraPart {
  Tensor a, b;       // compute dtype: A [r, in], B [rows, r]
  Tensor da, db;     // f32 gradients, accumulated; undefined when frozen
  int64_t col0 = 0;  // the first output column (row of W) the part writes
};

// Workspace shared by every adapted layer of one forward/backward (flat
// buffers, carved per call by the row count N).
struct AdapterScratch {
  Tensor z;              // LoRA: [N * max rows], a part's output, then its output gradient;
                         // IA3: [N * max out], the gradient of the unscaled output
  Tensor dh;             // [N * r]
  Tensor dx;             // [N * max in]: a part's input gradient before it is summed
  Tensor xd;             // [N * max in]: LoRA's dropout(x) (undefined without dropout),
                         // or IA3's x * l (a scaled input)
  Tensor base;           // IA3 on outputs, training: [N * max rows], a part's unscaled output
  uint64_t seed = 0;     // this micro-batch's dropout seed
  bool training = true;  // dropout applies, and forwards keep what a backward reads
  // Forwards skip every adapter (the base model's output, bit for bit): a
  // preference objective's reference without a second copy. No backward then.
  bool off = false;
};

// rows x cols of a flat workspace from element `at` on.
inline Tensor carve(const Tensor& flat, int64_t at, int64_t rows, int64_t cols) {
  return flat.narrow0(at, rows * cols).view({rows, cols});
}

// What one adapted layer keeps between its forward and backward.
struct AdapterActs {
  Tensor h;                              // LoRA: [parts * N * r], x A^T of each part;
                                         // bottleneck: [N * (out + dim)], y then W_in LN(y)
  const AdapterScratch* work = nullptr;  // shared scratch
  Tensor stats;                          // bottleneck: f32 [2N], its LayerNorm's mean, rstd
  bool defined() const { return work != nullptr; }
};

struct Lora {
  std::vector<LoraPart> parts;
  int64_t rank = 0;
  float scale = 0.f;    // alpha / r, or alpha / sqrt(r) (rsLoRA)
  float dropout = 0.f;  // on the adapter's input only
  uint64_t id = 0;      // mixed into the dropout seed: each layer its own mask
  bool active() const { return !parts.empty(); }

  // y [N, out] += the adapters' outputs for x [N, in].
  void forward(Tensor y, const Tensor& x, const AdapterActs& s) const {
    const int64_t N = x.dim(0), in = x.dim(1);
    const Tensor xin = input(x, s, N, in);
    for (size_t i = 0; i < parts.size(); ++i) {
      const LoraPart& p = parts[i];
      Tensor h = carve(s.h, int64_t(i) * N * rank, N, rank), z = carve(s.work->z, 0, N, p.b.dim(0));
      ops::linear_forward(h, xin, p.a, Tensor());
      ops::linear_forward(z, h, p.b, Tensor());
      ops::add_columns(y, z, p.col0, scale);
    }
  }
  // dx [N, in] ACCUMULATES (skipped if undefined); da, db accumulate.
  void backward(Tensor dx, const Tensor& dy, const Tensor& x, const AdapterActs& s) const {
    const int64_t N = x.dim(0), in = x.dim(1);
    const Tensor xin = input(x, s, N, in);
    const AdapterScratch& w = *s.work;
    for (size_t i = 0; i < parts.size(); ++i) {
      const LoraPart& p = parts[i];
      Tensor h = carve(s.h, int64_t(i) * N * rank, N, rank), dz = carve(w.z, 0, N, p.b.dim(0));
      Tensor dh = carve(w.dh, 0, N, rank);
      ops::copy_columns(dz, dy, p.col0, scale);
      ops::linear_backward(dh, p.db, Tensor(), dz, h, p.b);  // dh = dz B; dB += dz^T h
      Tensor dxp = dx.defined() ? carve(w.dx, 0, N, in) : Tensor();
      ops::linear_backward(dxp, p.da, Tensor(), dh, xin, p.a);  // dA += dh^T x; dxp = dh A
      if (!dx.defined()) continue;
      if (uses_dropout(s)) ops::dropout(dxp, dxp, dropout, seed(s));
      ops::accumulate(dx, dxp);
    }
  }

 private:
  bool uses_dropout(const AdapterScratch* w) const { return dropout > 0.f && w->training; }
  bool uses_dropout(const AdapterActs& s) const { return uses_dropout(s.work); }
  uint64_t seed(const AdapterActs& s) const { return s.work->seed * 0x2545F4914F6CDD1Dull + id; }
  // x, or dropout(x) regenerated from the seed.
  Tensor input(const Tensor& x, const AdapterActs& s, int64_t N, int64_t in) const {
    if (!uses_dropout(s)) return x;
    Tensor xd = carve(s.work->xd, 0, N, in);
    ops::dropout(xd, x, dropout, seed(s));
    return xd;
  }
};

struct Ia3Part {
  Tensor l;   // compute dtype [rows], the scale of output columns [col0, col0 + rows)
  Tensor dl;  // f32 gradient, accumulated; undefined when frozen
  int64_t col0 = 0;
};

struct Ia3 {
  std::vector<Ia3Part> out;  // scaled output parts
  Tensor in, din;            // [in]: the scaled input (feedforward), or undefined
  bool active() const { return !out.empty() || in.defined(); }

  // The input the base product sees: x, or x * in written to the scratch.
  Tensor input(const Tensor& x, const AdapterActs& s) const {
    if (!in.defined()) return x;
    Tensor xs = s.work->xd.narrow0(0, x.numel()).view(x.shape());
    ops::convert(xs, x);
    ops::scale_columns(xs, in, 0);
    return xs;
  }
  // y [N, out] = the base output; scales its parts.
  void scale_output(Tensor y) const {
    for (const Ia3Part& p : out) ops::scale_columns(y, p.l, p.col0);
  }
  // dy [N, out] -> the gradient of the base output, in the scratch (dy is
  // the caller's: a residual stream's gradient must stay as it is); the
  // scales' gradients from the recomputed unscaled parts. w, b: the base
  // layer's; x its input.
  Tensor output_grad(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& b,
                     const AdapterActs& s) const {
    if (out.empty()) return dy;
    const int64_t N = dy.dim(0);
    for (const Ia3Part& p : out) {
      if (!p.dl.defined()) continue;
      const int64_t rows = p.l.dim(0);
      Tensor base = s.work->base.narrow0(0, N * rows).view({N, rows});
      ops::linear_forward(base, x, w.narrow0(p.col0, rows),
                          b.defined() ? b.narrow0(p.col0, rows) : Tensor());
      ops::column_dot(p.dl, dy, p.col0, base);
    }
    Tensor g = s.work->z.narrow0(0, dy.numel()).view(dy.shape());
    ops::convert(g, dy);
    scale_output(g);
    return g;
  }
  // dx [N, in] = the base layer's input gradient w.r.t. its (scaled) input;
  // turns it into the gradient w.r.t. x and accumulates in's.
  void input_grad(Tensor dx, const Tensor& x) const {
    if (!in.defined()) return;
    if (din.defined()) ops::column_dot(din, dx, 0, x);
    ops::scale_columns(dx, in, 0);
  }
};

// A bottleneck adapter on a layer's whole output [N, out]:
//   y' = y + W_out silu(u),  u = W_in LN(y).
struct Bottleneck {
  Tensor ln_w, ln_b, w_in, w_out;      // compute dtype: [out], [out], [dim, out], [out, dim]
  Tensor dln_w, dln_b, dw_in, dw_out;  // f32 gradients, accumulated
  float eps = 1e-5f;
  bool active() const { return w_in.defined(); }

  // y [N, out] += the adapter's output; in training keeps y and u in s.h,
  // LN's stats in s.stats (inference reads y in place).
  void forward(Tensor y, const AdapterActs& s) const {
    const int64_t N = y.dim(0), out = y.dim(1), dim = w_in.dim(0);
    Tensor y0 = y, u = carve(s.h, N * out, N, dim);
    Tensor ln = carve(s.work->xd, 0, N, out), a = carve(s.work->dh, 0, N, dim);
    Tensor z = carve(s.work->z, 0, N, out);
    if (s.work->training) {
      y0 = carve(s.h, 0, N, out);
      ops::convert(y0, y);
    }
    ops::layernorm_forward(ln, mean(s, N), rstd(s, N), y0, ln_w, ln_b, eps);
    ops::linear_forward(u, ln, w_in, Tensor());
    ops::silu_forward(a, u);
    ops::linear_forward(z, a, w_out, Tensor());
    ops::accumulate(y, z);
  }
  // dy [N, out]: the gradient of y' -> that of y (= dy + the branch's), in
  // the scratch (dy is the caller's); accumulates the adapter's gradients.
  Tensor output_grad(const Tensor& dy, const AdapterActs& s) const {
    const int64_t N = dy.dim(0), out = dy.dim(1), dim = w_in.dim(0);
    const AdapterScratch& w = *s.work;
    Tensor y0 = carve(s.h, 0, N, out), u = carve(s.h, N * out, N, dim);
    Tensor ln = carve(w.xd, 0, N, out), dln = carve(w.dx, 0, N, out);
    Tensor a = carve(w.dh, 0, N, dim), da = carve(w.dh, N * dim, N, dim);
    Tensor g = carve(w.z, 0, N, out);
    ops::layernorm_forward(ln, mean(s, N), rstd(s, N), y0, ln_w, ln_b, eps);  // recomputed
    ops::silu_forward(a, u);
    ops::linear_backward(da, dw_out, Tensor(), dy, a, w_out);  // da = dy W_out; dW_out += dy^T a
    ops::silu_backward(da, da, u);
    ops::linear_backward(dln, dw_in, Tensor(), da, ln, w_in);  // dln = du W_in; dW_in += du^T ln
    ops::convert(g, dy);
    ops::layernorm_backward(g, dln_w, dln_b, dln, y0, ln_w, mean(s, N), rstd(s, N));
    return g;
  }

 private:
  static Tensor mean(const AdapterActs& s, int64_t N) { return s.stats.narrow0(0, N); }
  static Tensor rstd(const AdapterActs& s, int64_t N) { return s.stats.narrow0(N, N); }
};

}  // namespace nk::nn
