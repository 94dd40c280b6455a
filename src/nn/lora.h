// LoRA (Hu et al., 2021) on a linear layer: each adapted part of the output
// (a whole layer, or one fused part such as q of [q | k | v]) gains
//   y[:, part] += scale * dropout(x) A^T B^T,   A [r, in], B [rows, r],
// with the base weight W untouched. Over fused layers each part has its own
// A and B, as Hugging Face PEFT adapts q_proj, k_proj and v_proj separately.
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
struct LoraScratch {
  Tensor z;              // [N * max rows]: a part's output, then its output gradient
  Tensor dh;             // [N * r]
  Tensor dx;             // [N * max in]: a part's input gradient before it is summed
  Tensor xd;             // [N * max in]: dropout(x); undefined without dropout
  uint64_t seed = 0;     // this micro-batch's dropout seed
  bool training = true;  // dropout applies (forward and backward)
};

// What one adapted layer keeps between its forward and backward.
struct LoraActs {
  Tensor h;                           // [parts * N * r]: x A^T of each part
  const LoraScratch* work = nullptr;  // shared scratch
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
  void forward(Tensor y, const Tensor& x, const LoraActs& s) const {
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
  void backward(Tensor dx, const Tensor& dy, const Tensor& x, const LoraActs& s) const {
    const int64_t N = x.dim(0), in = x.dim(1);
    const Tensor xin = input(x, s, N, in);
    const LoraScratch& w = *s.work;
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
  static Tensor carve(const Tensor& flat, int64_t at, int64_t rows, int64_t cols) {
    return flat.narrow0(at, rows * cols).view({rows, cols});
  }
  bool uses_dropout(const LoraScratch* w) const { return dropout > 0.f && w->training; }
  bool uses_dropout(const LoraActs& s) const { return uses_dropout(s.work); }
  uint64_t seed(const LoraActs& s) const { return s.work->seed * 0x2545F4914F6CDD1Dull + id; }
  // x, or dropout(x) regenerated from the seed.
  Tensor input(const Tensor& x, const LoraActs& s, int64_t N, int64_t in) const {
    if (!uses_dropout(s)) return x;
    Tensor xd = carve(s.work->xd, 0, N, in);
    ops::dropout(xd, x, dropout, seed(s));
    return xd;
  }
};

}  // namespace nk::nn
