// LoRA on Mixture-of-Experts models (model/peft.h, nn/moe.h): each expert's
// projections carry their own A and B, as Hugging Face PEFT adapts Mixtral's
// block_sparse_moe.experts.E.w1/w2/w3 and Qwen-MoE's
// mlp.experts.E.gate_proj/up_proj/down_proj (and Qwen2-MoE's shared
// expert); the routers train whole with peft.train_router (PEFT's
// modules_to_save). Checked against an independent float64 PyTorch LoRA over
// the Hugging Face checkpoint (tests/peft/moe_lora_reference.py, reading the
// adapter in PEFT's format): logits, the training loss (the MoE losses
// included) and every adapter (and router) gradient; the adapter file holds
// exactly the tensors PEFT names; reloading it gives the same logits, merging
// it the same within 1e-5, and cached generation the same tokens.
#include <gtest/gtest.h>

#include <set>

#include "ckpt/peft_adapter.h"
#include "core/rng.h"
#include "hf_test_util.h"
#include "infer/generate.h"
#include "model/arch.h"
#include "test_paths.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

const std::string kLoraReference =
    std::string("/usr/bin/python3 ") + NK_SOURCE_DIR + "/tests/peft/moe_lora_reference.py";

struct MoeLoraCase {
  const char* arch;
  std::vector<std::string> targets;
  bool train_router;
  const char* expert_tensor;  // one expert's LoRA tensor, as PEFT names it
  const char* router_module;  // PEFT's modules_to_save for the routers
};

json moe_spec(const std::string& arch) {
  json s = llama_spec();
  s["arch"] = arch;
  s["seed"] = 17;
  s["experts"] = 4;
  s["top_k"] = 2;
  if (arch == "mixtral") {
    s["ffn"] = 24;
    s["window"] = nullptr;
  } else {
    s["moe_ffn"] = 24;
  }
  if (arch == "qwen2_moe") s["shared_ffn"] = 40;
  return s;
}

// The base's names a LoRA run freezes: all but the adapters (and, with
// train_router, the routers).
std::vector<std::string> frozen_names(const ModelConfig& c) {
  std::vector<std::string> out;
  const ParamLayout layout = Transformer::layout_for(c);
  for (const ParamInfo& p : layout.params())
    if (!p.adapter && !(c.lora.train_router && p.name.ends_with(".moe.router.weight")))
      out.push_back(p.name);
  return out;
}

// `base` with c's LoRA: A as PEFT draws it, B N(0, 0.3^2) so that the
// adapters change the output.
std::unique_ptr<Transformer> with_lora(Transformer& base, const ModelConfig& c) {
  auto m = std::make_unique<Transformer>(c, DType::F32, 5, ParamInit::Added, frozen_names(c));
  for (const ParamInfo& p : base.layout().params())
    ops::convert(ParamLayout::view(m->params(), m->layout().find(p.name)),
                 ParamLayout::view(base.params(), p));
  Rng rng(9);
  std::set<std::string> drawn;  // (the experts' B: one stacked tensor per layer's linear)
  for (const AdaptedModule& t : lora_targets(c)) {
    if (!drawn.insert(t.b_name()).second) continue;
    Tensor b = ParamLayout::view(m->params(), m->layout().find(t.b_name()));
    std::vector<float> v(size_t(b.numel()));
    for (float& x : v) x = float(rng.normal() * 0.3);
    ops::copy_from_host(b, v.data());
  }
  m->sync_compute_params();
  return m;
}

class MoeLora : public ::testing::TestWithParam<MoeLoraCase> {};

TEST_P(MoeLora, MatchesPeftReferenceAndRoundTrips) {
  const MoeLoraCase& q = GetParam();
  TempDir tmp("nk_moe_lora");
  const std::string hf = write_hf(tmp, q.arch, moe_spec(q.arch));
  import_hf(hf, tmp / "nk");
  const double aux = 0.5, z = 0.25;  // large, so that the router's gradient shows them
  json nc = read_json(tmp / "nk/config.json");
  nc["moe"]["aux_loss_coeff"] = aux;
  nc["moe"]["z_loss_coeff"] = z;
  write_json(tmp / "nk/config.json", nc);
  auto base = load_model(tmp / "nk", DType::F32);

  ModelConfig c = base->config();
  c.lora.rank = 4;
  c.lora.alpha = 8;
  c.lora.target_modules = q.targets;
  c.lora.train_router = q.train_router;
  auto model = with_lora(*base, c);
  const std::vector<PeftTensor> tensors = peft_tensors(c);
  int64_t experts = 0;
  for (const AdaptedModule& t : lora_targets(c)) experts += adapted_expert(t) >= 0;
  EXPECT_GE(experts, 2 * 4 * 2) << "every expert's adapted projections in both layers";

  // The adapter in PEFT's format: its names and modules_to_save.
  const std::string adapter = tmp / "adapter";
  save_peft_adapter(adapter, *model, hf);
  SafetensorsFile file = SafetensorsFile::open(adapter + "/adapter_model.safetensors");
  EXPECT_TRUE(file.has(q.expert_tensor)) << q.expert_tensor;
  EXPECT_EQ(int64_t(file.entries().size()), int64_t(tensors.size()));
  const json ac = read_json(adapter + "/adapter_config.json");
  const std::string router =
      fmt::format("base_model.model.model.layers.1.{}.weight", q.router_module);
  if (q.train_router) {
    EXPECT_EQ(ac["modules_to_save"], json::array({q.router_module}));
    EXPECT_TRUE(file.has(router)) << router;
  } else {
    EXPECT_TRUE(ac["modules_to_save"].is_null());
    EXPECT_FALSE(file.has(router));
  }

  // Nekton's loss, logits and gradients against the reference's.
  const int64_t B = 2, T = 12, V = c.vocab_size;
  std::vector<int32_t> tok(size_t(B * T)), tgt(tok.size());
  for (size_t i = 0; i < tok.size(); ++i) {
    tok[i] = int32_t((i * 41 + 3) % size_t(V));
    tgt[i] =
        i % size_t(T) < 3 ? int32_t(Transformer::kIgnoreIndex) : int32_t((i * 23 + 17) % size_t(V));
  }
  const Tensor tokens = i32_tensor({B, T}, tok), targets = i32_tensor({B, T}, tgt);
  save_safetensors(tmp / "batch.safetensors", {{"tokens", tokens}, {"targets", targets}});
  RunResult r =
      run_command(kLoraReference + " " + hf + " " + adapter + " " + (tmp / "batch.safetensors") +
                  " " + (tmp / "ref.safetensors") + " " + fmt::format("{:g} {:g}", aux, z));
  ASSERT_EQ(r.code, 0) << r.out;
  SafetensorsFile ref = SafetensorsFile::open(tmp / "ref.safetensors");
  const std::vector<float> want = floats(ref.get("loss"));
  const Tensor logits = logits_of(*model, tokens);
  EXPECT_LT(max_rel_diff(logits, ref.get("logits")), 1e-5);
  Activations a(*model, B, T, true);
  model->zero_grads();
  const float loss = model->forward_backward(a, tokens, targets, 1.f);
  std::cout << "[ " << q.arch << " ] loss " << loss << " (reference " << want[0] << ")\n";
  EXPECT_NEAR(loss, want[0], 1e-5 * std::abs(want[0]));
  double worst = 0;
  for (const PeftTensor& t : tensors) {
    const ParamInfo& p = model->layout().find(t.param);
    const Tensor ours = lora_rows(p, ParamLayout::view(model->grads(), p), t.part).view(t.shape);
    const Tensor want_grad = ref.get(t.name);
    // An expert no token was routed to has no gradient, here and there.
    if (ops::sum_squares(want_grad) == 0) {
      EXPECT_EQ(ops::sum_squares(ours), 0) << t.name;
      continue;
    }
    const double rel = max_rel_diff(ours, want_grad);
    worst = std::max(worst, rel);
    EXPECT_LT(rel, 1e-4) << t.name;
  }
  std::cout << "[ " << q.arch << " ] " << tensors.size()
            << " adapter gradients: worst max relative difference " << worst << "\n";
  // The base stays frozen: no gradient for an expert or (unless trained) a router.
  EXPECT_FALSE(model->layout().find("h.0.moe.up.weight").trainable);
  EXPECT_EQ(model->layout().find("h.0.moe.router.weight").trainable, q.train_router);

  // Reloaded from the files: the same logits, bit for bit; merged: within 1e-5.
  auto reloaded = attach_peft_adapter(*base, adapter);
  EXPECT_EQ(reloaded->config().lora.train_router, q.train_router);
  EXPECT_EQ(max_rel_diff(logits_of(*reloaded, tokens), logits), 0.0);
  auto merged = merge_adapters(*model);
  EXPECT_LT(max_rel_diff(logits_of(*merged, tokens), logits), 1e-5);
  // The adapters change the model: the base's logits are far from them.
  EXPECT_GT(max_rel_diff(logits_of(*base, tokens), logits), 1e-3);

  // Cached generation (prefill in chunks, then token by token) with the
  // experts' adapters gives the tokens of recomputing the whole sequence.
  std::vector<int32_t> prompt(tok.begin(), tok.begin() + 9);
  const std::vector<int32_t> full = greedy(*model, prompt, 8);
  Generator gen(*model, nullptr, 2, /*prefill_chunk=*/4);
  GenerationRequest req;
  req.prompt = prompt;
  req.max_new_tokens = 8;
  req.sampling.temperature = 0;
  const int64_t id = gen.submit(req);
  while (!gen.finished(id)) gen.step();
  EXPECT_EQ(gen.result(id).tokens, full);
}

INSTANTIATE_TEST_SUITE_P(
    Archs, MoeLora,
    ::testing::Values(
        MoeLoraCase{"mixtral",
                    {"q_proj", "v_proj", "w1", "w2", "w3"},
                    true,
                    "base_model.model.model.layers.1.block_sparse_moe.experts.3.w2.lora_B.weight",
                    "block_sparse_moe.gate"},
        // all-linear: every expert and the shared expert, not the routers;
        // the file's config names the modules (PEFT's all-linear would take
        // the routers too).
        MoeLoraCase{"qwen2_moe",
                    {"all-linear"},
                    false,
                    "base_model.model.model.layers.0.mlp.experts.2.gate_proj.lora_A.weight",
                    "mlp.gate"},
        MoeLoraCase{"qwen2_moe",
                    {"k_proj", "gate_proj", "down_proj"},
                    true,
                    "base_model.model.model.layers.1.mlp.shared_expert.down_proj.lora_A.weight",
                    "mlp.gate"}),
    [](const ::testing::TestParamInfo<MoeLoraCase>& i) {
      return std::string(i.param.arch) + (i.param.train_router ? "_router" : "_all_linear");
    });

// What stays refused names its key.
TEST(MoeLora, RefusalsNameTheKey) {
  ModelConfig c = model_preset("mixtral-tiny");
  c.lora.rank = 4;
  c.lora.target_modules = {"gate"};
  EXPECT_THROW(
      {
        try {
          validate_adapters(c, "peft.");
        } catch (const Error& e) {
          EXPECT_TRUE(contains(e.what(), "router")) << e.what();
          EXPECT_TRUE(contains(e.what(), "peft.train_router")) << e.what();
          throw;
        }
      },
      Error);
  ModelConfig ia3 = model_preset("mixtral-tiny");
  ia3.ia3.target_modules = {"k_proj"};
  EXPECT_THROW(
      {
        try {
          ia3.validate("model.");
        } catch (const Error& e) {
          EXPECT_TRUE(contains(e.what(), "IA3")) << e.what();
          EXPECT_TRUE(contains(e.what(), "peft.method")) << e.what();
          throw;
        }
      },
      Error);
}

}  // namespace
}  // namespace nk
