// Transformer's block-quantised storage (FrozenWeights::Quantized): the
// whole-model plan, the runs a loader fills, and their packing for
// inference.
#include "model/transformer.h"

#include "model/arch.h"

namespace nk {

bool block_quantizable(const ParamLayout& layout, const ParamInfo& p) {
  return p.shape.size() == 2 && !p.adapter && p.name != "wpe" && p.name != kPromptTable &&
         !(p.name == "wte" && layout.has("wpe")) && !p.name.starts_with("value_head.");
}

QuantPlan quant_plan_for(const ModelConfig& cfg, ops::QuantType type, int64_t tp) {
  check_moe_support(cfg, 1, kHost);
  const ParamLayout layout = Transformer::tensor_parallel_global(model_layout(cfg), tp, 0);
  QuantPlan plan;
  for (const ParamInfo& p : layout.params()) {
    // A Mixture-of-Experts router stays dense, as llama.cpp keeps
    // ffn_gate_inp: small, and its scores pick the experts; so does the
    // shared expert's one-row gate (llama.cpp's 1-d ffn_gate_inp_shexp).
    if (!block_quantizable(layout, p) || p.name.ends_with(".moe.router.weight") ||
        p.name.ends_with(".moe.shared_gate.weight"))
      continue;
    const int64_t block = ops::quant_block(type);
    if (p.shape[1] % block != 0)
      fail("{} quantisation: '{}' {} has rows of {} values, not a multiple of {}",
           ops::quant_type_name(type), p.name, shape_str(p.shape), p.shape[1], block);
    // Each rank quantises its share: a row-parallel layer's rows are cut.
    if (const int64_t cols = tp > 1 ? shard_shape(tensor_split(p), tp)[1] : p.shape[1];
        cols % block != 0)
      fail(
          "{} quantisation over {} tensor-parallel ranks: '{}' {} has rows of {} values on each "
          "rank, not a multiple of {}",
          ops::quant_type_name(type), tp, p.name, shape_str(p.shape), cols, block);
    plan[p.name] = {{p.shape[0], type}};
  }
  return plan;
}

std::vector<ops::QuantWeight>& Transformer::quant_parts(const std::string& name) {
  auto it = quant_.find(name);
  if (it == quant_.end()) fail("parameter '{}' is not block-quantised", name);
  return it->second;
}

int64_t Transformer::pack_quant_weights() {
  int64_t n = 0;
  for (auto& [name, runs] : quant_) {
    // Experts are slices of a stacked weight (nn/moe.h): packed only when
    // every expert and run starts on a group of 16 rows.
    // (This rank's rows of each expert under tensor parallelism.)
    int64_t per_expert = 0;
    if (name.ends_with(".moe.up.weight") || name.ends_with(".moe.down.weight"))
      per_expert = layout_.find(name).shape[0] / cfg_.num_experts;
    bool aligned = per_expert % 16 == 0;
    for (const ops::QuantWeight& q : runs) aligned &= per_expert == 0 || q.rows() % 16 == 0;
    if (!aligned) continue;
    for (ops::QuantWeight& q : runs) n += ops::quant_pack(q) ? 1 : 0;
  }
  if (n > 0) bind_views();  // the blocks hold copies of the QuantWeights: given the new layout
  return n;
}

}  // namespace nk
