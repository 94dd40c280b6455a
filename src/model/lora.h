// LoRA adapters as part of a model: which linear layers (or fused parts of
// them) a config adapts, the adapter parameters in the model's layout, and
// merging them into the base weights. The nn block is nn/lora.h; Hugging Face
// PEFT's file format is ckpt/peft_adapter.h.
//
// Target modules are named as users of PEFT and NeMo name them: Hugging Face
// module names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj,
// down_proj; GPT-2's c_attn, c_proj, c_fc), any dotted suffix of a module's
// path (self_attn.q_proj, attn.c_proj), Megatron's linear_qkv, linear_proj,
// linear_fc1, linear_fc2, or all-linear (every linear layer of the blocks;
// never the LM head).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace nk {

struct ModelConfig;
class ParamLayout;
class Transformer;

struct LoraConfig {
  int64_t rank = 0;  // r; 0: no adapters
  double alpha = 16;
  double dropout = 0;   // on the adapters' input, in training
  bool rslora = false;  // scale alpha / sqrt(r) (rank-stabilised) instead of alpha / r
  std::vector<std::string> target_modules;
  bool enabled() const { return rank > 0; }
  double scale() const;
};

// One adapted module: LoRA's A and B for rows [col0, col0 + rows) of a
// linear layer's output (a fused part, or the whole layer).
struct LoraTarget {
  std::string linear;  // Nekton's layer, "h.0.attn.qkv"
  std::string part;    // its fused part ("q"), or "" for the whole layer
  std::string module;  // the Hugging Face module path, "model.layers.0.self_attn.q_proj"
  int64_t col0 = 0, rows = 0, in = 0;
  std::string a_name() const;  // the layout's names: "h.0.attn.qkv.lora_a.q"
  std::string b_name() const;
};

// The modules c.lora adapts, in layer order. nk::Error naming the target
// (and the names there are) for a target that matches nothing.
std::vector<LoraTarget> lora_targets(const ModelConfig& c);
// The sizes LoRA's workspaces are planned from: per layer, how many parts
// each of its linear layers adapts (attn.qkv, attn.proj, mlp.up, mlp.down),
// and the largest part and input.
struct LoraSizes {
  int64_t rank = 0, max_rows = 0, max_in = 0;
  std::vector<std::array<int64_t, 4>> parts;  // [n_layer]
};
LoraSizes lora_sizes(const ModelConfig& c);
// Which of the four a linear layer's name is ("h.3.mlp.up": 2), or -1.
int lora_linear_slot(const std::string& linear);

// Adds A (uniform in +-1/sqrt(in), as PEFT's default) and B (zeros) of every
// target to an unfinished layout holding c's base parameters.
void add_lora_params(ParamLayout& p, const ModelConfig& c);
// Checks c.lora (nk::Error naming prefix + key): rank within limits, alpha
// positive, dropout in [0, 1), at least one target, each matching.
void validate_lora(const ModelConfig& c, const std::string& prefix);

// A model without adapters whose weights are the base's plus scale * B A of
// every adapter (W' = W + s B A per part), in f32.
std::unique_ptr<Transformer> merge_lora(const Transformer& model);

}  // namespace nk
