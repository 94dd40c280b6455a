// Parameter-efficient adapters as part of a model: which linear layers (or
// fused parts of them) a config adapts, the adapter parameters in the
// model's layout, and merging them into the base weights. The nn blocks are
// nn/adapters.h; Hugging Face PEFT's file format is ckpt/peft_adapter.h.
//
//  - LoRA: A [r, in] and B [rows, r] per adapted module.
//  - IA3: a vector of ones at the start per adapted module, scaling its
//    output (keys and values) or, for feedforward modules, its input (the
//    MLP's inner activation entering down_proj).
//  - Bottleneck adapters (NeMo's canonical adapters): after a whole layer's
//    output y, y + W_out silu(W_in LayerNorm(y)).
//  - P-tuning: learned virtual tokens before every sequence (not on a
//    linear layer: the model's embedding step places them).
//
// Modules are named as users of PEFT and NeMo name them: Hugging Face module
// names (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj;
// GPT-2's c_attn, c_proj, c_fc), any dotted suffix of a module's path
// (self_attn.q_proj, mlp.c_proj), Megatron's linear_qkv, linear_proj,
// linear_fc1, linear_fc2, or all-linear (every linear layer of the blocks;
// never the LM head).
//
// Mixture of Experts: each expert's projections are modules of their own
// (Mixtral's block_sparse_moe.experts.E.w1/w3/w2, Qwen-MoE's
// mlp.experts.E.gate_proj/up_proj/down_proj, and mlp.shared_expert.*), each
// with its own A and B as PEFT gives each expert's nn.Linear; Megatron's
// linear_fc1 and linear_fc2 name the experts' too. The routers (and
// Qwen2-MoE's shared_expert_gate) take no adapter: LoraConfig::train_router
// trains them whole. all-linear adapts every expert but not the routers
// (PEFT's all-linear would give them LoRA too).
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
struct ParamInfo;
class Transformer;

// The largest LoRA scaling (lora_alpha / r, or / sqrt(r)) a model takes.
inline constexpr double kMaxLoraScale = 1e4;

struct LoraConfig {
  int64_t rank = 0;  // r; 0: no adapters
  double alpha = 16;
  double dropout = 0;   // on the adapters' input, in training
  bool rslora = false;  // scale alpha / sqrt(r) (rank-stabilised) instead of alpha / r
  std::vector<std::string> target_modules;
  // Mixture of Experts: the routers' weights train with the adapters (frozen
  // otherwise, as every base weight); PEFT saves them as modules_to_save.
  bool train_router = false;
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

// Bottleneck adapters as NeMo's canonical ParallelLinearAdapter (Houlsby et
// al., 2019, in NeMo's pre-norm form): after a whole linear layer's output
// y [N, out], y + W_out silu(W_in LN(y)), LN a LayerNorm over out (weight
// ones, bias zeros, eps 1e-5), W_in [dim, out] Xavier-normal, W_out
// [out, dim] zeros (the adapter starts as the identity). NeMo puts them on
// the attention output projection and the MLP's down projection
// (linear_proj, linear_fc2: the default targets).
struct BottleneckConfig {
  int64_t dim = 0;  // the bottleneck width; 0: no adapters
  std::vector<std::string> target_modules;
  bool enabled() const { return dim > 0; }
};
constexpr double kBottleneckNormEps = 1e-5;

// P-tuning (Liu et al., 2021; PEFT's P_TUNING): `virtual_tokens` learned
// embeddings take the first positions of every sequence (the data leaves
// them free: their tokens are placeholders, their targets ignored). In
// training an MLP prompt encoder makes them from a table E [n, C]:
//   P = W2 relu(W1 relu(W0 E + b0) + b1) + b2, hidden `encoder_hidden`,
// as PEFT's MLP reparameterisation; a trained prompt is kept as P alone
// (encoder_hidden 0: the table is the prompt), which is what PEFT saves
// and what inference uses.
struct PromptConfig {
  int64_t virtual_tokens = 0;  // 0: none
  int64_t encoder_hidden = 0;  // 0: no encoder, the table is the prompt
  bool enabled() const { return virtual_tokens > 0; }
};
// The layout's names: the table, and the encoder's three layers ("prompt.mlp.0", ...).
inline constexpr const char* kPromptTable = "prompt.embedding";
std::vector<std::string> prompt_encoder_layers();

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
  // "h.0.attn.qkv.ia3.k" [rows] or, feedforward, "h.0.mlp.down.ia3_in" [in];
  // a bottleneck adapter's "h.0.attn.proj.adapter." + "ln.weight", "ln.bias",
  // "linear_in.weight", "linear_out.weight".
  // LoRA's A [r, in] and B [rows, r] are the part lora_part() of the tensors
  // a_name() and b_name(): an expert's are rows of its layer's stacked
  // tensors ("h.1.moe.up.lora_a", part "e3.gate"), split over the
  // expert-parallel ranks as the experts are (Split::Experts); any other
  // module's are whole tensors of its own (lora_part() "").
  std::string a_name() const;
  std::string b_name() const;
  std::string lora_part() const;
  std::string ia3_name() const;
  std::string adapter_name(const char* tensor) const;
};

// The modules c.lora (c.ia3) adapts, in layer order. nk::Error naming the
// target (and the names there are) for a target that matches nothing.
std::vector<AdaptedModule> lora_targets(const ModelConfig& c);
std::vector<AdaptedModule> ia3_targets(const ModelConfig& c);
std::vector<AdaptedModule> bottleneck_targets(const ModelConfig& c);  // whole layers only

// The linear layers of a block an adapter may be on (adapter_linear_slot):
// attn.qkv, attn.proj, mlp.up (a MoE layer: its experts' up), mlp.down
// (the experts' down), a MoE layer's shared expert's up and down.
inline constexpr size_t kAdapterSlots = 6;

// The sizes adapter workspaces are planned from: per layer, whether each of
// its linear layers (kAdapterSlots) has adapters and
// what it keeps from its forward for its backward, per token: compute-dtype
// values (LoRA: parts x r, each part's x A^T; a bottleneck: out + dim, its
// input and W_in's output) and f32 ones (a bottleneck's LayerNorm mean and
// rstd: 2); and the largest part, input and output. A MoE layer's experts
// see each token k times (its k experts' rows), and under expert
// parallelism over `expert_ranks` ranks up to k x expert_ranks rows per
// token of this rank's (the ep group's tokens routed to its experts,
// nn/moe.h), so theirs count that many rows per token, and the shared
// scratch is planned for row_factor (that, or 1) rows per token.
struct AdapterSizes {
  int64_t rank = 0, dim = 0, max_rows = 0, max_in = 0, max_out = 0, row_factor = 1;
  std::vector<std::array<int64_t, kAdapterSlots>> saved, saved_f32;  // [n_layer]
  std::vector<std::array<bool, kAdapterSlots>> adapted;              // [n_layer]
  bool any() const { return max_in > 0; }
};
AdapterSizes adapter_sizes(const ModelConfig& c, int64_t expert_ranks = 1);
// Which slot a linear layer's name is ("h.3.mlp.up": 2, "h.3.moe.shared_down":
// 5), or -1.
int adapter_linear_slot(const std::string& linear);
// The expert of an experts' module's part ("e3.gate", "e3": 3), or -1.
int64_t adapted_expert(const AdaptedModule& t);
// A LoRA target's A (or B) in `whole`, the value of the layout tensor p that
// holds it (its a_name, b_name): rows `part` (its lora_part) of it, or all of
// it for part "".
Tensor lora_rows(const ParamInfo& p, const Tensor& whole, const std::string& part);
// The routers' parameters LoraConfig::train_router trains, with their
// Hugging Face module paths ("h.0.moe.router.weight",
// "model.layers.0.block_sparse_moe.gate"), in layer order.
std::vector<std::pair<std::string, std::string>> router_modules(const ModelConfig& c);

// The scratch every adapted layer of a forward (and backward, `training`)
// over up to `rows` tokens (s.row_factor rows each) shares; null for a model without adapters.
// s: adapter_sizes(c).
std::unique_ptr<nn::AdapterScratch> make_adapter_scratch(const ModelConfig& c,
                                                         const AdapterSizes& s, int64_t rows,
                                                         DType dtype, Device device, bool training);

// Adds the adapters of c (LoRA's A, uniform in +-1/sqrt(in) as PEFT's
// default, and B, zeros; IA3's vectors, ones; the bottleneck adapters' as
// BottleneckConfig says; p-tuning's table N(0, 1) and encoder layers
// uniform in +-1/sqrt(in), as torch.nn.Embedding and torch.nn.Linear draw
// them) to an unfinished layout holding c's base parameters, flagged
// ParamInfo::adapter.
void add_adapter_params(ParamLayout& p, const ModelConfig& c);
// Checks c.lora, c.ia3, c.bottleneck and c.prompt (nk::Error naming prefix +
// key): sizes within limits, alpha positive, dropout in [0, 1), targets that
// match, IA3's feedforward modules among its targets, one method at most.
void validate_adapters(const ModelConfig& c, const std::string& prefix);
// The method c's adapters belong to: "LoRA", "IA3", "bottleneck adapters",
// "p-tuning", or "" for none.
std::string adapter_method(const ModelConfig& c);

// A model without adapters whose weights have them folded in, in f32: LoRA's
// W' = W + scale B A per part; IA3's rows of W (and b) times the output
// scale, or columns of W times the input scale. Bottleneck adapters and
// p-tuning do not fold into the weights: nk::Error naming the method.
std::unique_ptr<Transformer> merge_adapters(const Transformer& model);

}  // namespace nk
