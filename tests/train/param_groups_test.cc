// Parameter groups and frozen parameters.
//
// - The default groups make exactly today's two fused AdamW passes (decayed
//   matrices, then vectors without decay), bit for bit.
// - A group's lr_scale and owned shard are honoured; bad groups are refused.
// - Frozen parameters: laid out last, no gradient, no optimizer state, values
//   unchanged by training, and every trainable parameter ends up bit for bit
//   where a run with nothing frozen puts it when the frozen gradients are
//   zeroed before each step and the frozen updates undone after it. The clip
//   norm is summed in the same order in both runs (parameter by parameter, by
//   name: the two arenas are laid out differently, so their own fixed-chunk
//   sums could differ in the last bit), and undoing the update also undoes the
//   frozen weights' decay, so weight decay stays on in both.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "core/rng.h"
#include "model/tiny_config.h"
#include "test_util.h"
#include "train/adamw.h"
#include "train/freeze.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;

Tensor copy_of(const Tensor& t) {
  Tensor c = Tensor::empty(t.shape(), t.dtype());
  std::memcpy(c.raw(), t.raw(), t.nbytes());
  return c;
}

bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void fill_random(Tensor t, uint64_t seed, double scale = 1.0) {
  Rng r(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = float(r.normal() * scale);
}

// The view of parameter `name` inside one of the model's arenas.
Tensor view(const Transformer& m, const Tensor& arena, const std::string& name) {
  return ParamLayout::view(arena, m.layout().find(name));
}

TEST(ParamGroups, DefaultGroupsFollowTheLayout) {
  const ModelConfig cfg = test::tiny_config(false, 50, 16);
  Transformer all(cfg, DType::F32, 1);
  const ParamLayout& l = all.layout();
  EXPECT_EQ(l.trainable_end(), l.total());
  EXPECT_EQ(all.grads().numel(), l.total());
  std::vector<ParamGroup> g = default_param_groups(l, 0.1);
  ASSERT_EQ(g.size(), 2u);
  EXPECT_EQ(g[0].name, "decay");
  EXPECT_EQ(g[0].begin, 0);
  EXPECT_EQ(g[0].end, l.decay_end());
  EXPECT_EQ(g[0].weight_decay, 0.1);
  EXPECT_EQ(g[1].name, "no_decay");
  EXPECT_EQ(g[1].begin, l.decay_end());
  EXPECT_EQ(g[1].end, l.total());
  EXPECT_EQ(g[1].weight_decay, 0.0);
  for (const ParamGroup& x : g) {
    EXPECT_TRUE(x.trainable);
    EXPECT_EQ(x.shard_begin, x.begin);
    EXPECT_EQ(x.shard_end, x.end);
  }

  // wte (a matrix) and the first layer's LayerNorm (vectors) frozen.
  const std::vector<std::string> frozen = {"wte", "h.0.ln1.weight", "h.0.ln1.bias"};
  Transformer part(cfg, DType::F32, 1, ParamInit::Random, frozen);
  const ParamLayout& f = part.layout();
  EXPECT_EQ(f.total(), l.total());
  int64_t trainable = 0;
  for (size_t i = 0; i < f.params().size(); ++i) {
    const ParamInfo& p = f.params()[i];
    // The same order of parameters, whatever is frozen: it seeds their values.
    EXPECT_EQ(p.name, l.params()[i].name);
    const bool is_frozen = std::count(frozen.begin(), frozen.end(), p.name) > 0;
    EXPECT_EQ(p.trainable, !is_frozen) << p.name;
    if (is_frozen) {
      EXPECT_GE(p.offset, f.trainable_end()) << p.name;
    } else {
      EXPECT_LE(p.offset + p.numel(), p.decay ? f.decay_end() : f.trainable_end()) << p.name;
      EXPECT_GE(p.offset, p.decay ? 0 : f.decay_end()) << p.name;
      trainable += (p.numel() + 15) / 16 * 16;
    }
  }
  EXPECT_EQ(f.trainable_end(), trainable);
  EXPECT_EQ(part.grads().numel(), f.trainable_end());
  g = default_param_groups(f, 0.1);
  ASSERT_EQ(g.size(), 3u);
  EXPECT_EQ(g[1].end, f.trainable_end());
  EXPECT_EQ(g[2].name, "frozen");
  EXPECT_FALSE(g[2].trainable);
  EXPECT_EQ(g[2].begin, f.trainable_end());
  EXPECT_EQ(g[2].end, f.total());
  AdamW opt(part, AdamWConfig{});
  EXPECT_EQ(opt.state_size(), f.trainable_end());
  EXPECT_TRUE(opt.state_mirrors_arenas());
  EXPECT_TRUE(
      contains(error_of([&] { Transformer(cfg, DType::F32, 1, ParamInit::Zeros, {"wtf"}); }),
               "no parameter named 'wtf' to freeze"));
}

// AdamW over the default groups is the two fused calls it was before groups.
TEST(ParamGroups, DefaultGroupsAreTodaysTwoPasses) {
  for (DType dt : {DType::F32, DType::BF16}) {
    SCOPED_TRACE(dtype_name(dt));
    Transformer model(test::tiny_config(true, 50, 16), dt, 3);
    AdamWConfig cfg;
    cfg.weight_decay = 0.1;
    AdamW opt(model, cfg);
    const int64_t n = model.layout().total(), split = model.layout().decay_end();
    Tensor p = copy_of(model.params()), m = Tensor::zeros({n}, DType::F32);
    Tensor v = Tensor::zeros({n}, DType::F32), c = copy_of(model.compute_params());
    for (int64_t step = 1; step <= 3; ++step) {
      fill_random(model.grads(), uint64_t(step), 0.1);
      opt.step(1e-3 * double(step), 0.7f);
      auto run = [&](int64_t b, int64_t e, double wd) {
        ops::AdamWParams ap{float(1e-3 * double(step)), 0.9f, 0.95f, 1e-8f, float(wd), step, 0.7f};
        auto part = [&](const Tensor& t) { return t.narrow0(b, e - b); };
        ops::adamw_step(part(p), part(model.grads()), part(m), part(v), ap,
                        dt == DType::F32 ? Tensor() : part(c));
      };
      run(0, split, 0.1);
      run(split, n, 0.0);
      EXPECT_TRUE(same_bytes(model.params(), p));
      EXPECT_TRUE(same_bytes(opt.m(), m));
      EXPECT_TRUE(same_bytes(opt.v(), v));
      if (dt == DType::BF16) {
        EXPECT_TRUE(same_bytes(model.compute_params(), c));
      }
    }
  }
}

// A group's learning-rate multiplier applies, and only its owned shard is
// updated and has state; a frozen group is never touched.
TEST(ParamGroups, LrScaleAndOwnedShard) {
  const int64_t n = 96;
  Tensor params = Tensor::empty({n}, DType::F32), grads = Tensor::empty({n}, DType::F32);
  fill_random(params, 1);
  fill_random(grads, 2);
  const Tensor before = copy_of(params);
  ParamGroup g0{"scaled", 0, 48, 0.5, 0.1, true, 16, 40};
  ParamGroup g1{"frozen", 48, 80, 1.0, 0.0, false, 48, 80};
  ParamGroup g2{"whole", 80, 96, 1.0, 0.0, true, 80, 96};
  AdamW opt({params, grads, Tensor()}, {g0, g1, g2}, AdamWConfig{});
  EXPECT_EQ(opt.state_size(), 24 + 16);
  EXPECT_FALSE(opt.state_mirrors_arenas());
  opt.step(1e-2, 1.f);

  Tensor want = copy_of(before), m = Tensor::zeros({n}, DType::F32), v = copy_of(m);
  auto manual = [&](int64_t b, int64_t e, float lr, float wd) {
    ops::adamw_step(want.narrow0(b, e - b), grads.narrow0(b, e - b), m.narrow0(b, e - b),
                    v.narrow0(b, e - b), {lr, 0.9f, 0.95f, 1e-8f, wd, 1, 1.f});
  };
  manual(16, 40, float(1e-2 * 0.5), 0.1f);
  manual(80, 96, float(1e-2), 0.f);
  EXPECT_TRUE(same_bytes(params, want));
  EXPECT_TRUE(same_bytes(params.narrow0(0, 16), before.narrow0(0, 16)));
  EXPECT_TRUE(same_bytes(params.narrow0(40, 40), before.narrow0(40, 40)));
  EXPECT_TRUE(same_bytes(opt.m().narrow0(0, 24), m.narrow0(16, 24)));
  EXPECT_TRUE(same_bytes(opt.m().narrow0(24, 16), m.narrow0(80, 16)));
}

// ZeRO-1's groups: the default groups cut at the buckets, each cut owning one
// rank's block. Over all ranks the owned ranges tile the trainable arena once,
// each with its group's settings, and the frozen group stays whole.
TEST(ParamGroups, ShardedGroupsTileTheArenaOverRanks) {
  Transformer m(test::tiny_config(true, 50, 16), DType::F32, 1, ParamInit::Random, {"wte"});
  const ParamLayout& layout = m.layout();
  const auto defaults = default_param_groups(layout, 0.1);
  const auto buckets = parallel::plan_grad_buckets(layout, m.config().n_layer, 5000);
  for (int64_t n : {1, 2, 3}) {
    std::vector<int> owners(size_t(layout.trainable_end()), 0);
    for (int64_t r = 0; r < n; ++r) {
      auto groups = shard_param_groups(defaults, parallel::owned_shards(buckets, n, r));
      for (size_t i = 1; i < groups.size(); ++i) EXPECT_LE(groups[i - 1].end, groups[i].begin);
      for (const ParamGroup& g : groups) {
        if (!g.trainable) {
          EXPECT_EQ(g.begin, layout.trainable_end());
          EXPECT_EQ(g.end, layout.total());
          continue;
        }
        EXPECT_EQ(g.weight_decay, g.end <= layout.decay_end() ? 0.1 : 0.0) << g.name;
        EXPECT_GT(g.shard_size(), 0);
        for (int64_t k = g.shard_begin; k < g.shard_end; ++k) ++owners[size_t(k)];
      }
      // The groups are accepted by the optimizer, whose state is this rank's share.
      AdamW opt(model_arenas(m), groups, AdamWConfig{});
      int64_t share = 0;
      for (const ParamGroup& g : groups) share += g.trainable ? g.shard_size() : 0;
      EXPECT_EQ(opt.state_size(), share);
    }
    EXPECT_EQ(std::count(owners.begin(), owners.end(), 1), layout.trainable_end()) << n << " ranks";
  }
}

// Moments laid out like the gradient arena (as a checkpoint is read back) are
// taken group shard by group shard.
TEST(ParamGroups, LoadArenaStateTakesEachShard) {
  const int64_t n = 96;
  Tensor params = Tensor::zeros({n}, DType::F32), grads = Tensor::zeros({n}, DType::F32);
  ParamGroup g0{"a", 0, 48, 1.0, 0.0, true, 16, 40};
  ParamGroup g1{"b", 48, 96, 1.0, 0.0, true, 60, 96};
  AdamW opt({params, grads, Tensor()}, {g0, g1}, AdamWConfig{});
  Tensor m = Tensor::empty({n}, DType::F32), v = Tensor::empty({n}, DType::F32);
  fill_random(m, 3);
  fill_random(v, 4);
  opt.load_arena_state(m, v, 7);
  EXPECT_EQ(opt.steps_done(), 7);
  AdamW& o = opt;
  EXPECT_TRUE(same_bytes(o.m().narrow0(0, 24), m.narrow0(16, 24)));
  EXPECT_TRUE(same_bytes(o.m().narrow0(24, 36), m.narrow0(60, 36)));
  EXPECT_TRUE(same_bytes(o.v().narrow0(24, 36), v.narrow0(60, 36)));
  EXPECT_THROW(
      {  // moments come from the checkpoint loader, not users: a bad one is an InternalError
        try {
          opt.load_arena_state(m.narrow0(0, 90), v, 1);
        } catch (const InternalError& e) {
          EXPECT_TRUE(contains(e.what(), "not laid out like the grads arena")) << e.what();
          throw;
        }
      },
      InternalError);
}

TEST(ParamGroups, BadGroupsAreRefused) {
  Tensor params = Tensor::zeros({64}, DType::F32), grads = Tensor::zeros({32}, DType::F32);
  auto make = [&](std::vector<ParamGroup> g) {
    try {  // groups come from code, not users: a bad one is an InternalError
      AdamW opt({params, grads, Tensor()}, g, AdamWConfig{});
    } catch (const InternalError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_TRUE(contains(make({{"a", 0, 20, 1, 0, true, 0, 20}, {"b", 16, 32, 1, 0, true, 16, 32}}),
                       "groups 'a' and 'b' overlap"));
  EXPECT_TRUE(contains(make({{"a", 60, 70, 1, 0, false, 60, 70}}),
                       "group 'a' [60, 70) lies outside the params arena [0, 64)"));
  EXPECT_TRUE(contains(make({{"a", 0, 16, 1, 0, true, 8, 24}}),
                       "group 'a': shard [8, 24) lies outside the group [0, 16)"));
  EXPECT_TRUE(contains(make({{"a", 16, 48, 1, 0, true, 16, 48}}),
                       "trainable group 'a' [16, 48) lies outside the grads arena [0, 32)"));
  EXPECT_TRUE(contains(make({{"a", 0, 16, -1, 0, true, 0, 16}}), "must be >= 0"));
  // A frozen group may lie beyond the gradients: it has none.
  AdamW ok({params, grads, Tensor()},
           {{"t", 0, 32, 1, 0, true, 0, 32}, {"f", 32, 64, 1, 0, false, 32, 64}}, AdamWConfig{});
  EXPECT_EQ(ok.state_size(), 32);
}

// Sum of squares of the gradients of `names`, one parameter at a time in the
// order given: the same arithmetic whatever the arena's layout.
double grad_norm(Transformer& m, const std::vector<std::string>& names) {
  double s = 0;
  for (const std::string& n : names) s += ops::sum_squares(view(m, m.grads(), n));
  return std::sqrt(s);
}

struct FrozenCase {
  bool llama;
  DType dtype;
  const char* freeze;
};

// Readable test names in ctest (the default prints the struct's raw bytes).
void PrintTo(const FrozenCase& c, std::ostream* os) {
  *os << (c.llama ? "llama " : "gpt2 ") << dtype_name(c.dtype) << " freeze=" << c.freeze;
}

class FrozenEqualsZeroed : public ::testing::TestWithParam<FrozenCase> {};

TEST_P(FrozenEqualsZeroed, TrainableUpdatesMatchBitForBit) {
  const FrozenCase fc = GetParam();
  const ModelConfig cfg = test::tiny_config(fc.llama, 50, 16);
  const std::vector<std::string> frozen =
      match_frozen(Transformer::layout_for(cfg), fc.freeze, "train.freeze");
  ASSERT_FALSE(frozen.empty());
  Transformer a(cfg, fc.dtype, 7, ParamInit::Random, frozen);  // frozen
  Transformer b(cfg, fc.dtype, 7);  // nothing frozen: gradients zeroed, updates undone
  std::vector<std::string> names, trainable;
  for (const ParamInfo& p : b.layout().params()) names.push_back(p.name);
  std::sort(names.begin(), names.end());
  for (const std::string& n : names)
    if (a.layout().find(n).trainable) trainable.push_back(n);
  // Initial values do not depend on what is frozen.
  for (const std::string& n : names)
    ASSERT_TRUE(same_bytes(view(a, a.params(), n), view(b, b.params(), n))) << n;
  const Tensor a_init = copy_of(a.params());

  AdamWConfig oc;
  oc.weight_decay = 0.1;
  AdamW oa(a, oc), ob(b, oc);
  const int64_t state_size = oa.state_size();
  EXPECT_EQ(state_size, a.layout().trainable_end());
  EXPECT_LT(state_size, ob.state_size());

  const int64_t B = 2, T = 16;
  Activations acts_a(cfg, fc.dtype, B, T, true), acts_b(cfg, fc.dtype, B, T, true);
  Tensor x = Tensor::empty({B, T}, DType::I32), y = Tensor::empty({B, T}, DType::I32);
  const double max_norm = 1.0;
  int clipped = 0;
  for (int64_t step = 1; step <= 5; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    Rng r(uint64_t(100 + step));
    for (int64_t i = 0; i < B * T; ++i) {
      x.data<int32_t>()[i] = int32_t(r.below(50));
      y.data<int32_t>()[i] = int32_t(r.below(50));
    }
    a.zero_grads();
    b.zero_grads();
    const float la = a.forward_backward(acts_a, x, y, 1.f);
    const float lb = b.forward_backward(acts_b, x, y, 1.f);
    EXPECT_EQ(la, lb);
    for (const std::string& n : frozen) ops::fill(view(b, b.grads(), n), 0.f);
    for (const std::string& n : trainable)
      ASSERT_TRUE(same_bytes(view(a, a.grads(), n), view(b, b.grads(), n))) << n;
    const double na = grad_norm(a, trainable), nb = grad_norm(b, trainable);
    ASSERT_EQ(na, nb);
    const float clip = na > max_norm ? float(max_norm / na) : 1.f;
    clipped += clip < 1.f;
    std::vector<std::pair<Tensor, Tensor>> undo;  // (view, saved values) of b's frozen weights
    for (const std::string& n : frozen)
      for (const Tensor* arena :
           std::initializer_list<const Tensor*>{&b.params(), &b.compute_params()})
        undo.emplace_back(view(b, *arena, n), copy_of(view(b, *arena, n)));
    const double lr = 3e-2;
    oa.step(lr, clip);
    ob.step(lr, clip);
    for (auto& [dst, saved] : undo) std::memcpy(dst.raw(), saved.raw(), saved.nbytes());
    for (const std::string& n : names) {
      EXPECT_TRUE(same_bytes(view(a, a.params(), n), view(b, b.params(), n))) << n;
      EXPECT_TRUE(same_bytes(view(a, a.compute_params(), n), view(b, b.compute_params(), n))) << n;
    }
  }
  EXPECT_GT(clipped, 0);  // the clip path was exercised
  for (const std::string& n : frozen)
    EXPECT_TRUE(same_bytes(view(a, a.params(), n), view(a, a_init, n))) << n;
  for (const std::string& n : trainable)
    EXPECT_FALSE(same_bytes(view(a, a.params(), n), view(a, a_init, n))) << n;
  EXPECT_EQ(oa.state_size(), state_size);
  // The moments of the trainable parameters agree too (the layouts' views).
  for (const std::string& n : trainable) {
    EXPECT_TRUE(same_bytes(view(a, oa.m(), n), view(b, ob.m(), n))) << n;
    EXPECT_TRUE(same_bytes(view(a, oa.v(), n), view(b, ob.v(), n))) << n;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Models, FrozenEqualsZeroed,
    ::testing::Values(FrozenCase{false, DType::F32, "wte"},  // tied head: frozen with wte
                      FrozenCase{false, DType::BF16, "wte"},
                      FrozenCase{false, DType::F32, "wpe,h.0.*"},  // LayerNorm, biases
                      FrozenCase{true, DType::F32, "wte"},         // untied head stays trainable
                      FrozenCase{true, DType::BF16, "wte,h.1.ln*,h.0.mlp.*"},
                      FrozenCase{true, DType::F32, "lm_head.weight,h.*.attn.qkv.weight"}));

}  // namespace
}  // namespace nk
