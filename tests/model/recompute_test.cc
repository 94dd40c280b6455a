// Activation recompute (Recompute, train.recompute): every plan gives the
// gradients and loss of the plan that keeps everything, bit for bit, on
// GPT-2 and Llama, f32 and bf16, with LoRA adapters (dropout on, so their
// masks must be redrawn alike) and without; each plan shrinks the planned
// workspace itself; bad settings name the key.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <set>

#include "core/rng.h"
#include "model/tiny_config.h"
#include "model/transformer.h"
#include "tensor_util.h"
#include "test_util.h"

namespace nk {
namespace {

using test::host;

using test::random_ids;

ModelConfig config(bool llama, bool lora) {
  return test::three_layer_config(llama, lora, 0.2);
}

struct Result {
  float loss;
  std::vector<float> grads;
  int64_t bytes;
};

// Two micro-batches accumulated into the gradients (the second reuses the
// workspace, as the trainer does).
Result run(const ModelConfig& c, DType dt, const std::vector<Recompute>& plan,
           ActivationObserver* observer = nullptr) {
  const int64_t B = 2, T = 12;
  Transformer m(c, dt, 5);
  if (c.lora.enabled()) {  // B away from zero, so every adapter gradient is live
    for (const ParamInfo& p : m.layout().params())
      if (p.name.find("lora_b") != std::string::npos) {
        std::vector<float> v(size_t(p.numel()));
        Rng rng(p.offset + 1);
        for (float& x : v) x = float(rng.normal() * 0.1);
        ops::copy_from_host(ParamLayout::view(m.params(), p), v.data());
      }
    m.sync_compute_params();
  }
  Activations a(m, B, T, true, plan);
  a.set_observer(observer);
  m.zero_grads();
  float loss = 0;
  for (uint64_t mb = 0; mb < 2; ++mb) {
    m.set_dropout_seed(100 + mb);
    loss += m.forward_backward(a, random_ids({B, T}, c.vocab_size, 1 + mb),
                               random_ids({B, T}, c.vocab_size, 11 + mb), 0.5f);
  }
  return {loss, host(m.grads()), a.bytes()};
}

using Plans = std::vector<std::pair<std::string, int64_t>>;  // train.recompute, _layers

// GPT-2 and Llama, with LoRA and without, f32 and bf16: each plan's run
// beside the run that keeps everything (`want`).
template <class Check>
void for_each_plan(const Plans& plans, Check&& check) {
  for (bool llama : {false, true})
    for (bool lora : {false, true})
      for (DType dt : {DType::F32, DType::BF16}) {
        const ModelConfig c = config(llama, lora);
        SCOPED_TRACE(testing::Message() << c.arch << (lora ? " LoRA " : " ") << dtype_name(dt));
        const Result want = run(c, dt, {});
        for (const auto& [policy, layers] : plans) {
          SCOPED_TRACE(testing::Message() << policy << " " << layers);
          check(c, dt, recompute_plan(policy, layers, c.n_layer), policy, lora, want);
        }
      }
}

void expect_same_bits(const Result& got, const Result& want) {
  EXPECT_EQ(got.loss, want.loss);
  ASSERT_EQ(got.grads.size(), want.grads.size());
  EXPECT_EQ(0, std::memcmp(got.grads.data(), want.grads.data(), want.grads.size() * 4));
}

TEST(Recompute, SameGradientsBitForBit) {
  for_each_plan(
      {{"none", 0}, {"selective", 0}, {"full", 0}, {"full", 2}, {"selective", 1}},
      [](const ModelConfig& c, DType dt, const std::vector<Recompute>& plan, const std::string&,
         bool, const Result& want) { expect_same_bits(run(c, dt, plan), want); });
}

// Selective drops the norms' and the activation's outputs of every layer
// but one set; full keeps one layer's activations for all.
TEST(Recompute, EachPlanShrinksTheWorkspace) {
  for (bool llama : {false, true}) {
    const ModelConfig c = config(llama, false);
    const int64_t none = run(c, DType::F32, {}).bytes;
    const int64_t selective = run(c, DType::F32, recompute_plan("selective", 0, 3)).bytes;
    const int64_t full = run(c, DType::F32, recompute_plan("full", 0, 3)).bytes;
    const int64_t full_one = run(c, DType::F32, recompute_plan("full", 1, 3)).bytes;
    EXPECT_EQ(none, run(c, DType::F32, recompute_plan("none", 0, 3)).bytes);
    EXPECT_LT(selective, none) << c.arch;
    EXPECT_LT(full, selective) << c.arch;
    // One fully recomputing layer keeps a shared set instead of its own: no saving.
    EXPECT_EQ(full_one, none) << c.arch;
    // What a layer drops: per token, the two norms' outputs (C each) and the
    // activation's (d_ff), f32; selective keeps one set of them for all.
    const int64_t N = 2 * 12, per_layer = N * (2 * c.d_model + c.d_ff) * 4;
    EXPECT_EQ(none - selective, 2 * per_layer) << c.arch;
  }
}

// An offload policy written against Activations::saved and the observer
// alone: after layer l's forward its saved tensors go to a host stash and
// are overwritten with NaN; before its backward they come back. The
// gradients stay the same bits, so nothing reads them while away: the
// lifetimes the plan states are the true ones.
class PoisoningOffload final : public ActivationObserver {
 public:
  void forward_done(Activations& a, int64_t l) override {
    EXPECT_EQ(stash_.count(l), 0u) << "layer " << l << " forwarded twice";
    auto& kept = stash_[l];
    for (const SavedActivation& s : a.saved(l)) {
      std::vector<float> v(size_t(s.tensor.numel()));
      Tensor f32 = Tensor::empty(s.tensor.shape(), DType::F32);
      ops::convert(f32, s.tensor);
      ops::copy_to_host(f32, v.data());
      kept.push_back(std::move(v));
      ops::fill(s.tensor, NAN);
      offloaded += int64_t(s.tensor.nbytes());
      names.insert(s.name);
    }
    forwards.push_back(l);
  }
  void backward_next(Activations& a, int64_t l) override {
    auto it = stash_.find(l);
    ASSERT_NE(it, stash_.end()) << "layer " << l << " backward before its forward";
    const std::vector<SavedActivation> saved = a.saved(l);
    ASSERT_EQ(saved.size(), it->second.size());
    for (size_t i = 0; i < saved.size(); ++i) {
      Tensor f32 = Tensor::empty(saved[i].tensor.shape(), DType::F32);
      ops::copy_from_host(f32, it->second[i].data());
      ops::convert(saved[i].tensor, f32);
    }
    stash_.erase(it);
    backwards.push_back(l);
  }
  std::vector<int64_t> forwards, backwards;
  std::set<std::string> names;
  int64_t offloaded = 0;

 private:
  std::map<int64_t, std::vector<std::vector<float>>> stash_;
};

TEST(Recompute, SavedTensorsCanBeOffloadedBetweenForwardAndBackward) {
  for_each_plan({{"none", 0}, {"selective", 0}, {"full", 0}, {"selective", 1}},
                [](const ModelConfig& c, DType dt, const std::vector<Recompute>& plan,
                   const std::string& policy, bool lora, const Result& want) {
                  PoisoningOffload offload;
                  expect_same_bits(run(c, dt, plan, &offload), want);
                  // Two micro-batches, each layer's forward then, in reverse, its backward.
                  EXPECT_EQ(offload.forwards, (std::vector<int64_t>{0, 1, 2, 0, 1, 2}));
                  EXPECT_EQ(offload.backwards, (std::vector<int64_t>{2, 1, 0, 2, 1, 0}));
                  EXPECT_TRUE(offload.names.count("res"));
                  if (policy == "none") {
                    EXPECT_TRUE(offload.names.count("ln1") && offload.names.count("mlp.a"));
                    EXPECT_EQ(offload.names.count("mlp.up_adapters.h"), lora ? 1u : 0u);
                  }
                  if (policy == "full") {
                    EXPECT_EQ(offload.names, std::set<std::string>{"res"});
                  }
                });
}

TEST(Recompute, BadSettingsNameTheKey) {
  EXPECT_TRUE(test::contains(test::error_of([] { recompute_plan("some", 0, 4); }),
                             "train.recompute: expected none, selective or full, got 'some'"));
  EXPECT_TRUE(test::contains(test::error_of([] { recompute_plan("full", 5, 4); }),
                             "train.recompute_layers: 5 is not in [0, model.n_layer = 4]"));
}

}  // namespace
}  // namespace nk
