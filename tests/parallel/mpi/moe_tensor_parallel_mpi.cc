// The MoE block under tensor parallelism (nn/moe.h, expert tensor
// parallelism with etp = tp) against its plain self: every rank of the tp
// group (the whole world) holds its share of every expert's gate and up
// units (rows) and of its down projection (columns), and of a gated shared
// expert's, the router and the gate whole. The outputs, the input gradient
// and the router's and gate's gradients must equal the one-process block's
// on the same tokens, and each rank's weight gradients the slices of the
// plain ones. Without and with sequence parallelism (each rank's rows of x,
// y and dx). And the same block with whole experts on every rank
// (parallel.etp = 1: the ranks split the rows instead, nn/token_split.h),
// and on 4 ranks with each expert split over 2 of them (parallel.etp = 2:
// the two pairs split the rows).
#include <gtest/gtest.h>

#include <cmath>

#include "core/rng.h"
#include "dist/mesh.h"
#include "nn/moe.h"
#include "parallel_env.h"

namespace nk {
namespace {

using test::mpi;

Tensor randn(Rng& r, Shape shape, double std) {
  Tensor t = Tensor::empty(shape, DType::F32);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal() * std);
  return t;
}

void expect_near(const Tensor& a, const Tensor& b, const std::string& what) {
  ASSERT_EQ(a.numel(), b.numel()) << what;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const float x = a.data<float>()[i], y = b.data<float>()[i];
    ASSERT_NEAR(x, y, 1e-5 * (1 + std::fabs(y))) << what << " element " << i;
  }
}

// Rows [r0, r0 + n) of every block of `block` rows of w [R, K] (the
// experts' gate and up parts: each part's share).
Tensor part_rows(const Tensor& w, int64_t block, int64_t r0, int64_t n) {
  const int64_t blocks = w.dim(0) / block, K = w.dim(1);
  Tensor out = Tensor::empty({blocks * n, K}, DType::F32);
  for (int64_t b = 0; b < blocks; ++b)
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < K; ++j)
        out.data<float>()[(b * n + i) * K + j] = w.data<float>()[(b * block + r0 + i) * K + j];
  return out;
}

// Columns [c0, c0 + n) of w [R, K].
Tensor cols(const Tensor& w, int64_t c0, int64_t n) {
  const int64_t R = w.dim(0), K = w.dim(1);
  Tensor out = Tensor::empty({R, n}, DType::F32);
  for (int64_t i = 0; i < R; ++i)
    for (int64_t j = 0; j < n; ++j) out.data<float>()[i * n + j] = w.data<float>()[i * K + c0 + j];
  return out;
}

void check(bool sp) {
  const int t = mpi().world_size(), rank = mpi().rank();
  dist::MeshSpec spec;
  spec.tp = t;
  const dist::Mesh mesh(t, rank, spec);
  dist::ProcessGroups groups = mpi().make_groups(mesh, 60);
  const int64_t N = 8, C = 6, E = 4, k = 2, F = 8, Fs = 8, Ft = F / t, Fst = Fs / t;
  Rng wr(7);
  nn::MoE plain;
  plain.router.w = randn(wr, {E, C}, 0.8);
  plain.up = randn(wr, {E * 2 * F, C}, 0.5);
  plain.down = randn(wr, {E * C, F}, 0.5);
  plain.n_experts = E;
  plain.top_k = k;
  plain.d_ff = F;
  plain.shared_d_ff = Fs;
  plain.shared_up.w = randn(wr, {2 * Fs, C}, 0.5);
  plain.shared_down.w = randn(wr, {C, Fs}, 0.5);
  plain.shared_gate.w = randn(wr, {1, C}, 0.5);
  Rng xr(100);  // the same tokens on every rank
  const Tensor x = randn(xr, {N, C}, 1.0), dy = randn(xr, {N, C}, 1.0);
  auto alloc = [](const Shape& shape, DType dt) { return Tensor::zeros(shape, dt); };

  // grads: router, up, down, shared up, shared down, shared gate (zeroed).
  struct Out {
    Tensor y, dx, stats;
    std::vector<Tensor> g;
  };
  auto run = [&](nn::MoE m, int64_t f, int64_t fs, const Tensor& xi, const Tensor& dyi) {
    Out o;
    for (const Tensor* w :
         {&m.router.w, &m.up, &m.down, &m.shared_up.w, &m.shared_down.w, &m.shared_gate.w})
      o.g.push_back(Tensor::zeros(w->shape(), DType::F32));
    m.router.dw = o.g[0];
    m.dup = o.g[1];
    m.ddown = o.g[2];
    m.shared_up.dw = o.g[3];
    m.shared_down.dw = o.g[4];
    m.shared_gate.dw = o.g[5];
    m.d_ff = f;
    m.shared_d_ff = fs;
    auto s = nn::MoE::saved_for(N, C, E, k, f, DType::F32, alloc);
    auto g = nn::MoE::scratch_for(N, C, E, k, f, DType::F32, alloc);
    nn::MoE::add_shared(&s, &g, N, C, fs, true, DType::F32, alloc);
    if (m.tp.sp() || m.split.moves()) {
      s.full_x = Tensor::empty({N, C}, DType::F32);
      s.full_y = Tensor::empty({N, C}, DType::F32);
      g.dx_full = Tensor::empty({N, C}, DType::F32);
    }
    o.y = Tensor::empty(xi.shape(), DType::F32);
    o.dx = Tensor::empty(xi.shape(), DType::F32);
    m.forward(o.y, s, xi);
    std::vector<float> balance(size_t(E), 0.1f);
    m.backward(o.dx, dyi, s, g, xi, balance, 0.2f);
    o.stats = s.stats;
    return o;
  };
  const Out one = run(plain, F, Fs, x, dy);

  nn::MoE split = plain;
  split.tp = {&groups.get("tp"), sp};
  split.up = part_rows(plain.up, F, rank * Ft, Ft);  // every gate and up part's share
  split.down = cols(plain.down, rank * Ft, Ft);
  split.shared_up.w = part_rows(plain.shared_up.w, Fs, rank * Fst, Fst);
  split.shared_down.w = cols(plain.shared_down.w, rank * Fst, Fst);
  const int64_t R = sp ? N / t : N, r0 = sp ? rank * R : 0;
  const Out got = run(split, Ft, Fst, x.narrow0(r0, R), dy.narrow0(r0, R));
  const std::string how = sp ? " (sequence parallel)" : "";
  expect_near(got.y, one.y.narrow0(r0, R), "y" + how);
  expect_near(got.dx, one.dx.narrow0(r0, R), "dx" + how);
  expect_near(got.g[0], one.g[0], "router gradient" + how);
  expect_near(got.g[5], one.g[5], "shared gate gradient" + how);
  expect_near(got.g[1], part_rows(one.g[1], F, rank * Ft, Ft), "up gradient" + how);
  expect_near(got.g[2], cols(one.g[2], rank * Ft, Ft), "down gradient" + how);
  expect_near(got.g[3], part_rows(one.g[3], Fs, rank * Fst, Fst), "shared up gradient" + how);
  expect_near(got.g[4], cols(one.g[4], rank * Fst, Fst), "shared down gradient" + how);

  // Whole experts (parallel.etp = 1, nn/token_split.h): every rank holds the
  // whole block and computes its own rows of the N (a slice of x without
  // sp, its rows with it); the outputs and input gradient are the plain
  // block's (every row without sp), the router statistics the whole N's,
  // and the weight gradients, summed over the group, the plain ones.
  nn::MoE whole = plain;
  whole.split = {&groups.get("tp"), sp};
  const Out w = run(whole, F, Fs, x.narrow0(r0, R), dy.narrow0(r0, R));
  expect_near(w.y, one.y.narrow0(r0, R), "whole experts: y" + how);
  expect_near(w.dx, one.dx.narrow0(r0, R), "whole experts: dx" + how);
  expect_near(w.stats, one.stats, "whole experts: router statistics" + how);
  const char* names[] = {"router", "up", "down", "shared up", "shared down", "shared gate"};
  for (size_t i = 0; i < w.g.size(); ++i) {
    groups.get("tp").all_reduce(w.g[i]);
    expect_near(w.g[i], one.g[i], std::string("whole experts: ") + names[i] + " gradient" + how);
  }

  // Experts split over etp = 2 of 4 tp ranks (nn::TensorParallel::experts):
  // ranks {0, 1} and {2, 3} (expert-tp) each hold half of every expert's
  // units and split the rows with the other pair ({0, 2}, {1, 3}:
  // expert-token); the outputs, input gradient and statistics are the plain
  // block's, the weight gradients summed over expert-token its slices.
  if (t != 4) return;
  dist::MeshSpec narrow_spec = spec;
  narrow_spec.etp = 2;
  const dist::Mesh narrow_mesh(t, rank, narrow_spec);
  dist::ProcessGroups ng = mpi().make_groups(narrow_mesh, 60);
  const int64_t j = ng.get("expert-tp").rank(), Fh = F / 2, Fsh = Fs / 2;
  nn::MoE narrow = plain;
  narrow.tp = {&ng.get("expert-tp"), sp};
  narrow.split = {&ng.get("expert-token"), sp};
  narrow.up = part_rows(plain.up, F, j * Fh, Fh);
  narrow.down = cols(plain.down, j * Fh, Fh);
  narrow.shared_up.w = part_rows(plain.shared_up.w, Fs, j * Fsh, Fsh);
  narrow.shared_down.w = cols(plain.shared_down.w, j * Fsh, Fsh);
  const Out n = run(narrow, Fh, Fsh, x.narrow0(r0, R), dy.narrow0(r0, R));
  const std::string etp = "etp 2 of tp 4: ";
  expect_near(n.y, one.y.narrow0(r0, R), etp + "y" + how);
  expect_near(n.dx, one.dx.narrow0(r0, R), etp + "dx" + how);
  expect_near(n.stats, one.stats, etp + "router statistics" + how);
  for (const Tensor& g : n.g) ng.get("expert-token").all_reduce(g);
  expect_near(n.g[0], one.g[0], etp + "router gradient" + how);
  expect_near(n.g[5], one.g[5], etp + "shared gate gradient" + how);
  expect_near(n.g[1], part_rows(one.g[1], F, j * Fh, Fh), etp + "up gradient" + how);
  expect_near(n.g[2], cols(one.g[2], j * Fh, Fh), etp + "down gradient" + how);
  expect_near(n.g[3], part_rows(one.g[3], Fs, j * Fsh, Fsh), etp + "shared up gradient" + how);
  expect_near(n.g[4], cols(one.g[4], j * Fsh, Fsh), etp + "shared down gradient" + how);
}

TEST(MoeTensorParallel, SplitExpertsEqualOneProcess) {
  check(false);
}

TEST(MoeTensorParallel, SplitExpertsEqualOneProcessUnderSequenceParallelism) {
  check(true);
}

}  // namespace
}  // namespace nk
