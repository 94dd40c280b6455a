// Parameter-efficient adapters as part of a model: which linear layers (or
// fused parts of them) a config adapts, the adapter parameters in the
// model's layout, and merging them into the base weights. The nn blocks are
// nn/adapters.h; Hugging Face PEFT's file format is ckpt/peft_adapter.h.
//
//  - LoRA: A [r, in] and B [rows, r] per adapted module.
//  - IA3: a vector of ones at the start per adapted module, scaling its
//    output (keys and values) or, for feedforward modules, its input (the
//    MLP's inner activation entering down_proj).
//
// Modules are named as users of PEFT and NeMo name them: Hugging Face module
// names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
// GPT-2's c_attn, c_proj, c_fc), any dotted suffix of a module's path
// (self_attn.q_proj, mlp.c_proj), Megatron's linear_qkv, linear_proj,
// linear_fc1, linear_fc2, or all-linear (every linear layer of the blocks;
// never the LM head).
#pragma once
#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace nk {

namespace nn {
struct AdapterScratch;
}
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

struct Ia3Config {
  std::vector<std::string> target_modules;       // empty: no IA3
  std::vector<std::string> feedforward_modules;  // of those, the ones scaled on their input
  bool enabled() const { return !target_modules.empty(); }
};
// PEFT's defaults: Llama-style k_proj, v_proj and down_proj (feedforward);
// GPT-2's c_attn and mlp.c_proj (feedforward).
Ia3Config default_ia3(const ModelConfig& c);

// One adapted module: rows [col0, col0 + rows) of a linear layer's output
// (a fused part, or the whole layer).
struct AdaptedModule {
  std::string linear;  // Nekton's layer, "h.0.attn.qkv"
  std::string part;    // its fused part ("q"), or "" for the whole layer
  std::string module;  // the Hugging Face module path, "model.layers.0.self_attn.q_proj"
  int64_t col0 = 0, rows = 0, in = 0;
  int64_t out = 0;           // the whole layer's outputs
  bool feedforward = false;  // IA3: scaled on its input
  // The layout's names: LoRA's "h.0.attn.qkv.lora_a.q", "...lora_b.q"; IA3's
  // "h.0.attn.qkv.ia3.k" [rows] or, feedforward, "h.0.mlp.down.ia3_in" [in].
  std::string a_name() const;
  std::string b_name() const;
  std::string ia3_name() const;
};

// The modules c.lora (c.ia3) adapts, in layer order. nk::Error naming the
// target (and the names there are) for a target that matches nothing.
std::vector<AdaptedModule> lora_targets(const ModelConfig& c);
std::vector<AdaptedModule> ia3_targets(const ModelConfig& c);

// The sizes adapter workspaces are planned from: per layer, whether each of
// its linear layers (attn.qkv, attn.proj, mlp.up, mlp.down) has adapters and
// how many LoRA parts, and the largest part, input and output.
struct AdapterSizes {
  int64_t rank = 0, max_rows = 0, max_in = 0, max_out = 0;
  std::vector<std::array<int64_t, 4>> lora_parts;  // [n_layer]
  std::vector<std::array<bool, 4>> adapted;        // [n_layer]
  bool any() const { return max_in > 0; }
};
AdapterSizes adapter_sizes(const ModelConfig& c);
// Which of the four a linear layer's name is ("h.3.mlp.up": 2), or -1.
int adapter_linear_slot(const std::string& linear);

// The scratch every adapted layer of a forward (and backward, `training`)
// over up to `rows` tokens shares; null for a model without adapters.
// s: adapter_sizes(c).
std::unique_ptr<nn::AdapterScratch> make_adapter_scratch(const ModelConfig& c,
                                                         const AdapterSizes& s, int64_t rows,
                                                         DType dtype, Device device, bool training);

// Adds the adapters of c (LoRA's A, uniform in +-1/sqrt(in) as PEFT's
// default, and B, zeros; IA3's vectors, ones) to an unfinished layout holding
// c's base parameters, flagged ParamInfo::adapter.
void add_adapter_params(ParamLayout& p, const ModelConfig& c);
// Checks c.lora and c.ia3 (nk::Error naming prefix + key): rank within
// limits, alpha positive, dropout in [0, 1), targets that match, IA3's
// feedforward modules among its targets, not both methods.
void validate_adapters(const ModelConfig& c, const std::string& prefix);

// A model without adapters whose weights have them folded in, in f32: LoRA's
// W' = W + scale B A per part; IA3's rows of W (and b) times the output
// scale, or columns of W times the input scale.
std::unique_ptr<Transformer> merge_adapters(const Transformer& model);

}  // namespace nk
