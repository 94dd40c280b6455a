// AdamW: reference step and the op on every backend vs a hand-written scalar
// step in double (PyTorch semantics), param_copy, odd sizes, and thread-count
// determinism; the reduced-precision step and the bf16 master's split and
// join on every backend vs host computations of what ops.h documents.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iterator>

#include "core/parallel.h"
#include "ops/cpu_isa.h"
#include "ops/cpu_kernels.h"
#include "ops/op_harness.h"
#include "ops/ops.h"
#include "ops/ref/adamw.h"

namespace nk {
namespace {

using namespace test;  // the op harness: make, randn, expect_close, ...
using Vec = std::vector<double>;

struct State {
  Vec p, m, v;
};

// One PyTorch AdamW step, written out independently of ref::adamw_step.
void hand_step(State& s, const Vec& grad, const ops::AdamWParams& h) {
  for (size_t i = 0; i < s.p.size(); ++i) {
    double g = grad[i] * double(h.grad_scale);
    s.p[i] -= double(h.lr) * double(h.weight_decay) * s.p[i];
    s.m[i] = double(h.beta1) * s.m[i] + (1 - double(h.beta1)) * g;
    s.v[i] = double(h.beta2) * s.v[i] + (1 - double(h.beta2)) * g * g;
    double mhat = s.m[i] / (1 - std::pow(double(h.beta1), double(h.step)));
    double vhat = s.v[i] / (1 - std::pow(double(h.beta2), double(h.step)));
    s.p[i] -= double(h.lr) * mhat / (std::sqrt(vhat) + double(h.eps));
  }
}

ops::AdamWParams params(int64_t step) {
  ops::AdamWParams h{};
  h.lr = 1e-2f;
  h.beta1 = 0.9f;
  h.beta2 = 0.95f;
  h.eps = 1e-8f;
  h.weight_decay = 0.1f;
  h.step = step;
  h.grad_scale = 0.5f;
  return h;
}

TEST(AdamWRef, MatchesHandWrittenStep) {
  const int64_t n = 40;
  State s{randn(n, 1), Vec(n, 0.0), Vec(n, 0.0)};
  State r = s;
  for (int64_t step = 1; step <= 3; ++step) {
    Vec g = randn(n, 10 + step);
    auto h = params(step);
    hand_step(s, g, h);
    ref::adamw_step<double>(r.p.data(), g.data(), r.m.data(), r.v.data(), n, h.lr, h.beta1, h.beta2,
                            h.eps, h.weight_decay, step, h.grad_scale);
  }
  expect_close(r.p, s.p, {1e-12, 1e-12}, "p");
  expect_close(r.m, s.m, {1e-12, 1e-12}, "m");
  expect_close(r.v, s.v, {1e-12, 1e-12}, "v");
}

class AdamWFast : public BackendTest {};
NK_INSTANTIATE_BACKENDS(AdamWFast);

void fast_vs_hand(Device dev, int64_t n, DType copy_dt) {
  SCOPED_TRACE(testing::Message() << "n=" << n << " copy=" << dtype_name(copy_dt));
  State s{rounded(randn(n, 2), DType::F32), rounded(randn(n, 3, 0.01), DType::F32),
          rounded(Vec(n, 1e-4), DType::F32)};  // nonzero moments: a mid-training state
  Tensor p = make({n}, DType::F32, s.p, dev), m = make({n}, DType::F32, s.m, dev),
         v = make({n}, DType::F32, s.v, dev), copy = make({n}, copy_dt, Vec(n), dev);
  for (int64_t step = 1; step <= 3; ++step) {
    Vec g = rounded(randn(n, 20 + step), DType::F32);
    auto h = params(step);
    ops::adamw_step(p, make({n}, DType::F32, g, dev), m, v, h, copy);
    hand_step(s, g, h);
  }
  // fp32 state over three steps: a few ulp of each update.
  expect_close(values(p), s.p, {1e-5, 1e-6}, "p");
  expect_close(values(m), s.m, {1e-5, 1e-7}, "m");
  expect_close(values(v), s.v, {1e-5, 1e-9}, "v");
  // The copy holds exactly the new params rounded to its dtype.
  expect_close(values(copy), rounded(values(p), copy_dt), {0, 0}, "param_copy");
}

NK_COVERS(AdamWFast, MatchesHandWrittenStep, adamw_step);
TEST_P(AdamWFast, MatchesHandWrittenStep) {
  for (int64_t n : {1, 15, 16, 17, 1000, 100003}) {
    fast_vs_hand(dev(), n, DType::BF16);
    fast_vs_hand(dev(), n, DType::F32);
  }
}

TEST_P(AdamWFast, WithoutCopyAndBitIdenticalAcrossThreadCounts) {
  const int64_t n = 70001;
  Vec p0 = randn(n, 5), g = randn(n, 6);
  std::vector<Vec> results;
  const int saved = num_threads();
  for (int threads : {1, 2, 3}) {
    set_num_threads(threads);
    Tensor p = make({n}, DType::F32, p0, dev()), m = make({n}, DType::F32, Vec(n), dev()),
           v = make({n}, DType::F32, Vec(n), dev());
    ops::adamw_step(p, make({n}, DType::F32, g, dev()), m, v, params(1));
    results.push_back(values(p));
  }
  set_num_threads(saved);
  EXPECT_EQ(results[0], results[1]);
  EXPECT_EQ(results[0], results[2]);
}

// The AVX2 and AVX-512 copies of adamw_step spell out the same operations
// in the same order: every level this CPU has gives the same bits (masked
// tails included), so a run's optimizer does not move with NK_CPU_ISA.
TEST(AdamWLevels, EveryLevelGivesTheSameBits) {
  const auto levels = ops::cpu_isas_available();
  if (levels.size() < 2) GTEST_SKIP() << "one CPU ISA level here: " << ops::cpu_isa_summary();
  for (int64_t n : {1, 7, 8, 9, 1000, 70001}) {
    std::vector<Vec> ps, ms, vs;
    for (ops::CpuIsa isa : levels) {
      Tensor p = make({n}, DType::F32, randn(n, 7), kHost),
             m = make({n}, DType::F32, randn(n, 8, 0.01), kHost),
             v = make({n}, DType::F32, Vec(n, 1e-4), kHost);
      for (int64_t step = 1; step <= 3; ++step)
        ops::cpu_kernels_for(isa).adamw_step(p, make({n}, DType::F32, randn(n, 9 + step), kHost), m,
                                             v, params(step), Tensor());
      ps.push_back(values(p));
      ms.push_back(values(m));
      vs.push_back(values(v));
    }
    for (size_t i = 1; i < levels.size(); ++i) {
      SCOPED_TRACE(testing::Message() << "n=" << n << " " << ops::cpu_isa_name(levels[i])
                                      << " against " << ops::cpu_isa_name(levels[0]));
      EXPECT_EQ(ps[i], ps[0]);
      EXPECT_EQ(ms[i], ms[0]);
      EXPECT_EQ(vs[i], vs[0]);
    }
  }
}

TEST_P(AdamWFast, RejectsMismatchedSizes) {
  Tensor p = Tensor::empty({8}, DType::F32, dev()), g = Tensor::empty({7}, DType::F32, dev());
  Tensor m = Tensor::empty({8}, DType::F32, dev()), v = Tensor::empty({8}, DType::F32, dev());
  EXPECT_THROW(ops::adamw_step(p, g, m, v, params(1)), InternalError);
}

// ---- adamw_step_mixed and the bf16 master ----

// A bf16 tensor on `device` holding raw 16-bit patterns (a master's hi half
// or its remainder).
Tensor bits_tensor(const std::vector<uint16_t>& bits, Device device) {
  Tensor t = Tensor::empty({int64_t(bits.size())}, DType::BF16);
  for (size_t i = 0; i < bits.size(); ++i) t.data<bf16>()[i].bits = bits[i];
  return to_device(t, device);
}

std::vector<uint16_t> bits_of(const Tensor& t) {
  const Tensor h = to_host(t);
  std::vector<uint16_t> out(size_t(h.numel()));
  for (size_t i = 0; i < out.size(); ++i) out[i] = h.data<bf16>()[i].bits;
  return out;
}

// ops.h's split of an f32 pattern: hi rounded to nearest with ties away from
// zero (NaN kept NaN), the remainder its low 16 bits; and the join back.
void split_bits(uint32_t u, uint16_t& hi, uint16_t& lo) {
  lo = uint16_t(u);
  hi =
      (u & 0x7fffffffu) > 0x7f800000u ? uint16_t((u >> 16) | 0x40u) : uint16_t((u + 0x8000u) >> 16);
}
uint32_t join_bits(uint16_t hi, uint16_t lo) {
  uint32_t u = (uint32_t(hi) << 16) | lo;
  return lo & 0x8000u ? u - 0x10000u : u;
}

enum class Master { F32WithCopy, Bf16Remainder, Bf16Plain };

// One adamw_step_mixed state on a device.
struct Mixed {
  Tensor master, remainder, m, v, scales, copy;
};

// The f32 value of each weight as the step reads it.
Vec master_values(const Mixed& s) {
  if (!s.remainder.defined()) return values(s.master);
  const std::vector<uint16_t> hi = bits_of(s.master), lo = bits_of(s.remainder);
  Vec out(hi.size());
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::bit_cast<float>(join_bits(hi[i], lo[i]));
  return out;
}

// m and sqrt(v) as the step reads them: f16 holds m / scales[0] and
// sqrt(v) / scales[1]; f32 and bf16 hold m and v themselves.
void read_moments(const Mixed& s, Vec& m, Vec& root, double& sm, double& sv) {
  m = values(s.m);
  root = values(s.v);
  sm = sv = 1;
  if (s.m.dtype() == DType::F16) {
    const Vec sc = values(s.scales);
    sm = sc[0];
    sv = sc[1];
    for (double& x : m) x *= sm;
    for (double& x : root) x *= sv;
  } else {
    for (double& x : root) x = std::sqrt(x);
  }
}

Mixed mixed_state(Device dev, int64_t n, DType mdt, Master kind) {
  Mixed s;
  const Vec p0 = randn(n, 41, 0.05);
  if (kind == Master::F32WithCopy) {
    s.master = make({n}, DType::F32, p0, dev);
    s.copy = Tensor::empty({n}, DType::BF16, dev);
  } else {
    s.master = make({n}, DType::BF16, p0, dev);
    if (kind == Master::Bf16Remainder) {
      Rng r(42);  // any 16 bits: the joined value is some f32 near p0
      std::vector<uint16_t> lo(static_cast<size_t>(n));
      for (auto& x : lo) x = uint16_t(r.next_u64());
      s.remainder = bits_tensor(lo, dev);
    }
  }
  Vec m = randn(n, 43, 1e-3), root = randn(n, 44, 1e-3);
  for (double& x : root) x = std::fabs(x);
  if (mdt == DType::F16) {
    const double scale = 0x1p-10;  // stored values of order 1
    for (double& x : m) x /= scale;
    for (double& x : root) x /= scale;
    s.m = make({n}, mdt, m, dev);
    s.v = make({n}, mdt, root, dev);
    s.scales = make({2}, DType::F32, {scale, scale}, dev);
  } else {
    for (double& x : root) x *= x;
    s.m = make({n}, mdt, m, dev);
    s.v = make({n}, mdt, root, dev);
  }
  return s;
}

// Two steps, each checked against a step in double from the state the
// kernel stored before it (so rounding does not compound). Tolerances, as
// relative errors: the f32 arithmetic, 2^-20 (16 ulps) of the sizes of the
// terms summed (the weight and the update; b1 m and (1 - b1) g); each
// store's rounding to nearest, half an ulp: at most 2^-8 of the value for
// bf16 and 2^-11 for f16 (whose values below 2^-14 times the scale are
// subnormal: half of 2^-24 times the scale, absolute). f16 holds sqrt(v), so
// its root is what is compared. The f16 scales must be the powers of two
// that put the largest new |m| and sqrt(v) in [2^14, 2^15).
void mixed_vs_host(Device dev, DType mdt, Master kind) {
  SCOPED_TRACE(testing::Message() << "moments " << dtype_name(mdt) << " master "
                                  << (kind == Master::F32WithCopy     ? "f32 + bf16 copy"
                                      : kind == Master::Bf16Remainder ? "bf16 + remainder"
                                                                      : "bf16"));
  const int64_t n = 70001;  // several threads' chunks and a ragged vector tail
  Mixed s = mixed_state(dev, n, mdt, kind);
  const double f32_rel = 0x1p-20;
  const double store_rel = mdt == DType::F32 ? 0 : mdt == DType::BF16 ? 0x1p-8 : 0x1p-11;
  for (int64_t step = 3; step <= 4; ++step) {
    SCOPED_TRACE(testing::Message() << "step " << step);
    const ops::AdamWParams h = params(step);
    const Vec g = rounded(randn(n, 50 + step, 1e-3), DType::F32);
    Vec p = master_values(s), m, root;
    double sm, sv;
    read_moments(s, m, root, sm, sv);

    // m_mag, upd_mag: the sizes of the terms m' and the update sum, which
    // bound f32's error where they cancel.
    Vec want_p(n), want_m(n), want_root(n), m_mag(n), upd_mag(n);
    const double b1 = h.beta1, b2 = h.beta2, lr = h.lr;
    const double bc1 = 1 - std::pow(b1, double(step)), bc2 = 1 - std::pow(b2, double(step));
    double max_m = 0, max_root = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double gi = g[i] * double(h.grad_scale);
      want_m[i] = b1 * m[i] + (1 - b1) * gi;
      want_root[i] = std::sqrt(b2 * root[i] * root[i] + (1 - b2) * gi * gi);
      m_mag[i] = b1 * std::fabs(m[i]) + (1 - b1) * std::fabs(gi);
      const double den = want_root[i] / std::sqrt(bc2) + double(h.eps);
      upd_mag[i] = lr * (m_mag[i] / bc1) / den;
      want_p[i] = p[i] * (1 - lr * double(h.weight_decay)) - lr * (want_m[i] / bc1) / den;
      max_m = std::max(max_m, std::fabs(want_m[i]));
      max_root = std::max(max_root, want_root[i]);
    }

    ops::adamw_step_mixed(s.master, s.remainder, make({n}, DType::F32, g, dev), s.m, s.v, s.scales,
                          h, s.copy);

    const Vec got_p = master_values(s);
    Vec got_m, got_root;
    read_moments(s, got_m, got_root, sm, sv);
    if (mdt == DType::F16) {
      for (double sc : {sm, sv}) {
        int e = 0;
        EXPECT_EQ(std::frexp(sc, &e), 0.5) << "scale " << sc << " is not a power of two";
      }
      EXPECT_TRUE(max_m / sm >= 0x1p14 && max_m / sm < 0x1p15) << max_m << " / " << sm;
      EXPECT_TRUE(max_root / sv >= 0x1p14 && max_root / sv < 0x1p15) << max_root << " / " << sv;
    }
    const double sub_m = mdt == DType::F16 ? 0x1p-25 * sm : 0,
                 sub_v = mdt == DType::F16 ? 0x1p-25 * sv : 0;
    const double master_rel = kind == Master::Bf16Plain ? 0x1p-8 : 0;
    Vec slack_p(n), slack_m(n), slack_root(n);
    for (int64_t i = 0; i < n; ++i) {
      slack_p[i] = f32_rel * (std::fabs(p[i]) + upd_mag[i]) + master_rel * std::fabs(want_p[i]);
      slack_m[i] = f32_rel * m_mag[i] + store_rel * std::fabs(want_m[i]) + sub_m;
      slack_root[i] = (f32_rel + store_rel) * want_root[i] + sub_v;
    }
    expect_close(got_p, want_p, {0, 0}, "master", slack_p);
    expect_close(got_m, want_m, {0, 0}, "m", slack_m);
    expect_close(got_root, want_root, {0, 0}, "sqrt(v)", slack_root);
    if (s.copy.defined()) {  // exactly the new master rounded to bf16
      expect_close(values(s.copy), rounded(got_p, DType::BF16), {0, 0}, "param_copy");
    }
  }
}

NK_COVERS(AdamWFast, MixedStepMatchesHostStep, adamw_step_mixed);
TEST_P(AdamWFast, MixedStepMatchesHostStep) {
  for (DType mdt : {DType::F32, DType::BF16, DType::F16})
    for (Master kind : {Master::F32WithCopy, Master::Bf16Remainder, Master::Bf16Plain})
      mixed_vs_host(dev(), mdt, kind);
}

// Split and join bit for bit as ops.h states them, on random finite
// patterns, exact ties (low half 0x8000) and the edges: zeros, subnormals,
// infinities, the largest float (whose hi rounds to infinity) and NaN (whose
// hi stays NaN; its join is some NaN).
NK_COVERS(AdamWFast, MasterSplitJoinFollowTheBitRule, bf16_master_split, bf16_master_join);
TEST_P(AdamWFast, MasterSplitJoinFollowTheBitRule) {
  const int64_t n = (1 << 16) + 3;
  std::vector<uint32_t> x(static_cast<size_t>(n));
  Rng r(9);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t u = uint32_t(r.next_u64()) & 0xff7fffffu;  // exponent never all ones
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;
    x[size_t(i)] = u;
  }
  const uint32_t edges[] = {0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, 0x7f800000u,
                            0xff800000u, 0x7f7fffffu, 0x7fc08000u, 0xffffffffu};
  for (size_t i = 0; i < std::size(edges); ++i) x[i * 7919] = edges[i];
  Tensor f = Tensor::empty({n}, DType::F32);
  std::memcpy(f.raw(), x.data(), x.size() * 4);
  f = to_device(f, dev());

  Tensor hi = Tensor::empty({n}, DType::BF16, dev()), lo = Tensor::empty({n}, DType::BF16, dev());
  ops::bf16_master_split(hi, lo, f);
  Tensor hi_only = Tensor::empty({n}, DType::BF16, dev());
  ops::bf16_master_split(hi_only, Tensor(), f);
  const std::vector<uint16_t> got_hi = bits_of(hi), got_lo = bits_of(lo);
  EXPECT_EQ(bits_of(hi_only), got_hi);

  Tensor joined = Tensor::empty({n}, DType::F32, dev()), widened = joined;
  ops::bf16_master_join(joined, hi, lo);
  widened = Tensor::empty({n}, DType::F32, dev());
  ops::bf16_master_join(widened, hi, Tensor());  // a plain bf16 master
  const Tensor hj = to_host(joined), hw = to_host(widened);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 5; ++i) {
    const uint32_t u = x[size_t(i)];
    uint16_t want_hi, want_lo;
    split_bits(u, want_hi, want_lo);
    const uint32_t back = std::bit_cast<uint32_t>(hj.data<float>()[i]);
    const bool nan = (u & 0x7fffffffu) > 0x7f800000u;
    const bool ok = got_hi[size_t(i)] == want_hi && got_lo[size_t(i)] == want_lo &&
                    (nan ? std::isnan(std::bit_cast<float>(back)) : back == u) &&
                    std::bit_cast<uint32_t>(hw.data<float>()[i]) == uint32_t(want_hi) << 16;
    if (!ok) {
      ++bad;
      ADD_FAILURE() << std::hex << "x[" << std::dec << i << "] = 0x" << std::hex << u << ": hi 0x"
                    << got_hi[size_t(i)] << " (want 0x" << want_hi << "), lo 0x"
                    << got_lo[size_t(i)] << " (want 0x" << want_lo << "), joined 0x" << back
                    << ", widened 0x" << std::bit_cast<uint32_t>(hw.data<float>()[i]);
    }
  }
  EXPECT_EQ(bad, 0);
  EXPECT_EQ(join_bits(0x3f80, 0x8000), 0x3f7f8000u);  // the rule itself: hi was rounded up
}

// adamw_step_mixed's AVX2 and AVX-512 loops spell out the same operations
// in the same order: every level this CPU has, and every thread count, give
// the same bits for every moment dtype and master kind (ragged tails, the
// f16 scales' measuring pass included).
TEST(AdamWLevels, MixedStepGivesTheSameBitsOnEveryLevelAndThreadCount) {
  const auto levels = ops::cpu_isas_available();
  const int saved = num_threads();
  for (DType mdt : {DType::F32, DType::BF16, DType::F16})
    for (Master kind : {Master::F32WithCopy, Master::Bf16Remainder, Master::Bf16Plain})
      for (int64_t n : {int64_t(1), int64_t(7), int64_t(9), int64_t(70001)}) {
        std::vector<std::vector<Vec>> runs;
        std::vector<std::string> names;
        for (ops::CpuIsa isa : levels)
          for (int threads : {1, 3}) {
            set_num_threads(threads);
            Mixed s = mixed_state(kHost, n, mdt, kind);
            for (int64_t step = 3; step <= 4; ++step)
              ops::cpu_kernels_for(isa).adamw_step_mixed(
                  s.master, s.remainder, make({n}, DType::F32, randn(n, 60 + step, 1e-3), kHost),
                  s.m, s.v, s.scales, params(step), s.copy);
            Vec m, root;
            double sm, sv;
            read_moments(s, m, root, sm, sv);
            runs.push_back({master_values(s), m, root, s.copy.defined() ? values(s.copy) : Vec(),
                            Vec{sm, sv}});
            names.push_back(std::string(ops::cpu_isa_name(isa)) + " on " + std::to_string(threads) +
                            " threads");
          }
        for (size_t i = 1; i < runs.size(); ++i) {
          SCOPED_TRACE(testing::Message()
                       << "moments " << dtype_name(mdt) << " master kind " << int(kind)
                       << " n=" << n << ": " << names[i] << " against " << names[0]);
          EXPECT_EQ(runs[i], runs[0]);
        }
      }
  set_num_threads(saved);
}

}  // namespace
}  // namespace nk
