// optim.*: AdamW with its moments in bf16 or scaled f16, and bf16 master
// weights with or without their remainder (the Kahan-style compensation).
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "ckpt/checkpoint.h"
#include "ckpt/safetensors.h"
#include "core/rng.h"
#include "ops/ops.h"
#include "test_paths.h"
#include "test_util.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

std::vector<float> f32_values(const Tensor& t) {
  Tensor f = Tensor::empty({t.numel()}, DType::F32);
  ops::convert(f, t.view({t.numel()}));
  return std::vector<float>(f.data<float>(), f.data<float>() + f.numel());
}

Tensor from(const std::vector<float>& v, DType dt = DType::F32) {
  Tensor f = Tensor::empty({int64_t(v.size())}, DType::F32);
  std::memcpy(f.raw(), v.data(), v.size() * sizeof(float));
  if (dt == DType::F32) return f;
  Tensor t = Tensor::empty({int64_t(v.size())}, dt);
  ops::convert(t, f);
  return t;
}

// Gradients spread over eight decades, as real ones are (f16 without a
// scale would lose the small ones' squares).
std::vector<float> random_grads(int64_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> g(static_cast<size_t>(n));
  for (auto& x : g) x = float(rng.normal() * std::pow(10.0, -8.0 * rng.uniform()));
  return g;
}

// One step from the same state: the f32 kernel against the same step with
// bf16 or f16 moments. The update itself is computed from the f32 moments
// before they are stored, so the weights agree to f32 rounding (the two
// kernels may contract multiply-adds differently); the stored moments differ
// by one rounding: bf16 round-to-nearest-even is within 2^-9 relative, f16's
// 11 bits within 2^-11 of m and of sqrt(v) (so 2^-10 of v), for every value
// within 2^-29 of its tensor's largest (the scale keeps those normal).
TEST(OptimPrecision, FusedStepMatchesF32Reference) {
  const int64_t n = 5000;
  const std::vector<float> g = random_grads(n, 1), g2 = random_grads(n, 2);
  std::vector<float> p0(static_cast<size_t>(n));
  Rng rng(3);
  for (auto& x : p0) x = float(rng.normal() * 0.05);
  ops::AdamWParams prm{1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 1, 1.f};
  // Reference: two f32 steps (the second from a nonzero state).
  Tensor rp = from(p0), rm = Tensor::zeros({n}, DType::F32), rv = Tensor::zeros({n}, DType::F32);
  ops::adamw_step(rp, from(g), rm, rv, prm);
  const std::vector<float> p1 = f32_values(rp), m1 = f32_values(rm), v1 = f32_values(rv);
  prm.step = 2;
  ops::adamw_step(rp, from(g2), rm, rv, prm);
  const std::vector<float> p2 = f32_values(rp), m2 = f32_values(rm), v2 = f32_values(rv);
  for (DType dt : {DType::BF16, DType::F16}) {
    // From the reference's state after step 1, rounded into dt as a load would.
    Tensor p = from(p1), m = Tensor::empty({n}, dt), v = Tensor::empty({n}, dt), scales;
    if (dt == DType::F16) {
      // m / 2^-k and sqrt(v) / 2^-j with the kernel's scales: step 1 through the kernel itself.
      scales = from({1.f, 1.f});
      Tensor q = from(p0);
      ops::fill(m, 0.f);
      ops::fill(v, 0.f);
      prm.step = 1;
      ops::adamw_step_mixed(q, Tensor(), from(g), m, v, scales, prm);
      const std::vector<float> q1 = f32_values(q);  // same formula, same inputs
      for (int64_t i = 0; i < n; ++i)
        ASSERT_NEAR(q1[size_t(i)], p1[size_t(i)], 3e-7 * (std::fabs(p1[size_t(i)]) + prm.lr)) << i;
    } else {
      ops::convert(m, from(m1));
      ops::convert(v, from(v1));
    }
    prm.step = 2;
    ops::adamw_step_mixed(p, Tensor(), from(g2), m, v, scales, prm);
    std::vector<float> gm = f32_values(m), gv = f32_values(v), gp = f32_values(p);
    if (dt == DType::F16) {
      const float sm = scales.data<float>()[0], sv = scales.data<float>()[1];
      for (auto& x : gm) x *= sm;
      for (auto& x : gv) x = (x * sv) * (x * sv);
    }
    // Unit roundoff: bf16 keeps 8 significant bits, f16 11. Step 2's moments
    // carry step 1's rounding (times beta) and add their own; f16 holds
    // sqrt(v), so v's relative error is twice its; values f16 keeps only as
    // subnormals (below 2^-29 of the largest) get an absolute floor.
    const double u = dt == DType::BF16 ? 0x1p-8 : 0x1p-11, vu = dt == DType::BF16 ? u : 2 * u;
    double max_m = 0, max_v = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t j = size_t(i);
      max_m = std::max({max_m, double(std::fabs(m1[j])), double(std::fabs(m2[j]))});
      max_v = std::max({max_v, double(v1[j]), double(v2[j])});
    }
    const double floor_m = dt == DType::F16 ? max_m * 0x1p-36 : 0;
    const double floor_v = dt == DType::F16 ? max_v * 0x1p-35 : 0;
    double worst_p = 0;
    for (int64_t i = 0; i < n; ++i) {
      const size_t j = size_t(i);
      const double bound_m = 1.01 * u * (prm.beta1 * std::fabs(m1[j]) + std::fabs(m2[j])) + floor_m;
      const double bound_v = 1.01 * vu * (prm.beta2 * v1[j] + v2[j]) + floor_v;
      EXPECT_LE(std::fabs(double(gm[j]) - m2[j]), bound_m) << dtype_name(dt) << " m[" << i << "]";
      EXPECT_LE(std::fabs(double(gv[j]) - v2[j]), bound_v) << dtype_name(dt) << " v[" << i << "]";
      // The weights: Adam's step lr m^ / sqrt(v^) moves by the moments' carried
      // error; at step 2 |m1| / sqrt(v2) <= 0.46 and the bias corrections give
      // 1.64, so at most ~0.8 u lr from m and ~0.5 u lr from v: 4 u lr is safe;
      // plus f32 rounding of the weight (the kernels may contract differently).
      EXPECT_NEAR(gp[j], p2[j], 4 * u * prm.lr + 3e-7 * (std::fabs(p2[j]) + prm.lr))
          << dtype_name(dt) << " p[" << i << "]";
      worst_p = std::max(worst_p, std::fabs(double(gp[j]) - p2[j]) / prm.lr);
    }
    std::printf("%s moments, one step from the same state: weights within %.3g lr of f32's\n",
                dtype_name(dt), worst_p);
  }
}

// The remainder joins back to the f32 pattern bit for bit, ties included.
TEST(OptimPrecision, MasterSplitJoinIsExact) {
  const int64_t n = 1 << 16;
  std::vector<float> x(static_cast<size_t>(n));
  Rng rng(7);
  for (int64_t i = 0; i < n; ++i) {
    // Random patterns of finite floats, plus exact bf16 ties (low half 0x8000).
    uint32_t u = uint32_t(rng.next_u64()) & 0xff7fffffu;
    if (i % 4 == 0) u = (u & 0xffff0000u) | 0x8000u;
    x[size_t(i)] = std::bit_cast<float>(u);
  }
  Tensor hi = Tensor::empty({n}, DType::BF16), rem = Tensor::empty({n}, DType::BF16);
  ops::bf16_master_split(hi, rem, from(x));
  Tensor back = Tensor::empty({n}, DType::F32);
  ops::bf16_master_join(back, hi, rem);
  EXPECT_EQ(0, std::memcmp(back.raw(), x.data(), size_t(n) * 4));
  // hi is the nearest bf16 (ties away from zero): within half a bf16 ulp.
  const std::vector<float> h = f32_values(hi);
  // (Normal numbers: a subnormal's ulp is absolute. Within half a bf16 ulp of
  // the largest float hi is inf, as round-to-nearest-even makes it too.)
  for (int64_t i = 0; i < n; ++i)
    if (std::fabs(x[size_t(i)]) >= 0x1p-126f && !std::isinf(h[size_t(i)])) {
      ASSERT_LE(std::fabs(h[size_t(i)] - x[size_t(i)]), std::fabs(x[size_t(i)]) * 0x1p-8f) << i;
    }
}

// 1000 updates each far below half a bf16 ulp of the weight (1e-5 against
// 2^-8 near 1): the compensated bf16 master follows the f32 master bit for
// bit (the same arithmetic on the same f32 value), the plain bf16 one never
// moves at all.
TEST(OptimPrecision, CompensatedBf16MasterTracksF32PlainDrifts) {
  const int64_t n = 4096;
  std::vector<float> p0(static_cast<size_t>(n)), g(static_cast<size_t>(n));
  Rng rng(11);
  for (auto& x : p0) x = float(0.5 + rng.uniform());
  for (auto& x : g) x = float(0.1 + rng.uniform());  // one sign: Adam's step is ~lr
  Tensor ref = from(p0), grad = from(g);
  Tensor hi = Tensor::empty({n}, DType::BF16), rem = Tensor::empty({n}, DType::BF16);
  ops::bf16_master_split(hi, rem, ref);
  // All three start from p0: the f32 master, the bf16 one with its remainder
  // (exactly p0) and the plain bf16 one (p0 rounded).
  Tensor plain = from(f32_values(hi), DType::BF16);
  const Tensor ref_start = from(p0);
  struct State {
    Tensor m, v;
  };
  auto zeros = [&] {
    return State{Tensor::zeros({n}, DType::F32), Tensor::zeros({n}, DType::F32)};
  };
  State sr = zeros(), sc = zeros(), sp = zeros();
  for (int64_t step = 1; step <= 1000; ++step) {
    ops::AdamWParams prm{1e-5f, 0.9f, 0.95f, 1e-8f, 0.f, step, 1.f};
    ops::adamw_step_mixed(ref, Tensor(), grad, sr.m, sr.v, Tensor(), prm);
    ops::adamw_step_mixed(hi, rem, grad, sc.m, sc.v, Tensor(), prm);
    ops::adamw_step_mixed(plain, Tensor(), grad, sp.m, sp.v, Tensor(), prm);
  }
  Tensor joined = Tensor::empty({n}, DType::F32);
  ops::bf16_master_join(joined, hi, rem);
  const std::vector<float> r = f32_values(ref), c = f32_values(joined), pl = f32_values(plain),
                           start = f32_values(ref_start);
  double moved = 0, err_c = 0, err_p = 0;
  for (int64_t i = 0; i < n; ++i) {
    const size_t j = size_t(i);
    moved = std::max(moved, std::fabs(double(r[j]) - start[j]));
    err_c = std::max(err_c, std::fabs(double(c[j]) - r[j]) / std::fabs(r[j]));
    err_p = std::max(err_p, std::fabs(double(pl[j]) - r[j]));
  }
  EXPECT_GT(moved, 9e-3);         // ~1000 x 1e-5
  EXPECT_LE(err_c, 0x1p-23);      // f32 precision (in fact 0)
  EXPECT_GT(err_p, 0.5 * moved);  // plain bf16 lost the updates
  std::printf(
      "1000 updates of 1e-5: f32 master moved %.4g; compensated bf16 off by %.3g "
      "relative; plain bf16 off by %.4g\n",
      moved, err_c, err_p);
}

std::string corpus_path() {
  fs::path p = fs::path(NK_BINARY_DIR) / "test_corpus.txt";
  if (!fs::exists(p)) {
    std::ofstream o(p);
    for (int i = 0; i < 400; ++i)
      o << "The quick brown fox " << i << " jumps over the lazy dog. Water is wet.\n";
  }
  return p.string();
}

TrainConfig tiny(const std::string& out, const std::vector<std::string>& extra,
                 int64_t steps = 12) {
  fs::remove_all(out);
  ConfigSchema s = train_schema();
  std::vector<std::string> kv = {"model.preset=gpt-tiny", "model.n_layer=2",
                                 "model.d_model=64",      "model.n_head=4",
                                 "model.d_ff=128",        "data.path=" + corpus_path(),
                                 "train.micro_batch=4",   "train.seq_len=32",
                                 "train.global_batch=8",  "train.steps=" + std::to_string(steps),
                                 "train.lr=3e-3",         "train.warmup_steps=10",
                                 "train.val_every=0",     "train.log_every=1000",
                                 "train.peak_tflops=1",   "train.out_dir=" + out,
                                 "train.dtype=bf16"};
  for (const std::string& e : extra) kv.push_back(e);
  return train_config_from(Config::load(s, "", kv));
}

std::string error_of(const std::vector<std::string>& kv) {
  try {
    tiny((fs::path(NK_BINARY_DIR) / "optim_bad").string(), kv);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(OptimPrecision, ConfigErrorsNameTheKey) {
  EXPECT_TRUE(test::contains(error_of({"optim.moment_dtype=x"}),
                             "optim.moment_dtype: 'x' is not one of f32, bf16, f16"))
      << error_of({"optim.moment_dtype=x"});
  EXPECT_TRUE(test::contains(error_of({"optim.master_dtype=f16"}),
                             "optim.master_dtype: 'f16' is not one of f32, bf16"));
  EXPECT_TRUE(test::contains(error_of({"optim.master_dtype=bf16", "train.dtype=f32"}),
                             "optim.master_dtype: bf16 needs train.dtype=bf16"));
  EXPECT_TRUE(test::contains(error_of({"optim.grad_dtype=bf16", "train.dtype=f32"}),
                             "optim.grad_dtype: bf16 needs train.dtype=bf16"));
  EXPECT_TRUE(test::contains(error_of({"optim.grad_dtype=bf16", "optim.moment_dtype=f16"}),
                             "optim.grad_dtype: bf16 does not go with optim.moment_dtype=f16"));
  EXPECT_TRUE(test::contains(error_of({"optim.grad_dtype=f16"}),
                             "optim.grad_dtype: 'f16' is not one of f32, bf16"));
  if (device_available(Device::CUDA)) {  // (without a GPU, train.device=cuda is refused first)
    EXPECT_TRUE(test::contains(error_of({"optim.grad_dtype=bf16", "train.device=cuda"}),
                               "optim.grad_dtype: bf16 runs on the CPU only for now"))
        << error_of({"optim.grad_dtype=bf16", "train.device=cuda"});
  }
  const TrainConfig d = tiny((fs::path(NK_BINARY_DIR) / "optim_default").string(), {});
  EXPECT_EQ(d.adamw.precision.master, DType::F32);
  EXPECT_EQ(d.adamw.precision.moments, DType::F32);
  EXPECT_TRUE(d.adamw.precision.compensation);
  EXPECT_FALSE(d.adamw.precision.reduced());
}

std::vector<double> losses(const Trainer& t) {
  std::vector<double> v;
  for (auto& s : t.history()) v.push_back(s.loss);
  return v;
}

// Bytes per parameter each setting holds after the first step, from the
// tensors themselves: the f32 master arena is gone with a bf16 master.
TEST(OptimPrecision, StateBytesPerParameter) {
  const fs::path base = fs::path(NK_BINARY_DIR) / "optim_bytes";
  struct Case {
    const char* name;
    std::vector<std::string> keys;
    double optimizer, master;  // bytes per trainable parameter
    double grads = 4;          // the arena's (bf16: plus the f32 staging, printed)
  };
  const std::vector<Case> cases = {
      {"f32 master, f32 moments (default)", {}, 8, 4},
      {"f32 master, bf16 moments", {"optim.moment_dtype=bf16"}, 4, 4},
      {"f32 master, f16 moments", {"optim.moment_dtype=f16"}, 4, 4},
      {"bf16 master + remainder, bf16 moments",
       {"optim.moment_dtype=bf16", "optim.master_dtype=bf16"},
       6,
       0},
      {"bf16 master plain, bf16 moments",
       {"optim.moment_dtype=bf16", "optim.master_dtype=bf16", "optim.master_compensation=false"},
       4,
       0},
      {"bf16 master + remainder, bf16 moments, bf16 grads",
       {"optim.moment_dtype=bf16", "optim.master_dtype=bf16", "optim.grad_dtype=bf16"},
       6,
       0,
       2}};
  for (const Case& c : cases) {
    Trainer t(tiny((base / "run").string(), c.keys, 1));
    t.run();
    const double n = double(t.model().layout().trainable_end());
    const double opt = double(t.optimizer().state_bytes()) / n;
    const double master = double(t.model().params().nbytes()) / n;
    const double weights = double(t.model().compute_params().nbytes()) / n;
    const double grads = double(t.model().grad_bytes()) / n;
    const double scratch = c.grads == 2 ? double(4 * std::min<int64_t>(AdamW::kGradChunk, n)) : 0;
    EXPECT_NEAR(opt - scratch / n, c.optimizer, 0.01) << c.name;  // f16: + 8 bytes per group
    EXPECT_EQ(master, c.master) << c.name;
    EXPECT_EQ(double(t.model().grads().nbytes()) / n, c.grads) << c.name;
    std::printf(
        "%-40s bf16 weights %.2f + f32 master %.2f + grads %.2f + optimizer %.3f = %.3f "
        "bytes/param\n",
        c.name, weights, master, grads, opt, weights + master + grads + opt);
  }
}

// 200 steps of a small GPT: bf16 moments with a compensated bf16 master
// follow the f32-state run's loss: over the last 50 steps their mean is
// within 1% of its mean, and every step within 2% (max |l - l_f32| / l_f32);
// the uncompensated run drifts well past both (mean +11.6%, max 31%).
TEST(OptimPrecision, TwoHundredStepsFollowF32Curve) {
  const fs::path base = fs::path(NK_BINARY_DIR) / "optim_200";
  auto run = [&](const char* name, const std::vector<std::string>& keys) {
    Trainer t(tiny((base / name).string(), keys, 200));
    t.run();
    return losses(t);
  };
  const std::vector<double> ref = run("f32", {});
  const std::vector<double> comp =
      run("comp", {"optim.moment_dtype=bf16", "optim.master_dtype=bf16"});
  const std::vector<double> plain = run(
      "plain",
      {"optim.moment_dtype=bf16", "optim.master_dtype=bf16", "optim.master_compensation=false"});
  const std::vector<double> f16 = run("f16", {"optim.moment_dtype=f16"});
  const std::vector<double> grads =
      run("grads", {"optim.moment_dtype=bf16", "optim.master_dtype=bf16", "optim.grad_dtype=bf16"});
  ASSERT_EQ(ref.size(), 200u);
  auto worst = [&](const std::vector<double>& l, size_t from) {
    double w = 0;
    for (size_t i = from; i < l.size(); ++i) w = std::max(w, std::fabs(l[i] - ref[i]) / ref[i]);
    return w;
  };
  auto mean_last = [](const std::vector<double>& l) {
    double s = 0;
    for (size_t i = l.size() - 50; i < l.size(); ++i) s += l[i];
    return s / 50;
  };
  std::printf(
      "step   f32-state  bf16m+bf16master(comp)  bf16m+bf16master(plain)  f16m     "
      "comp+bf16grads\n");
  for (size_t i : {0, 9, 49, 99, 149, 199})
    std::printf("%4zu   %.4f     %.4f                  %.4f                   %.4f   %.4f\n", i + 1,
                ref[i], comp[i], plain[i], f16[i], grads[i]);
  std::printf(
      "mean loss of steps 151-200: f32 %.4f, compensated %.4f, plain %.4f, f16 %.4f, "
      "compensated + bf16 grads %.4f\n",
      mean_last(ref), mean_last(comp), mean_last(plain), mean_last(f16), mean_last(grads));
  std::printf(
      "max relative loss difference to f32, steps 151-200: compensated %.4f, plain %.4f, "
      "f16 moments %.4f, compensated + bf16 grads %.4f\n",
      worst(comp, 150), worst(plain, 150), worst(f16, 150), worst(grads, 150));
  // The per-step figure is noisy: the losses near 0.15 move by a percent
  // from step to step, and any change of the kernels' rounding moves the
  // whole trajectory (measured, compensated: 0.0084 at the avx512_bf16
  // level, 0.0138 at avx2, whose bf16 products run as f32; f16 moments
  // 0.0066 / 0.0077), so one step is held to 2% and the mean of the last 50,
  // where a systematic drift shows, to 1% (measured: 0.06% at both levels;
  // the uncompensated run: 11.6%).
  auto mean_off = [&](const std::vector<double>& l) {
    return std::fabs(mean_last(l) - mean_last(ref)) / mean_last(ref);
  };
  for (const auto& [name, l] :
       {std::pair{"compensated", &comp}, {"bf16 grads", &grads}, {"f16 moments", &f16}}) {
    EXPECT_LT(mean_off(*l), 0.01) << name;
    EXPECT_LT(worst(*l, 150), 0.02) << name;
  }
  EXPECT_GT(mean_off(plain), 0.05);          // the check tells compensated from plain
  EXPECT_LT(ref.back(), ref.front() - 1.0);  // it learned
}

// Checkpoints keep the moments' dtype (the file says bf16) and load into
// either choice: bf16 moments -> an f32 run reads them widened exactly; f32
// ones -> a bf16 run holds them within bf16 rounding. A bf16 master's
// checkpoint holds the exact f32 master (compute weights joined with the
// remainder), and a run of either master dtype resumes from it.
TEST(OptimPrecision, CheckpointRoundTripAcrossDtypes) {
  const fs::path base = fs::path(NK_BINARY_DIR) / "optim_ckpt";
  const std::vector<std::string> bf16_keys = {"optim.moment_dtype=bf16", "optim.master_dtype=bf16"};
  for (bool from_bf16 : {true, false}) {
    const std::string out = (base / (from_bf16 ? "from_bf16" : "from_f32")).string();
    TrainConfig cfg = tiny(out, from_bf16 ? bf16_keys : std::vector<std::string>{});
    cfg.exit_at_step = 6;
    Trainer a(cfg);
    a.run();
    const std::vector<float> am = f32_values(a.optimizer().m_f32()),
                             av = f32_values(a.optimizer().v_f32()),
                             aw = f32_values(a.optimizer().masters_f32());
    const std::string dir = find_latest_checkpoint(cfg.checkpoint_root());
    ASSERT_FALSE(dir.empty());
    SafetensorsFile opt = SafetensorsFile::open(dir + "/optimizer.safetensors");
    EXPECT_EQ(opt.entries().front().dtype, from_bf16 ? DType::BF16 : DType::F32);
    // Load into the other choice.
    TrainConfig other = tiny(out + "_other", from_bf16 ? std::vector<std::string>{} : bf16_keys);
    LoadedTrainCheckpoint c = load_train_checkpoint(dir, other);
    EXPECT_EQ(f32_values(c.model->params()), aw) << "the f32 masters, exactly";
    AdamW b(model_arenas(*c.model),
            default_param_groups(c.model->layout(), other.adamw.weight_decay,
                                 c.model->params().numel()),
            other.adamw);
    b.load_arena_state(c.exp_avg, c.exp_avg_sq, c.state.optimizer_steps);
    const std::vector<float> bm = f32_values(b.m_f32()), bv = f32_values(b.v_f32());
    ASSERT_EQ(bm.size(), am.size());
    for (size_t i = 0; i < am.size(); ++i) {
      if (from_bf16) {  // bf16 widened: exact
        ASSERT_EQ(bm[i], am[i]) << i;
        ASSERT_EQ(bv[i], av[i]) << i;
      } else {  // rounded to bf16 (8 significant bits): half an ulp
        ASSERT_LE(std::fabs(bm[i] - am[i]), std::fabs(am[i]) * 0x1p-8f) << i;
        ASSERT_LE(std::fabs(bv[i] - av[i]), std::fabs(av[i]) * 0x1p-8f) << i;
      }
    }
    if (!from_bf16) {
      // The bf16 master taken from the f32 checkpoint is that master exactly.
      EXPECT_EQ(f32_values(b.masters_f32()), aw);
    }
    // And a run of the other choice resumes from it to the end.
    fs::remove_all(out + "_other");
    fs::create_directories(out + "_other");
    fs::copy(cfg.checkpoint_root(), other.checkpoint_root(), fs::copy_options::recursive);
    Trainer r(other);
    r.run();
    ASSERT_FALSE(r.history().empty());
    EXPECT_EQ(r.history().front().step, 7);
    EXPECT_TRUE(std::isfinite(r.history().back().loss));
    EXPECT_TRUE(fs::exists(fs::path(out + "_other") / "model" / "model.safetensors"));
  }
}

// Resume is exact with every choice: the checkpoint holds the bf16 moments
// as they are, f16 ones as exact f32 values (the same scales come back), and
// a bf16 master as its exact f32 value, which splits back into the same
// weights and remainder.
TEST(OptimPrecision, ResumeIsExactWithEveryChoice) {
  const fs::path base = fs::path(NK_BINARY_DIR) / "optim_resume";
  const std::vector<std::vector<std::string>> choices = {
      {"optim.moment_dtype=bf16", "optim.master_dtype=bf16"},
      {"optim.moment_dtype=bf16", "optim.master_dtype=bf16", "optim.master_compensation=false"},
      {"optim.moment_dtype=f16"},
      {"optim.moment_dtype=f16", "optim.master_dtype=bf16"},
      {"optim.moment_dtype=bf16", "optim.master_dtype=bf16", "optim.grad_dtype=bf16"}};
  for (const auto& keys : choices) {
    Trainer straight(tiny((base / "straight").string(), keys));
    straight.run();
    TrainConfig cfg = tiny((base / "split").string(), keys);
    cfg.exit_at_step = 5;
    Trainer first(cfg);
    first.run();
    cfg.exit_at_step = 0;
    Trainer second(cfg);
    second.run();
    std::vector<double> joined = losses(first), rest = losses(second);
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, losses(straight)) << keys.back();
    EXPECT_EQ(f32_values(second.optimizer().masters_f32()),
              f32_values(straight.optimizer().masters_f32()))
        << keys.back();
  }
}

}  // namespace
}  // namespace nk
