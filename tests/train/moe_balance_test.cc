// DeepSeek-style routing in training: aux-loss-free balancing (the expert
// score-correction bias moved after each step) brings a skewed router to
// within 10 % of even load; the sequence-wise balancing loss's gradient
// through the model equals finite differences; a model with sigmoid
// scores, groups, scaling, the bias, the sequence-wise loss and a leading
// dense layer trains, logs each layer's expert load, resumes bit for bit
// (bias included) and recomputes the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "model/arch.h"
#include "ops/ops.h"
#include "test_util.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::TempDir;

std::string corpus_text() {
  std::string text;
  for (int i = 0; i < 400; ++i)
    text += "Line " + std::to_string(i * 7919 % 1000) + " of some text, " +
            std::to_string(i * 31 % 97) + " words.\n";
  return text;
}

std::vector<std::string> keys(const TempDir& dir, std::vector<std::string> extra) {
  test::write_file(dir / "c.txt", corpus_text());
  std::vector<std::string> ov = {"model.preset=mixtral-tiny",  "model.num_experts=8",
                                 "model.moe_d_ff=32",          "model.moe_score_func=sigmoid",
                                 "model.moe_aux_loss_coeff=0", "data.path=" + (dir / "c.txt"),
                                 "train.micro_batch=4",        "train.seq_len=32",
                                 "train.global_batch=8",       "train.lr=1e-3",
                                 "train.min_lr=1e-4",          "train.warmup_steps=4",
                                 "train.log_every=1000",       "train.peak_tflops=1"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return ov;
}

// Per MoE layer, the busiest expert's routed pairs over the mean, over a
// forward of 384 x 32 tokens (the whole corpus) of the corpus's bytes, in order (as training reads
// them).
std::vector<double> load_max(Transformer& m) {
  const int64_t B = 384, T = 32;
  const std::string text = corpus_text();
  std::vector<int32_t> ids(static_cast<size_t>(B * T));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(uint8_t(text[i % text.size()]));
  Tensor tokens = Tensor::empty({B, T}, DType::I32);
  std::memcpy(tokens.raw(), ids.data(), ids.size() * sizeof(int32_t));
  Activations a(m, B, T, false);
  Tensor logits = Tensor::empty({B, m.config().vocab_size}, DType::F32);
  m.forward_last_logits(a, tokens, logits);
  std::vector<double> out;
  for (int64_t l = 0; l < m.config().n_layer; ++l) {
    if (!m.config().moe_layer(l)) continue;
    const std::vector<int64_t>& n = a.expert_counts()[size_t(l)];
    double sum = 0, mx = 0;
    for (int64_t v : n) {
      sum += double(v);
      mx = std::max(mx, double(v));
    }
    out.push_back(mx * double(n.size()) / sum);
  }
  return out;
}

// Skews every router towards experts 0 and 1: every token's embedding gets
// a shared direction v (of the embeddings' own scale), along which those
// experts' router rows point, so that they are nearly every token's top 2.
// The routers' weights are first scaled up 5 times, so that the tokens'
// scores spread (about +-0.15 around 0.5) and a bias step of `rate` moves
// few of them.
void skew(Transformer& m) {
  const ModelConfig& c = m.config();
  const int64_t C = c.d_model;
  std::vector<float> v(static_cast<size_t>(C));
  for (int64_t i = 0; i < C; ++i) v[size_t(i)] = (i * 7 % 5 < 2 ? 0.02f : -0.02f);
  const ParamInfo& wte = m.layout().find("wte");
  Tensor w = m.param_f32(wte);
  for (int64_t r = 0; r < c.vocab_size; ++r)
    for (int64_t i = 0; i < C; ++i) w.data<float>()[r * C + i] += v[size_t(i)];
  m.set_param(wte, w);
  const float norm = 0.02f * std::sqrt(float(C));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!c.moe_layer(l)) continue;
    const ParamInfo& p = m.layout().find(fmt::format("h.{}.moe.router.weight", l));
    Tensor r = m.param_f32(p);
    for (int64_t i = 0; i < p.numel(); ++i) r.data<float>()[i] *= 5.f;
    for (int64_t e = 0; e < 2; ++e)
      for (int64_t i = 0; i < C; ++i) r.data<float>()[e * C + i] += 0.15f * v[size_t(i)] / norm;
    m.set_param(p, r);
  }
}

// Steps of 1024 tokens (2048 routed pairs, 256 per expert at even load):
// the sign update balances to the resolution of each step's counted loads,
// so fewer tokens per step leave it wandering by their noise.
TEST(MoeBalance, AuxLossFreeBalancingEvensASkewedRouter) {
  TempDir dir("nk_moe_balance");
  const double rate = 0.002;
  Trainer t(train_config_from(
      Config::load(train_schema(), "",
                   keys(dir, {"train.steps=200", "train.micro_batch=16", "train.global_batch=32",
                              fmt::format("model.moe_bias_update_rate={}", rate),
                              "train.out_dir=" + (dir / "out")}))));
  skew(t.model());
  const std::vector<double> before = load_max(t.model());
  t.run({});
  const std::vector<double> after = load_max(t.model());
  // The logged per-layer loads of some steps (over each step's tokens).
  std::istringstream log(test::read_file(dir / "out/metrics.jsonl"));
  std::string line;
  while (std::getline(log, line)) {
    const nlohmann::json r = nlohmann::json::parse(line);
    if (int(r["step"].get<double>()) % 40 == 0)
      std::cout << "[ moe balance ] step " << r["step"] << ": logged load max/mean "
                << r["moe_load_max.l0"] << ", " << r["moe_load_max.l1"] << "\n";
  }
  ASSERT_EQ(before.size(), 2u);
  for (size_t l = 0; l < before.size(); ++l) {
    std::cout << "[ moe balance ] rate " << rate << " layer " << l << ": load max/mean "
              << before[l] << " before, " << after[l] << " after 200 steps\n";
    EXPECT_GT(before[l], 2.0);  // a few experts take most tokens
    EXPECT_LE(after[l], 1.1);
  }
}

Tensor ids(int64_t B, int64_t T, int64_t V, int64_t mul, int64_t add) {
  Tensor t = Tensor::empty({B, T}, DType::I32);
  for (int64_t i = 0; i < B * T; ++i) t.data<int32_t>()[i] = int32_t((i * mul + add) % V);
  return t;
}

// The sequence-wise balancing loss through the whole model (DeepSeek's
// routing: sigmoid, groups, scaling): the routers' gradient it adds equals
// central finite differences of Transformer::moe_losses().aux (the counts
// held fixed, as the loss defines them; entries whose perturbation changes
// the routing are skipped).
TEST(MoeBalance, SequenceAuxLossGradientMatchesFiniteDifferences) {
  ModelConfig c = model_preset("mixtral-tiny");
  c.num_experts = 8;
  c.moe_d_ff = 16;
  c.moe_score_func = "sigmoid";
  c.moe_n_group = 4;
  c.moe_topk_group = 2;
  c.moe_routed_scaling = 2.5;
  c.moe_aux_loss_type = "seq";
  c.init_std = 0.3;
  const double coeff = 4.0;
  const int64_t B = 3, T = 8;
  const Tensor tok = ids(B, T, c.vocab_size, 41, 3), tgt = ids(B, T, c.vocab_size, 23, 17);
  auto router_grads = [&](double aux_coeff) {
    ModelConfig k = c;
    k.moe_aux_loss_coeff = aux_coeff;
    Transformer m(k, DType::F32, 5);
    Activations a(m, B, T, true);
    m.zero_grads();
    m.forward_backward(a, tok, tgt, 1.f);
    std::vector<float> g(static_cast<size_t>(m.grads().numel()));
    std::memcpy(g.data(), m.grads().raw(), g.size() * sizeof(float));
    return g;
  };
  const std::vector<float> with = router_grads(coeff), without = router_grads(0.0);
  Transformer m(c, DType::F32, 5);
  Activations a(m, B, T, false);
  Tensor logits = Tensor::empty({B * T, c.vocab_size}, DType::F32);
  auto aux_at = [&](const ParamInfo& p, int64_t i, float delta,
                    std::vector<std::vector<int64_t>>& counts) {
    Tensor w = m.param_f32(p);
    const float keep = w.data<float>()[i];
    w.data<float>()[i] = keep + delta;
    m.set_param(p, w);
    m.forward_all_logits(a, tok, logits);
    w.data<float>()[i] = keep;
    m.set_param(p, w);
    counts = a.expert_counts();
    return m.moe_losses(a).aux;
  };
  int checked = 0, skipped = 0;
  double worst = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const ParamInfo& p = m.layout().find(fmt::format("h.{}.moe.router.weight", l));
    for (int64_t i = 0; i < p.numel(); i += 37) {
      const float h = 1e-2f;
      std::vector<std::vector<int64_t>> up, down;
      const double fd = (aux_at(p, i, h, up) - aux_at(p, i, -h, down)) / (2.0 * h);
      if (up != down) {
        ++skipped;
        continue;
      }
      const double g = (double(with[size_t(p.offset + i)]) - without[size_t(p.offset + i)]) / coeff;
      worst = std::max(worst, std::abs(g - fd));
      EXPECT_NEAR(g, fd, 2e-4 + 2e-2 * std::abs(fd)) << p.name << "[" << i << "]";
      ++checked;
    }
  }
  std::cout << "[ seq aux ] " << checked << " router weights checked (" << skipped
            << " skipped: routing changed), worst |grad - fd| " << worst << "\n";
  EXPECT_GT(checked, 3 * skipped);
}

// align.moe_losses: a sequence objective's backward (rows: DPO's; tokens:
// online RL's; a score head's: a reward model's) with moe_grad_scale g adds
// g times the MoE losses' gradient language-model training adds (whose
// finite differences the test above checks): the objective's gradient with
// g minus without equals, parameter by parameter, forward_backward's over
// targets all ignored (no cross-entropy: the MoE losses alone) at
// grad_scale g on a language model of the same weights; without, none.
TEST(MoeBalance, SequenceObjectivesAddTheMoeLossesWhenAsked) {
  for (const char* type : {"global", "seq"}) {
    ModelConfig c = model_preset("mixtral-tiny");
    c.num_experts = 4;
    c.moe_d_ff = 16;
    c.moe_aux_loss_type = type;
    c.moe_aux_loss_coeff = 0.5;
    c.moe_z_loss_coeff = 0.1;
    c.init_std = 0.3;
    ModelConfig rm = c;  // a reward model: a score head of one label
    rm.num_labels = 1;
    const int64_t B = 2, T = 8;
    const float g = 0.25f;
    const Tensor tok = ids(B, T, c.vocab_size, 41, 3), tgt = ids(B, T, c.vocab_size, 23, 17);
    Tensor ignored = Tensor::empty({B, T}, DType::I32);
    for (int64_t i = 0; i < B * T; ++i)
      ignored.data<int32_t>()[i] = int32_t(Transformer::kIgnoreIndex);
    using Grads = std::map<std::string, std::vector<double>>;
    using Run = std::function<void(Transformer&, Activations&)>;
    // Each parameter's gradient after f, the weights the language model's
    // (the score head its own).
    const Transformer lm(c, DType::F32, 5);
    auto grads = [&](const ModelConfig& k, const Run& f) {
      Transformer m(k, DType::F32, 5);
      for (const ParamInfo& p : m.layout().params())
        if (lm.layout().has(p.name)) m.set_param(p, lm.param_f32(lm.layout().find(p.name)));
      Activations a(m, B, T, true);
      m.zero_grads();
      f(m, a);
      Grads out;
      const float* d = m.grads().data<float>();
      for (const ParamInfo& p : m.layout().params())
        if (p.trainable) out[p.name].assign(d + p.offset, d + p.offset + p.numel());
      return out;
    };
    auto staged = [&](const Run& head) -> Run {
      return [&, head](Transformer& m, Activations& a) {
        m.embed_forward(a, tok);
        m.blocks_forward(a, 0, c.n_layer);
        head(m, a);
        m.blocks_backward(a, 0, c.n_layer);
        m.embed_backward(a, tok);
      };
    };
    const std::vector<float> row_scale = {0.7f, -1.3f};
    std::vector<float> token_scale(static_cast<size_t>(B * T));
    for (size_t i = 0; i < token_scale.size(); ++i) token_scale[i] = 0.1f * float(int(i % 5) - 2);
    auto rows = [&](float s) {
      return staged([&, s](Transformer& m, Activations& a) {
        std::vector<double> nll(static_cast<size_t>(B));
        m.head_row_nll(a, tgt, nll);
        m.head_row_backward(a, tgt, row_scale, s);
      });
    };
    auto tokens = [&](float s) {
      return staged([&, s](Transformer& m, Activations& a) {
        std::vector<float> nll(static_cast<size_t>(B * T));
        m.head_token_nll(a, tgt, nll);
        m.head_token_backward(a, tgt, token_scale, {}, s);
      });
    };
    auto score = [&](float s) {
      return staged([&, s](Transformer& m, Activations& a) {
        const std::vector<int64_t> last = {T - 1, T / 2};
        std::vector<float> scores(static_cast<size_t>(B));
        m.score_forward(a, last, scores);
        m.score_backward(a, last, std::vector<float>{0.9f, -0.4f}, s);
      });
    };
    const Grads moe =
        grads(c, [&](Transformer& m, Activations& a) { m.forward_backward(a, tok, ignored, g); });
    double size = 0;
    for (const auto& [name, v] : moe)
      for (double x : v) size = std::max(size, std::abs(x));
    ASSERT_GT(size, 1e-4) << type << ": the MoE losses alone give no gradient";
    struct Case {
      const char* name;
      const ModelConfig& cfg;
      Run with, without;
    };
    for (const Case& k :
         {Case{"rows", c, rows(g), rows(0.f)}, Case{"tokens", c, tokens(g), tokens(0.f)},
          Case{"score", rm, score(g), score(0.f)}}) {
      const Grads on = grads(k.cfg, k.with), off = grads(k.cfg, k.without);
      double worst = 0, moved = 0, objective = 0;
      int64_t compared = 0;
      for (const auto& [name, v] : off)
        for (double x : v) objective = std::max(objective, std::abs(x));
      for (const auto& [name, v] : on) {
        const std::vector<double>& o = off.at(name);
        const auto it = moe.find(name);
        for (size_t i = 0; i < v.size(); ++i) {
          moved = std::max(moved, std::abs(v[i] - o[i]));
          // The score head and the LM head are the models' own: the MoE
          // losses do not reach either.
          const double want = it == moe.end() ? 0.0 : it->second[i];
          worst = std::max(worst, std::abs(v[i] - o[i] - want));
          ++compared;
        }
      }
      // f32: the objective's own gradient (up to ~1 here) rounds differently
      // beside the added terms.
      EXPECT_LT(worst, 1e-4 * size + 1e-5 * objective)
          << type << " " << k.name << ": the objective's gradient up to " << objective;
      EXPECT_GT(moved, 1e-4) << type << " " << k.name << ": the switch changed nothing";
      EXPECT_GT(compared, 1000) << k.name;
    }
  }
}

// The last line of a metrics.jsonl.
nlohmann::json last_metrics(const std::string& path) {
  std::istringstream in(test::read_file(path));
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last);
}

struct TrainRun {
  std::vector<StepStats> history;
  std::vector<float> params;
};

TrainRun run(const std::vector<std::string>& ov) {
  Trainer t(train_config_from(Config::load(train_schema(), "", ov)));
  t.run({});
  TrainRun r{t.history(), std::vector<float>(size_t(t.model().params().numel()))};
  std::memcpy(r.params.data(), t.model().params().raw(), r.params.size() * sizeof(float));
  return r;
}

TEST(MoeBalance, DeepSeekRoutingTrainsLogsAndResumesExactly) {
  TempDir dir("nk_moe_ds_resume");
  const std::vector<std::string> ds = {"model.n_layer=3",
                                       "model.moe_n_group=4",
                                       "model.moe_topk_group=2",
                                       "model.moe_routed_scaling=2.5",
                                       "model.moe_bias_update_rate=0.001",
                                       "model.moe_aux_loss_type=seq",
                                       "model.moe_aux_loss_coeff=0.01",
                                       "model.moe_z_loss_coeff=0.001",
                                       "model.moe_first_dense_layers=1",
                                       "train.steps=12",
                                       "train.save_every=3"};
  auto with = [&](const std::string& out, std::vector<std::string> more) {
    std::vector<std::string> k = ds;
    k.push_back("train.out_dir=" + (dir / out));
    k.insert(k.end(), more.begin(), more.end());
    return keys(dir, k);
  };
  const TrainRun straight = run(with("straight", {}));
  ASSERT_EQ(straight.history.size(), 12u);
  EXPECT_LT(straight.history.back().loss, straight.history.front().loss);
  const nlohmann::json m = last_metrics((dir / "straight/metrics.jsonl"));
  EXPECT_FALSE(m.contains("moe_load_max.l0")) << m.dump();  // the dense layer
  for (const char* key : {"moe_load_max.l1", "moe_load_max.l2"})
    EXPECT_GE(m.at(key).get<double>(), 1.0) << m.dump();
  EXPECT_GT(m.at("moe_aux").get<double>(), 0.5) << m.dump();
  // The bias moved (it is in the parameters that resume compares).
  const ParamLayout layout =
      model_layout(train_config_from(Config::load(train_schema(), "", with("straight", {}))).model);
  const ParamInfo& bias = layout.find("h.1.moe.score_bias");
  double moved = 0;
  for (int64_t e = 0; e < 8; ++e) moved += std::abs(straight.params[size_t(bias.offset + e)]);
  EXPECT_GT(moved, 0.0);
  const TrainRun head = run(with("split", {"train.exit_at_step=7"}));
  ASSERT_EQ(head.history.size(), 7u);
  const TrainRun tail = run(with("split", {}));
  ASSERT_EQ(tail.history.front().step, 8);
  std::vector<StepStats> joined = head.history;
  joined.insert(joined.end(), tail.history.begin(), tail.history.end());
  ASSERT_EQ(joined.size(), straight.history.size());
  for (size_t i = 0; i < joined.size(); ++i) {
    EXPECT_EQ(joined[i].loss, straight.history[i].loss) << "step " << i + 1;
    EXPECT_EQ(joined[i].grad_norm, straight.history[i].grad_norm) << "step " << i + 1;
  }
  EXPECT_TRUE(tail.params == straight.params);
  // Recomputing the layers (the dense one too) gives the same bits.
  for (const char* policy : {"full", "selective"}) {
    SCOPED_TRACE(policy);
    const TrainRun r =
        run(with(std::string("recompute_") + policy, {std::string("train.recompute=") + policy}));
    ASSERT_EQ(r.history.size(), straight.history.size());
    for (size_t i = 0; i < r.history.size(); ++i)
      EXPECT_EQ(r.history[i].loss, straight.history[i].loss) << "step " << i + 1;
    EXPECT_TRUE(r.params == straight.params);
  }
}

}  // namespace
}  // namespace nk
