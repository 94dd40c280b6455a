// LoRA, IA3, bottleneck adapters and p-tuning (model/peft.h, nn/adapters.h,
// nn/prompt.h, ckpt/peft_adapter.h):
//  - parity with an independent PyTorch implementation (tests/peft/peft_reference.py,
//    Debian's python3-torch) reading the adapter in PEFT's format: logits,
//    loss with a prompt mask, every adapter gradient and the losses of 5
//    AdamW steps, to 1e-4 relative in fp32 (as tests/model/torch_parity_test.cc
//    argues: fp32 with other summation orders is ~1e-6 apart over 2 layers);
//    the base weights bit-identical after the steps;
//  - merged equals unmerged (1e-5 relative), and the KV-cache path equals
//    the full forward with adapters;
//  - PEFT files round-trip byte for byte; bad adapters are clear errors;
//  - dropout: off in evaluation, redrawn by seed, its gradient matches
//    finite differences.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/model_io.h"
#include "ckpt/peft_adapter.h"
#include "ckpt/safetensors.h"
#include "core/rng.h"
#include "model/parity_steps.h"
#include "model/tiny_config.h"
#include "tensor_util.h"
#include "test_paths.h"
#include "test_util.h"
#include "train/adamw.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::contains;

using test::f32_tensor;
using test::i32_tensor;

using test::host;
using test::rel_err;

LoraConfig lora(std::vector<std::string> targets, int64_t rank = 4, double alpha = 8) {
  LoraConfig l;
  l.rank = rank;
  l.alpha = alpha;
  l.target_modules = std::move(targets);
  return l;
}

ModelConfig without_adapters(ModelConfig c) {
  c.lora = LoraConfig();
  c.ia3 = Ia3Config();
  c.bottleneck = BottleneckConfig();
  c.prompt = PromptConfig();
  return c;
}

// The base names of a model with adapters: what a LoRA run freezes.
std::vector<std::string> base_names(const ModelConfig& c) {
  std::vector<std::string> out;
  const ParamLayout layout = Transformer::layout_for(c);
  for (const ParamInfo& p : layout.params())
    if (!p.adapter) out.push_back(p.name);
  return out;
}

// `base`'s weights with the adapters of `adapted` (LoRA's A as PEFT
// initialises it and B drawn with std `spread`; IA3's scales 1 + N(0,
// spread^2); a bottleneck's W_out with std `spread` and its norm's weight
// and bias as IA3's scales and N(0, spread^2): so that the adapters change
// the output; p-tuning's as initialised), the base frozen.
std::unique_ptr<Transformer> with_adapters(Transformer& base, const ModelConfig& adapted,
                                           float spread, uint64_t seed = 5) {
  const ModelConfig& c = adapted;
  auto m =
      std::make_unique<Transformer>(c, base.compute_dtype(), seed, ParamInit::Added, base_names(c));
  for (const ParamInfo& p : base.layout().params())
    ops::convert(ParamLayout::view(m->params(), m->layout().find(p.name)),
                 ParamLayout::view(base.params(), p));
  Rng rng(seed + 1);
  auto draw = [&](const std::string& name, float mean) {
    Tensor t = ParamLayout::view(m->params(), m->layout().find(name));
    std::vector<float> v(size_t(t.numel()));
    for (float& x : v) x = mean + float(rng.normal() * spread);
    ops::copy_from_host(t, v.data());
  };
  std::set<std::string> b;  // (the experts' B: one stacked tensor per layer's linear)
  for (const AdaptedModule& t : lora_targets(c))
    if (b.insert(t.b_name()).second) draw(t.b_name(), 0.f);
  for (const AdaptedModule& t : ia3_targets(c)) draw(t.ia3_name(), 1.f);
  for (const AdaptedModule& t : bottleneck_targets(c)) {
    draw(t.adapter_name("linear_out.weight"), 0.f);
    draw(t.adapter_name("ln.weight"), 1.f);
    draw(t.adapter_name("ln.bias"), 0.f);
  }
  m->sync_compute_params();
  return m;
}

std::unique_ptr<Transformer> with_lora(Transformer& base, const LoraConfig& l, float b_std) {
  ModelConfig c = base.config();
  c.lora = l;
  return with_adapters(base, c, b_std);
}

struct Batch {
  Tensor tokens, targets;
};

// Random tokens; the first 5 targets of each row ignored (the prompt mask).
Batch batch(const ModelConfig& c, int64_t B, int64_t T, uint64_t seed = 7) {
  Rng rng(seed);
  std::vector<int32_t> tok(size_t(B * T)), tgt(size_t(B * T));
  for (auto& t : tok) t = int32_t(rng.below(uint64_t(c.vocab_size)));
  for (size_t i = 0; i < tgt.size(); ++i)
    tgt[i] = i % size_t(T) < 5 ? int32_t(Transformer::kIgnoreIndex)
                               : int32_t(rng.below(uint64_t(c.vocab_size)));
  return {i32_tensor({B, T}, tok), i32_tensor({B, T}, tgt)};
}

std::vector<float> all_logits(Transformer& m, const Batch& b) {
  const int64_t B = b.tokens.dim(0), T = b.tokens.dim(1);
  Activations acts(m, B, T, false);
  Tensor logits = Tensor::empty({B * T, m.config().vocab_size}, DType::F32);
  m.forward_all_logits(acts, b.tokens, logits);
  return host(logits);
}

// The trainable tensors of c's adapters: their names for the reference and
// their parameters. PEFT's files, except p-tuning's, whose file holds the
// encoder's output: its encoder under PEFT's training names.
std::vector<PeftTensor> trainable_tensors(const ModelConfig& c) {
  if (!c.prompt.enabled()) return peft_tensors(c);
  const ParamLayout layout = Transformer::layout_for(c);
  const std::string enc = "prompt_encoder.default.";
  std::vector<PeftTensor> out = {
      {enc + "embedding.weight", kPromptTable, layout.find(kPromptTable).shape, ""}};
  for (const std::string& l : prompt_encoder_layers())
    for (const char* what : {".weight", ".bias"})
      out.push_back({enc + "mlp_head." + l.substr(l.rfind('.') + 1) + what, l + what,
                     layout.find(l + what).shape, ""});
  return out;
}

// `adapted`: a model config with adapters. With p-tuning the first tokens
// of each row are placeholders (any ids) whose targets the batch ignores.
void run_parity(const ModelConfig& adapted, const std::string& name) {
  const int64_t B = 2, T = 16;
  fs::path dir = fs::path(NK_BINARY_DIR) / "parity" / ("peft_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  const ModelConfig cfg = without_adapters(adapted);
  Transformer base(cfg, DType::F32, 42);
  auto model = with_adapters(base, adapted, 0.05f);
  save_model((dir / "model").string(), base);
  save_peft_adapter((dir / "adapter").string(), *model, "tiny");
  const ParamLayout& layout = model->layout();
  if (adapted.prompt.enabled()) {
    std::vector<std::pair<std::string, Tensor>> start;
    for (const PeftTensor& t : trainable_tensors(adapted))
      start.emplace_back(t.name, ParamLayout::view(model->params(), layout.find(t.param)));
    save_safetensors((dir / "ptuning.safetensors").string(), start);
  }
  Batch bt = batch(cfg, B, T);
  ASSERT_LT(adapted.prompt.virtual_tokens, 5);  // the ignored targets cover them
  save_safetensors((dir / "batch.safetensors").string(),
                   {{"tokens", bt.tokens}, {"targets", bt.targets}});

  // Only the adapters are trainable: the gradient arena holds nothing else.
  int64_t adapter_elems = 0;
  for (const ParamInfo& p : layout.params()) adapter_elems += p.adapter ? p.numel() : 0;
  EXPECT_LE(layout.trainable_end(), adapter_elems + 16 * int64_t(layout.params().size()));
  EXPECT_GE(layout.trainable_end(), adapter_elems);

  std::vector<std::pair<std::string, Tensor>> out = {
      {"logits", f32_tensor(all_logits(*model, bt)).view({B * T, cfg.vocab_size})}};
  Activations acts(*model, B, T, true);
  model->zero_grads();
  out.emplace_back("loss", f32_tensor({model->forward_backward(acts, bt.tokens, bt.targets, 1.f)}));
  for (const PeftTensor& t : trainable_tensors(model->config())) {
    Tensor g = Tensor::empty(t.shape, DType::F32);  // the file's shape (IA3: [out, 1], [1, in])
    ops::convert(g.view(layout.find(t.param).shape),
                 ParamLayout::view(model->grads(), layout.find(t.param)));
    out.emplace_back("grad." + t.name, g);
  }

  std::vector<float> base_before = host(
      model->params().narrow0(layout.trainable_end(), layout.total() - layout.trainable_end()));
  const std::vector<float> losses =
      test::ParitySteps().run(*model, acts, bt.tokens, bt.targets, dir);
  std::vector<float> base_after = host(
      model->params().narrow0(layout.trainable_end(), layout.total() - layout.trainable_end()));
  EXPECT_EQ(0, std::memcmp(base_before.data(), base_after.data(), base_before.size() * 4))
      << "the frozen base weights changed";
  EXPECT_NE(losses.front(), losses.back()) << "the adapters did not train";
  out.emplace_back("step_losses", f32_tensor(losses));
  save_safetensors((dir / "nekton.safetensors").string(), out);
  test::expect_python_reference_passes("peft/peft_reference.py", dir, name);
}

ModelConfig tiny(bool llama, const LoraConfig& l = {}) {
  ModelConfig c = test::tiny_config(llama, 97, 32);
  c.init_std = 0.02;
  c.lora = l;
  return c;
}

ModelConfig tiny_ia3(bool llama, std::vector<std::string> targets = {},
                     std::vector<std::string> feedforward = {}) {
  ModelConfig c = tiny(llama);
  c.ia3 = targets.empty() ? default_ia3(c) : Ia3Config{std::move(targets), std::move(feedforward)};
  return c;
}

// Llama: q, v, o and down adapted (fused q|k|v with k left out), rsLoRA scale.
TEST(LoraTorchParity, LlamaSomeModulesRsLora) {
  LoraConfig l = lora({"q_proj", "v_proj", "o_proj", "down_proj"}, 4, 8);
  l.rslora = true;
  run_parity(tiny(true, l), "llama");
}

// Every linear layer, gate|up included.
TEST(LoraTorchParity, LlamaAllLinear) {
  run_parity(tiny(true, lora({"all-linear"}, 8, 16)), "llama_all");
}

// GPT-2's fused c_attn as one module; c_proj names both projections.
TEST(LoraTorchParity, Gpt2) {
  run_parity(tiny(false, lora({"c_attn", "c_proj"}, 4, 4)), "gpt2");
}

// IA3 with PEFT's defaults: keys and values scaled, down_proj's input.
TEST(Ia3TorchParity, LlamaDefaults) {
  run_parity(tiny_ia3(true), "ia3_llama");
}

// Bottleneck adapters where NeMo puts them (linear_proj, linear_fc2), width 8.
ModelConfig tiny_bottleneck(bool llama,
                            std::vector<std::string> targets = {"linear_proj", "linear_fc2"}) {
  ModelConfig c = tiny(llama);
  c.bottleneck = BottleneckConfig{8, std::move(targets)};
  return c;
}

// P-tuning: 4 virtual tokens from an encoder of width 24.
ModelConfig tiny_prompt(bool llama, int64_t hidden = 24) {
  ModelConfig c = tiny(llama);
  c.prompt = PromptConfig{4, hidden};
  return c;
}

// Every layer by Megatron's names: the fused q|k|v and gate|up adapted whole.
TEST(AdapterTorchParity, LlamaEveryLayer) {
  run_parity(tiny_bottleneck(true, {"linear_qkv", "linear_proj", "linear_fc1", "linear_fc2"}),
             "adapter_llama");
}

// GPT-2: c_proj names both projections; c_attn and c_fc are whole layers too.
TEST(AdapterTorchParity, Gpt2EveryLayer) {
  run_parity(tiny_bottleneck(false, {"c_attn", "c_proj", "c_fc"}), "adapter_gpt2");
}

// Rotary positions: the virtual tokens are positions 0..3.
TEST(PTuningTorchParity, Llama) {
  run_parity(tiny_prompt(true), "ptuning_llama");
}

// Learned positions are added to the virtual tokens as to any input embedding.
TEST(PTuningTorchParity, Gpt2) {
  run_parity(tiny_prompt(false), "ptuning_gpt2");
}

// Outputs of fused parts (q, up) and a whole layer's input (o_proj).
TEST(Ia3TorchParity, LlamaOtherModules) {
  run_parity(tiny_ia3(true, {"q_proj", "up_proj", "o_proj"}, {"o_proj"}), "ia3_llama_other");
}

// GPT-2: the whole fused c_attn output (its biases scaled too), mlp.c_proj's input.
TEST(Ia3TorchParity, Gpt2Defaults) {
  run_parity(tiny_ia3(false), "ia3_gpt2");
}

TEST(Lora, TargetsByEveryNamingScheme) {
  ModelConfig c = tiny(true);
  auto modules = [&](std::vector<std::string> targets) {
    c.lora = lora(std::move(targets));
    std::vector<std::string> out;
    for (const AdaptedModule& t : lora_targets(c)) out.push_back(t.module);
    return out;
  };
  EXPECT_EQ(modules({"linear_qkv"}),
            (std::vector<std::string>{
                "model.layers.0.self_attn.q_proj", "model.layers.0.self_attn.k_proj",
                "model.layers.0.self_attn.v_proj", "model.layers.1.self_attn.q_proj",
                "model.layers.1.self_attn.k_proj", "model.layers.1.self_attn.v_proj"}));
  EXPECT_EQ(modules({"self_attn.o_proj", "linear_fc2"}).size(), 4u);
  EXPECT_EQ(modules({"all-linear"}).size(), 14u);  // 7 per layer, never the head
  c.lora = lora({"q_proj"});
  c.lora.rank = 3;
  const std::vector<AdaptedModule> t = lora_targets(c);
  EXPECT_EQ(t[0].a_name(), "h.0.attn.qkv.lora_a.q");
  EXPECT_EQ(t[0].rows, 32);
  EXPECT_EQ(peft_tensors(c)[1].name,
            "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight");
  ModelConfig g = tiny(false);
  g.lora = lora({"c_fc"});
  EXPECT_EQ(peft_tensors(g)[2].name, "base_model.model.transformer.h.1.mlp.c_fc.lora_A.weight");
  // IA3's vectors: an output part's [rows, 1] and a feedforward input's [1, in].
  const std::vector<PeftTensor> ia3 = peft_tensors(tiny_ia3(true));
  ASSERT_EQ(ia3.size(), 6u);
  EXPECT_EQ(ia3[0].name, "base_model.model.model.layers.0.self_attn.k_proj.ia3_l");
  EXPECT_EQ(ia3[0].param, "h.0.attn.qkv.ia3.k");
  EXPECT_EQ(ia3[0].shape, (Shape{16, 1}));
  EXPECT_EQ(ia3[2].param, "h.0.mlp.down.ia3_in");
  EXPECT_EQ(ia3[2].shape, (Shape{1, 48}));
  try {
    peft_tensors(tiny_ia3(true, {"up_proj"}, {"up_proj"}));
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "IA3 scales the input of whole layers only")) << e.what();
  }
  g.lora = lora({"q_proj"});
  try {
    lora_targets(g);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "'q_proj' matches no linear layer of this GPT-2 model"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "c_attn, c_proj, c_fc, c_proj")) << e.what();
  }
}

// Under tensor parallelism each adapter is split as its layer is: over a
// column-parallel layer LoRA's A whole and B by the layer's rows (a whole
// fused layer's B by each part's rows, as the weight), over a row-parallel
// one A by its columns and B whole; IA3's output scales by the rows they
// scale, an input scale by the columns. So rank r's B rows are exactly the
// rows of the weight it holds, and its A columns the weight's columns.
TEST(Lora, SplitAsTheirLayersUnderTensorParallelism) {
  auto rows_of = [](const ParamInfo& p, int64_t r) {
    std::vector<std::pair<int64_t, int64_t>> out;
    for (const SliceRange& s : shard_ranges(p, r, 2)) out.emplace_back(s.start, s.len);
    return out;
  };
  for (bool llama : {true, false}) {
    const ModelConfig c = tiny(llama, lora({"all-linear"}));
    const ParamLayout layout = Transformer::layout_for(c);
    for (const AdaptedModule& t : lora_targets(c)) {
      SCOPED_TRACE(t.module);
      const ParamInfo &w = layout.find(t.linear + ".weight"), &a = layout.find(t.a_name()),
                      &b = layout.find(t.b_name());
      if (w.split == Split::Rows) {
        EXPECT_EQ(a.split, Split::Replicated);
        EXPECT_EQ(b.split, Split::Rows);
        for (int64_t r = 0; r < 2; ++r) {
          // The weight's rows of this module's part, from 0.
          std::vector<std::pair<int64_t, int64_t>> want;
          for (const SliceRange& s : shard_ranges(w, r, 2, t.part))
            want.emplace_back(s.start - t.col0, s.len);
          EXPECT_EQ(rows_of(b, r), want);
        }
      } else {
        ASSERT_EQ(w.split, Split::Cols);
        EXPECT_EQ(a.split, Split::Cols);
        EXPECT_EQ(b.split, Split::Replicated);
        EXPECT_EQ(shard_shape(a, 2), (Shape{4, w.shape[1] / 2}));
      }
    }
    // GPT-2's c_attn is one module over [q | k | v]: B has those parts.
    if (!llama) {
      EXPECT_EQ(layout.find("h.0.attn.qkv.lora_b").parts.size(), 3u);
    }
  }
  const ModelConfig i = tiny_ia3(true, {"k_proj", "o_proj", "down_proj"}, {"down_proj"});
  const ParamLayout layout = Transformer::layout_for(i);
  EXPECT_EQ(layout.find("h.0.attn.qkv.ia3.k").split, Split::Rows);
  EXPECT_EQ(layout.find("h.0.attn.proj.ia3").split, Split::Replicated);
  EXPECT_EQ(layout.find("h.0.mlp.down.ia3_in").split, Split::Rows);
  // The ranks' output columns of a part start at its share's first row.
  const ParamLayout shard = layout.shard(2);
  EXPECT_EQ(shard.find("h.0.attn.qkv.weight").part("k").row0,
            layout.find("h.0.attn.qkv.weight").part("k").row0 / 2);
  // A MoE layer's experts' stacked A and B: split over the expert-parallel
  // ranks by experts, each expert's over the tensor-parallel ones as its
  // weight (gate | up by rows, down by columns).
  ModelConfig moe = model_preset("mixtral-tiny");
  moe.lora = lora({"all-linear"});
  const ParamLayout m = Transformer::layout_for(moe);
  const ParamInfo &up_b = m.find("h.0.moe.up.lora_b"), &down_a = m.find("h.0.moe.down.lora_a");
  EXPECT_EQ(up_b.split, Split::Experts);
  EXPECT_EQ(up_b.expert_split, Split::Rows);
  EXPECT_EQ(m.find("h.0.moe.up.lora_a").expert_split, Split::Replicated);
  EXPECT_EQ(down_a.expert_split, Split::Cols);
  EXPECT_EQ(m.find("h.0.moe.down.lora_b").expert_split, Split::Replicated);
  // Rank 1 of 2 holds the second half of every expert's gate and up rows.
  const ParamInfo up_w = tensor_split(m.find("h.0.moe.up.weight"));
  EXPECT_EQ(shard_ranges(tensor_split(up_b), 1, 2, "e2.up")[0].start - up_b.part("e2.up").row0,
            shard_ranges(up_w, 1, 2, "e2.up")[0].start - up_w.part("e2.up").row0);
  EXPECT_EQ(m.shard(2).find("h.0.moe.down.lora_a").shape[1], moe.expert_d_ff() / 2);
}

// W + s B A gives the adapters' logits (fp32; 1e-5: one rounding of the
// merged weight per element against two products).
// Every kind of adapter the tests use, on Llama and GPT-2.
std::vector<ModelConfig> adapted_configs() {
  return {tiny(true, lora({"all-linear"}, 4, 16)), tiny(false, lora({"all-linear"}, 4, 16)),
          tiny_ia3(true), tiny_ia3(false),
          tiny_ia3(true, {"q_proj", "up_proj", "o_proj"}, {"o_proj"})};
}

// The adapters folded into the weights give their logits (fp32; 1e-5: one
// rounding of the merged weight per element against two products); those
// that do not fold in are refused by name.
TEST(Peft, MergedEqualsUnmerged) {
  for (const ModelConfig& c : {tiny_bottleneck(true), tiny_prompt(false)}) {
    Transformer base(without_adapters(c), DType::F32, 3);
    auto m = with_adapters(base, c, 0.1f);
    const std::string e = test::error_of([&] { merge_adapters(*m); });
    EXPECT_TRUE(contains(e, c.prompt.enabled() ? "p-tuning's virtual tokens" : "bottleneck")) << e;
  }
  for (const ModelConfig& c : adapted_configs()) {
    Transformer base(without_adapters(c), DType::F32, 3);
    auto m = with_adapters(base, c, 0.1f);
    Batch bt = batch(c, 2, 12);
    const std::vector<float> unmerged = all_logits(*m, bt), plain = all_logits(base, bt);
    auto merged = merge_adapters(*m);
    EXPECT_FALSE(merged->config().lora.enabled() || merged->config().ia3.enabled());
    EXPECT_LE(rel_err(all_logits(*merged, bt), unmerged), 1e-5) << model_config_to_json(c);
    EXPECT_GT(rel_err(plain, unmerged), 1e-3) << "the adapters must matter";
  }
}

// Incremental decoding over the KV cache applies the adapters as the full
// forward does (fp32; 1e-5 relative: two attention kernels).
TEST(Peft, KvCachePathMatchesFullForward) {
  std::vector<ModelConfig> configs = adapted_configs();
  for (bool llama : {true, false}) {
    configs.push_back(tiny_bottleneck(llama, {"linear_proj", "linear_fc1", "linear_fc2"}));
    configs.push_back(tiny_prompt(llama));
    configs.push_back(tiny_prompt(llama, 0));  // a stored prompt: the table alone
  }
  for (const ModelConfig& c : configs) {
    Transformer base(without_adapters(c), DType::F32, 3);
    auto m = with_adapters(base, c, 0.1f);
    const int64_t T = 12, V = c.vocab_size;
    Batch bt = batch(c, 1, T);
    const std::vector<float> full = all_logits(*m, bt);
    KVCache cache(c, DType::F32, 1, T, T);
    std::vector<int32_t> tok(T), slot(T, 0), pos(T), rows(T);
    ops::copy_bytes_to_host(bt.tokens, tok.data());
    for (int32_t i = 0; i < int32_t(T); ++i) pos[size_t(i)] = rows[size_t(i)] = i;
    Tensor lg = Tensor::empty({T, V}, DType::F32);
    const std::vector<int32_t> table{0};
    m->forward_cached(cache, CachedStep{tok, slot, pos, rows, table}, lg);
    EXPECT_LE(rel_err(host(lg), full), 1e-5) << model_config_to_json(c);
  }
}

class PeftFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = std::make_unique<Transformer>(tiny(true), DType::F32, 3);
    model_ = with_lora(*base_, lora({"q_proj", "v_proj", "down_proj"}, 4, 16), 0.1f);
    save_peft_adapter(d_ / "a", *model_, "tiny-llama");
  }
  std::string error_of(const std::string& dir) {
    try {
      attach_peft_adapter(*base_, dir);
    } catch (const Error& e) {
      return e.what();
    }
    return "no error";
  }
  // A copy of adapter "a" with its config edited.
  std::string edited(const std::string& name, const std::function<void(nlohmann::json&)>& edit) {
    fs::copy(d_.path() / "a", d_.path() / name, fs::copy_options::recursive);
    nlohmann::json j =
        nlohmann::json::parse(test::read_file(d_.path() / name / "adapter_config.json"));
    edit(j);
    std::ofstream(d_.path() / name / "adapter_config.json") << j.dump(2);
    return d_ / name;
  }
  // m's adapter, saved as DIR (already) and read back: its PEFT type, the
  // same logits, and the same bytes when saved again.
  void expect_round_trip(Transformer& m, const std::string& dir, const std::string& type) {
    PeftAdapterInfo info;
    auto back = attach_peft_adapter(*base_, d_ / dir, &info);
    EXPECT_EQ(info.type, type);
    Batch bt = batch(back->config(), 1, 8);
    EXPECT_EQ(all_logits(*back, bt), all_logits(m, bt));
    save_peft_adapter(d_ / (dir + "_again"), *back, info.base_model, info.dtype);
    for (const char* f : {"adapter_model.safetensors", "adapter_config.json"})
      EXPECT_EQ(test::read_file(d_.path() / dir / f),
                test::read_file(d_.path() / (dir + "_again") / f))
          << f;
  }
  test::TempDir d_{"nk_peft"};
  std::unique_ptr<Transformer> base_, model_;
};

TEST_F(PeftFiles, ConfigIsPeftsAndLoadsBack) {
  nlohmann::json j =
      nlohmann::json::parse(test::read_file(d_.path() / "a" / "adapter_config.json"));
  EXPECT_EQ(j["peft_type"], "LORA");
  EXPECT_EQ(j["r"], 4);
  EXPECT_EQ(j["lora_alpha"], 16);
  EXPECT_EQ(j["target_modules"], (nlohmann::json{"down_proj", "q_proj", "v_proj"}));
  EXPECT_EQ(j["task_type"], "CAUSAL_LM");
  EXPECT_EQ(j["base_model_name_or_path"], "tiny-llama");
  PeftAdapterInfo info;
  auto back = attach_peft_adapter(*base_, d_ / "a", &info);
  EXPECT_EQ(info.lora.scale(), 4.0);
  Batch bt = batch(back->config(), 1, 8);
  EXPECT_EQ(all_logits(*back, bt), all_logits(*model_, bt));
}

// Import then export reproduces the files byte for byte: Nekton's own (f32
// and bf16), and one laid out by an independent writer as the safetensors
// library does (compact header, metadata first, tensors sorted by name).
TEST_F(PeftFiles, RoundTripsByteForByte) {
  for (DType dt : {DType::F32, DType::BF16}) {
    save_peft_adapter(d_ / "first", *model_, "tiny-llama", dt);
    PeftAdapterInfo info;
    auto back = attach_peft_adapter(*base_, d_ / "first", &info);
    EXPECT_EQ(info.dtype, dt);
    save_peft_adapter(d_ / "second", *back, info.base_model, info.dtype);
    for (const char* f : {"adapter_model.safetensors", "adapter_config.json"})
      EXPECT_EQ(test::read_file(d_.path() / "first" / f), test::read_file(d_.path() / "second" / f))
          << f << " " << dtype_name(dt);
  }
  fs::create_directories(d_ / "py");
  fs::copy_file(d_.path() / "a" / "adapter_config.json", d_.path() / "py" / "adapter_config.json");
  const std::string script = fmt::format(
      R"(import json, struct, sys
sys.path.insert(0, "{0}/tests")
from safetensors_np import read_safetensors
t = read_safetensors("{1}/a/adapter_model.safetensors")
header, blobs, off = {{"__metadata__": {{"format": "pt"}}}}, [], 0
for name in sorted(t):
    raw = t[name].astype("<f4").tobytes()
    header[name] = {{"dtype": "F32", "shape": list(t[name].shape), "data_offsets": [off, off + len(raw)]}}
    blobs.append(raw)
    off += len(raw)
text = json.dumps(header, separators=(",", ":")).encode()
text += b" " * ((8 - len(text) % 8) % 8)
with open("{1}/py/adapter_model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
)",
      NK_SOURCE_DIR, d_.path().string());
  std::ofstream(d_ / "write.py") << script;
  ASSERT_EQ(std::system(("/usr/bin/python3 " + std::string(d_ / "write.py")).c_str()), 0);
  auto back = attach_peft_adapter(*base_, d_ / "py");
  save_peft_adapter(d_ / "py_again", *back, "tiny-llama");
  EXPECT_EQ(test::read_file(d_.path() / "py" / "adapter_model.safetensors"),
            test::read_file(d_.path() / "py_again" / "adapter_model.safetensors"));
}

// IA3: PEFT's keys, and import then export reproduces both files byte for byte.
TEST_F(PeftFiles, Ia3ConfigAndRoundTrip) {
  auto m = with_adapters(*base_, tiny_ia3(true), 0.1f);
  save_peft_adapter(d_ / "ia3", *m, "tiny-llama");
  nlohmann::json j =
      nlohmann::json::parse(test::read_file(d_.path() / "ia3" / "adapter_config.json"));
  EXPECT_EQ(j["peft_type"], "IA3");
  EXPECT_EQ(j["target_modules"], (nlohmann::json{"down_proj", "k_proj", "v_proj"}));
  EXPECT_EQ(j["feedforward_modules"], (nlohmann::json{"down_proj"}));
  expect_round_trip(*m, "ia3", "IA3");
}

// Bottleneck adapters: Nekton's BOTTLENECK_ADAPTER files, NeMo's tensor
// names under the module path (a fused layer by Megatron's name), and a
// byte-for-byte round trip.
TEST_F(PeftFiles, BottleneckConfigAndRoundTrip) {
  auto m = with_adapters(*base_, tiny_bottleneck(true, {"linear_qkv", "o_proj"}), 0.1f);
  save_peft_adapter(d_ / "bn", *m, "tiny-llama");
  nlohmann::json j =
      nlohmann::json::parse(test::read_file(d_.path() / "bn" / "adapter_config.json"));
  EXPECT_EQ(j["peft_type"], "BOTTLENECK_ADAPTER");
  EXPECT_EQ(j["adapter_dim"], 8);
  EXPECT_EQ(j["norm_position"], "pre");
  EXPECT_EQ(j["activation"], "swish");
  const SafetensorsFile f =
      SafetensorsFile::open((d_.path() / "bn" / "adapter_model.safetensors").string());
  EXPECT_EQ(f.entries().size(), 16u);  // 4 tensors x 2 modules x 2 layers
  EXPECT_TRUE(
      f.has("base_model.model.model.layers.1.self_attn.linear_qkv.adapter.linear_in.weight"));
  EXPECT_EQ(
      f.entry("base_model.model.model.layers.0.self_attn.o_proj.adapter.linear_out.weight").shape,
      (Shape{32, 8}));
  expect_round_trip(*m, "bn", "BOTTLENECK_ADAPTER");
  // A part of a fused layer alone cannot carry one.
  const std::string e =
      test::error_of([] { bottleneck_targets(tiny_bottleneck(true, {"q_proj"})); });
  EXPECT_TRUE(contains(e,
                       "'model.layers.0.self_attn.q_proj' is one part of a fused layer "
                       "(h.0.attn.qkv)"))
      << e;
}

// P-tuning: PEFT's P_TUNING file holds the encoder's output; read back, the
// prompt is that table (no encoder) and gives the same logits, before the
// text and in the KV-cache path; a prompt for another width is refused.
TEST_F(PeftFiles, PTuningSavesTheEncodersOutput) {
  auto m = with_adapters(*base_, tiny_prompt(true), 0.1f);
  save_peft_adapter(d_ / "pt", *m, "tiny-llama");
  nlohmann::json j =
      nlohmann::json::parse(test::read_file(d_.path() / "pt" / "adapter_config.json"));
  EXPECT_EQ(j["peft_type"], "P_TUNING");
  EXPECT_EQ(j["num_virtual_tokens"], 4);
  EXPECT_EQ(j["token_dim"], 32);
  EXPECT_EQ(j["encoder_hidden_size"], 24);
  EXPECT_EQ(j["encoder_reparameterization_type"], "MLP");
  const SafetensorsFile f =
      SafetensorsFile::open((d_.path() / "pt" / "adapter_model.safetensors").string());
  ASSERT_EQ(f.entries().size(), 1u);
  EXPECT_EQ(host(f.get("prompt_embeddings")), host(m->prompt_f32()));
  PeftAdapterInfo info;
  auto back = attach_peft_adapter(*base_, d_ / "pt", &info);
  EXPECT_EQ(info.prompt.virtual_tokens, 4);
  EXPECT_EQ(back->config().prompt.encoder_hidden, 0);
  Batch bt = batch(back->config(), 2, 10);
  EXPECT_LE(rel_err(all_logits(*back, bt), all_logits(*m, bt)), 1e-6);
  // Saved again it is PEFT's prompt tuning (a table), with the same tensor.
  save_peft_adapter(d_ / "pt_again", *back, info.base_model, info.dtype);
  EXPECT_EQ(nlohmann::json::parse(
                test::read_file(d_.path() / "pt_again" / "adapter_config.json"))["peft_type"],
            "PROMPT_TUNING");
  EXPECT_EQ(test::read_file(d_.path() / "pt" / "adapter_model.safetensors"),
            test::read_file(d_.path() / "pt_again" / "adapter_model.safetensors"));
  std::string e = error_of(edited("pt_wide", [](auto& j) {
    j["peft_type"] = "P_TUNING";
    j["num_virtual_tokens"] = 4;
    j["token_dim"] = 64;
  }));
  EXPECT_TRUE(contains(e, "'token_dim' is 64, this base model's width is 32")) << e;
}

TEST_F(PeftFiles, BadAdaptersAreClearErrors) {
  // Another base shape: an adapter of a wider model.
  ModelConfig wide = tiny(true);
  wide.d_model = 64;
  Transformer wide_base(wide, DType::F32, 3);
  save_peft_adapter(d_ / "wide", *with_lora(wide_base, lora({"q_proj"}), 0.1f), "wide");
  std::string e = error_of(d_ / "wide");
  EXPECT_TRUE(contains(e,
                       "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has "
                       "shape [4, 64], this Llama base model needs [4, 32]"))
      << e;
  EXPECT_TRUE(contains(error_of(edited("type", [](auto& j) { j["peft_type"] = "PREFIX_TUNING"; })),
                       "'peft_type' is \"PREFIX_TUNING\", Nekton reads LORA, IA3, P_TUNING and "
                       "PROMPT_TUNING adapters"));
  EXPECT_TRUE(contains(error_of(edited("dora", [](auto& j) { j["use_dora"] = true; })),
                       "'use_dora' = true is not supported (DoRA)"));
  EXPECT_TRUE(contains(error_of(edited("ranks",
                                       [](auto& j) {
                                         j["rank_pattern"] = {{"q_proj", 8}};
                                       })),
                       "'rank_pattern'"));
  EXPECT_TRUE(
      contains(error_of(edited("target", [](auto& j) { j["target_modules"] = {"c_attn"}; })),
               "'c_attn' matches no linear layer of this Llama model"));
  // target_modules naming more than the file holds: a missing tensor.
  e = error_of(edited("more", [](auto& j) {
    j["target_modules"] = {"q_proj", "v_proj", "down_proj", "o_proj"};
  }));
  EXPECT_TRUE(contains(
      e, "missing tensor 'base_model.model.model.layers.0.self_attn.o_proj.lora_A.weight'"))
      << e;
  // ... and fewer: a tensor no target explains.
  e = error_of(edited("fewer", [](auto& j) { j["target_modules"] = {"q_proj", "v_proj"}; }));
  EXPECT_TRUE(contains(e, "mlp.down_proj.lora_A.weight' is not a LoRA weight of a target module"))
      << e;
  EXPECT_TRUE(contains(error_of(d_ / "nothing"), "cannot read")) << error_of(d_ / "nothing");
}

// Issue 44, item 11: lora_alpha 1e30 once loaded and made every logit NaN
// (generate printed logprob -nan with exit 0); fan_in_fan_out true on a Llama
// adapter was taken silently.
TEST_F(PeftFiles, ScalingsThatOverflowAreRefusedNamingTheKey) {
  std::string e = error_of(edited("huge", [](auto& j) { j["lora_alpha"] = 1e30; }));
  EXPECT_TRUE(contains(e, "adapter_config.json")) << e;
  EXPECT_TRUE(contains(e,
                       "lora_alpha: 1e+30 gives a LoRA scaling (lora_alpha / r) of 2.5e+29, "
                       "beyond 10000"))
      << e;
  e = error_of(edited("rs", [](auto& j) {
    j["lora_alpha"] = 1e6;
    j["use_rslora"] = true;
  }));
  EXPECT_TRUE(contains(e, "(lora_alpha / sqrt(r)) of 500000")) << e;
  EXPECT_EQ(error_of(edited("fine", [](auto& j) { j["lora_alpha"] = 4e4; })), "no error");
  EXPECT_TRUE(contains(error_of(edited("neg", [](auto& j) { j["lora_alpha"] = -1; })),
                       "lora_alpha: must be a positive number, got -1"));
  EXPECT_TRUE(contains(error_of(edited("fifo", [](auto& j) { j["fan_in_fan_out"] = "yes"; })),
                       "'fan_in_fan_out' must be true or false, got \"yes\""));
  // Llama's modules are nn.Linear: PEFT applies fan_in_fan_out=true as false,
  // with a warning, and so does Nekton (the tensors are the same).
  const std::string dir = edited("fifo_true", [](auto& j) { j["fan_in_fan_out"] = true; });
  testing::internal::CaptureStderr();
  const std::string e2 = error_of(dir);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_EQ(e2, "no error");
  EXPECT_TRUE(contains(err, "'fan_in_fan_out' is true but Llama's modules are nn.Linear")) << err;
}

// Finite adapters whose product overflows when folded into the base.
TEST(Lora, MergeRefusesWeightsThatOverflow) {
  Transformer base(tiny(true), DType::F32, 3);
  auto m = with_lora(base, lora({"q_proj"}, 4, 16), 0.1f);
  const ParamInfo& b = m->layout().find("h.0.attn.qkv.lora_b.q");
  const ParamInfo& a = m->layout().find("h.0.attn.qkv.lora_a.q");
  ops::fill(ParamLayout::view(m->params(), b), 1e19f);
  ops::fill(ParamLayout::view(m->params(), a), 1e19f);
  m->sync_compute_params();
  EXPECT_TRUE(contains(test::error_of([&] { merge_adapters(*m); }), "merging the adapters left"))
      << test::error_of([&] { merge_adapters(*m); });
}

// Dropout on the adapters' input: none when evaluating, the same mask for
// the same seed, another for another, and a gradient that is the derivative
// of the loss under that mask (central differences, fp32: 2e-2 relative).
TEST(Lora, DropoutIsSeededAndDifferentiable) {
  Transformer base(tiny(true), DType::F32, 3);
  LoraConfig l = lora({"all-linear"}, 4, 16);
  auto plain = with_lora(base, l, 0.1f);
  l.dropout = 0.3;
  auto m = with_lora(base, l, 0.1f);
  Batch bt = batch(m->config(), 2, 12);
  Activations eval(*m, 2, 12, false), eval_plain(*plain, 2, 12, false);
  EXPECT_EQ(m->forward_loss(eval, bt.tokens, bt.targets),
            plain->forward_loss(eval_plain, bt.tokens, bt.targets));
  Activations acts(*m, 2, 12, true);
  auto loss = [&](uint64_t seed) {
    m->set_dropout_seed(seed);
    m->zero_grads();
    return m->forward_backward(acts, bt.tokens, bt.targets, 1.f);
  };
  const float l1 = loss(1);
  EXPECT_EQ(loss(1), l1);
  EXPECT_NE(loss(2), l1);
  loss(1);
  for (const std::string name : {"h.0.attn.qkv.lora_a.q", "h.1.mlp.up.lora_b.gate"}) {
    const ParamInfo& p = m->layout().find(name);
    const std::vector<float> g = host(ParamLayout::view(m->grads(), p));
    size_t at = 0;  // the largest gradient entry
    for (size_t i = 0; i < g.size(); ++i)
      if (std::abs(g[i]) > std::abs(g[at])) at = i;
    Tensor w = ParamLayout::view(m->params(), p).view({p.numel()}).narrow0(int64_t(at), 1);
    const float w0 = host(w)[0], h = 3e-3f;
    auto train_loss = [&](float v) {
      ops::fill(w, v);
      m->sync_compute_params();
      return double(loss(1));
    };
    const double fd = (train_loss(w0 + h) - train_loss(w0 - h)) / (2 * h);
    train_loss(w0);
    EXPECT_NEAR(fd, g[at], 2e-2 * std::abs(g[at]) + 1e-5) << name;
  }
}

}  // namespace
}  // namespace nk
