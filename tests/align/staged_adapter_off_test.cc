// PreferenceObjective's staged form (what data parallelism runs) with
// align.reference=adapter_off: before_staged's forward with the adapters
// off, then the policy's staged forward, head_micro_batch and the blocks'
// and embedding's backward give one process's train_micro_batch loss and
// gradients bit for bit, with LoRA dropout too. head_micro_batch without
// before_staged is an internal error, not a reference of zeros.
#include <gtest/gtest.h>

#include <cstring>

#include "align/preference_objective.h"
#include "core/rng.h"
#include "model/tiny_config.h"
#include "tensor_util.h"

namespace nk {
namespace {

struct Case {
  TrainConfig tc;
  AlignConfig ac;
  std::vector<std::string> frozen;
  std::shared_ptr<PreferenceData> data = std::make_shared<PreferenceData>();
  static constexpr int64_t B = 4, T = 16;

  Case() {
    tc.model = test::three_layer_config(true, true, 0.25);
    tc.dtype = DType::F32;
    tc.micro_batch = B;
    tc.seq_len = T;
    const ParamLayout layout = Transformer::layout_for(tc.model);
    for (const ParamInfo& p : layout.params())
      if (!p.adapter) frozen.push_back(p.name);
    ac.reference = "adapter_off";
    ac.data_path = "pairs.jsonl";  // (read by the command, not here)
    ac.check(true);
    // Two pairs: a prompt of 5 tokens, completions of 3 to 8.
    Rng rng(11);
    data->path = "pairs.jsonl";
    for (int64_t s = 0; s < B; ++s) {
      const int64_t n = 5 + 3 + s * 5 % 6;
      std::vector<int32_t> t(static_cast<size_t>(n));
      for (int32_t& x : t) x = int32_t(rng.uniform() * double(tc.model.vocab_size - 1));
      std::vector<uint8_t> trained(size_t(n), 0);
      for (int64_t i = 5; i < n; ++i) trained[size_t(i)] = 1;
      data->tokens.push_back(std::move(t));
      data->trained.push_back(std::move(trained));
    }
    data->line = {1, 2};
  }

  // A policy whose adapters change its output (LoRA's B starts at zero).
  std::unique_ptr<Transformer> policy() const {
    auto m = std::make_unique<Transformer>(tc.model, tc.dtype, 5, ParamInit::Random, frozen);
    Rng rng(3);
    for (const ParamInfo& p : m->layout().params()) {
      if (!p.adapter) continue;
      std::vector<float> v(size_t(p.numel()));
      for (float& x : v) x = 0.5f * (float(rng.uniform()) - 0.5f);
      Tensor t = Tensor::empty(p.shape, DType::F32);
      ops::copy_from_host(t, v.data());
      m->set_param(p, t);
    }
    return m;
  }
};

TEST(StagedAdapterOff, EqualsTheOneProcessMicroBatch) {
  Case s;
  const int64_t B = Case::B, T = Case::T;
  PreferenceObjective obj(s.tc, s.ac, s.data, nullptr, 0);
  const TrainData d = obj.data(s.tc);
  std::vector<int32_t> tok(size_t(B * T)), tg(size_t(B * T)), pos(static_cast<size_t>(T)), cu(2);
  for (int64_t b = 0; b < B; ++b)
    d.train->row(b, &tok[size_t(b * T)], &tg[size_t(b * T)], pos.data(), cu.data());
  const Tensor tokens = test::i32_tensor({B, T}, tok), targets = test::i32_tensor({B, T}, tg);
  const MicroBatch mb{tokens, targets, tokens, targets, nullptr, 0};

  auto one = s.policy();
  one->set_dropout_seed(77);
  Activations a1(*one, B, T, true);
  one->zero_grads();
  const double want = obj.train_micro_batch(*one, a1, mb, 0.5f);
  const ObjectiveMetrics want_figures = obj.take_metrics(false);

  auto staged = s.policy();
  staged->set_dropout_seed(77);
  Activations a2(*staged, B, T, true);
  staged->zero_grads();
  const int64_t L = s.tc.model.n_layer;
  int forwards = 0;
  obj.before_staged(*staged, mb, true, [&](const std::function<double(Activations&)>& head) {
    ++forwards;
    EXPECT_FALSE(staged->adapters_enabled());
    staged->embed_forward(a2, tokens);
    staged->blocks_forward(a2, 0, L);
    return head(a2);
  });
  EXPECT_EQ(forwards, 1);
  EXPECT_TRUE(staged->adapters_enabled());
  staged->embed_forward(a2, tokens);
  staged->blocks_forward(a2, 0, L);
  const double got = obj.head_micro_batch(*staged, a2, mb, 0.5f, true);
  staged->blocks_backward(a2, 0, L);
  staged->embed_backward(a2, tokens);
  const ObjectiveMetrics got_figures = obj.take_metrics(false);

  EXPECT_EQ(got, want);
  EXPECT_NE(want, std::log(2.0));  // the reference is not the policy itself
  ASSERT_EQ(got_figures.size(), want_figures.size());
  for (size_t i = 0; i < want_figures.size(); ++i)
    EXPECT_EQ(got_figures[i].second, want_figures[i].second) << want_figures[i].first;
  const Tensor& g1 = one->grads();
  const Tensor& g2 = staged->grads();
  ASSERT_EQ(g1.numel(), g2.numel());
  EXPECT_GT(ops::sum_squares(g1), 0.0);
  EXPECT_EQ(std::memcmp(g1.raw(), g2.raw(), g1.nbytes()), 0);

  // The reference is taken once: a second head_micro_batch has none.
  staged->embed_forward(a2, tokens);
  staged->blocks_forward(a2, 0, L);
  EXPECT_THROW(obj.head_micro_batch(*staged, a2, mb, 0.5f, true), InternalError);

  // A pipeline stage without the head runs the forward but not `head`:
  // nothing is queued for it (its schedule runs no head either).
  obj.before_staged(*staged, mb, true,
                    [](const std::function<double(Activations&)>&) { return 0.0; });
  EXPECT_THROW(obj.head_micro_batch(*staged, a2, mb, 0.5f, true), InternalError);
  EXPECT_TRUE(staged->adapters_enabled());
}

}  // namespace
}  // namespace nk
