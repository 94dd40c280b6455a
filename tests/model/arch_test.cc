// The architecture registry: each architecture's layout and external tensor
// maps agree with each other, and unknown names are clear errors.
#include "model/arch.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "model/tiny_config.h"
#include "test_util.h"

namespace nk {
namespace {

// A config of architecture `a` small enough to enumerate.
ModelConfig small(const Architecture& a) {
  ModelConfig c = test::tiny_config(!a.block().learned_positions, 64, 16);
  c.arch = a.name();
  if (a.block().learned_positions) c.n_kv_head = c.n_head;
  if (a.moe()) c.num_experts = 3;  // Mixtral: experts' parts are covered too
  // A shared expert (and its gate) as the family's presets have one.
  for (const std::string& name : model_preset_names()) {
    const ModelConfig p = model_preset(name);
    if (p.arch != a.name()) continue;
    c.moe_shared_d_ff = p.moe_shared_d_ff > 0 ? 24 : 0;
    c.moe_shared_expert_gate = p.moe_shared_expert_gate;
    // Its router (dots1: sigmoid scores with a score bias) and leading
    // dense layers, so that both kinds of layer are covered.
    c.moe_score_func = p.moe_score_func;
    c.moe_score_bias = p.moe_score_bias;
    c.moe_first_dense_layers = std::min(p.moe_first_dense_layers, c.n_layer - 1);
    // Multi-head Latent Attention (DeepSeek): its projections' sizes, a key
    // and a value per head.
    if (p.mla()) {
      c.q_lora_rank = p.q_lora_rank;
      c.kv_lora_rank = p.kv_lora_rank;
      c.qk_rope_head_dim = p.qk_rope_head_dim;
      c.v_head_dim = p.v_head_dim;
      c.attn_head_dim = p.attn_head_dim;
      c.n_kv_head = c.n_head;
    }
    break;
  }
  return c;
}

// Each external tensor names an existing parameter (and part); together they
// cover every row of every parameter exactly once.
void expect_covers(const ModelConfig& c, const std::vector<ExternalTensor>& map,
                   const std::string& what) {
  ParamLayout l = model_layout(c);
  std::map<std::string, int64_t> rows;
  for (const ExternalTensor& e : map) {
    ASSERT_TRUE(l.has(e.param)) << what << ": " << e.name << " -> " << e.param;
    // A tied head written to output.weight as well, for llama.cpp graphs
    // that require one (qwen2moe, dots1): a copy, not a second home.
    if (e.name == "output.weight" && e.param == "wte") continue;
    const ParamInfo& p = l.find(e.param);
    if (e.head_split > 0) {  // MLA's attn_k_b / attn_v_b: head_rows of each head's block
      EXPECT_EQ(p.shape[0] % e.head_split, 0) << what << " " << e.name;
      EXPECT_LE(e.head_row0 + e.head_rows, p.shape[0] / e.head_split) << what << " " << e.name;
      rows[e.param] += e.head_split * e.head_rows;
      continue;
    }
    if (e.experts > 0) {  // a stacked GGUF expert tensor: part e.part with "{}" = 0..experts-1
      for (int64_t x = 0; x < e.experts; ++x)
        rows[e.param] += p.part(fmt::format(fmt::runtime(e.part), x)).rows;
      continue;
    }
    rows[e.param] += e.part.empty() ? p.shape[0] : p.part(e.part).rows;
  }
  for (const ParamInfo& p : l.params())
    EXPECT_EQ(rows[p.name], p.shape[0]) << what << " " << p.name;
}

TEST(Architecture, ExternalMapsCoverTheLayout) {
  for (const Architecture* a : architectures()) {
    for (bool tied : {false, true}) {
      ModelConfig c = small(*a);
      c.tied_embeddings = tied;
      c.validate();
      expect_covers(c, a->hf_tensors(c, a->hf_tensor_prefix()), a->name() + " hf");
      if (!a->gguf_arch().empty()) {
        // llama.cpp's dots1 has no grouped-query attention: its map refuses
        // fewer key/value heads by name, and covers the layout with as many.
        ModelConfig g = c;
        const std::string e = test::error_of([&] { a->gguf_tensors(g); });
        if (e != "(no error)") {
          EXPECT_TRUE(test::contains(e, "model.n_kv_head")) << a->name() << ": " << e;
          g.n_kv_head = g.n_head;
        }
        // deepseek2's kv_b: split (attn_k_b, attn_v_b) or whole (attn_kv_b),
        // each layout covering it alone.
        for (ExternalTensor::KvB skip :
             {ExternalTensor::KvB::Unsplit, ExternalTensor::KvB::Split}) {
          std::vector<ExternalTensor> map;
          for (const ExternalTensor& e : a->gguf_tensors(g))
            if (e.kv_b != skip) map.push_back(e);
          expect_covers(g, map, a->name() + " gguf");
        }
      }
      EXPECT_FALSE(a->hf_classes().empty()) << a->name();
    }
  }
}

TEST(Architecture, PresetsBelongToTheirArchitecture) {
  for (const std::string& name : model_preset_names()) {
    ModelConfig c = model_preset(name);
    EXPECT_NO_THROW(c.validate()) << name;
    EXPECT_EQ(c.architecture().name(), c.arch) << name;
  }
}

TEST(Architecture, UnknownNameListsTheKnownOnes) {
  std::string e = test::error_of([] { find_architecture("mamba"); });
  EXPECT_TRUE(test::contains(e, "unknown architecture 'mamba'")) << e;
  for (const std::string& n : architecture_names()) EXPECT_TRUE(test::contains(e, n)) << e;
  ModelConfig c = small(find_architecture("llama"));
  c.arch = "mamba";
  e = test::error_of([&] { c.validate(); });
  EXPECT_TRUE(test::contains(e, "model.arch:")) << e;
}

}  // namespace
}  // namespace nk
