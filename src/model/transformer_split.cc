// The Transformer split over ranks: what a tensor-parallel or pipelined
// model can hold (check_tensor_parallel, check_moe_support,
// check_model_pieces: each an nk::Error naming the key, before anything is
// allocated), and the gradients of its replicated parameters that each rank
// holds a part of, which the trainer sums over the tensor-parallel (or
// expert-token) group once per step. The layout and views are in
// transformer_weights.cc.
#include "model/arch.h"
#include "model/transformer.h"

namespace nk {

void check_moe_support(const ModelConfig& cfg, int64_t tp, Device device, int64_t etp) {
  if (!cfg.is_moe()) return;
  const std::string what = fmt::format("model.num_experts = {} ({})", cfg.num_experts, cfg.arch);
  check_tensor_parallel(cfg, tp, etp);
  // The MoE kernels are on every backend's list (ops/moe.h) and nn::MoE is
  // checked against the CPU on CUDA (tests/nn/moe_test.cc), but no MoE model
  // has been trained or decoded on a GPU yet: refused until one has.
  if (device != kHost)
    fail(
        "{}: device {}: Mixture-of-Experts models run on the CPU only for now "
        "(train.device=cpu)",
        what, device_name(device));
}

void check_tensor_parallel(const ModelConfig& cfg, int64_t tp, int64_t etp) {
  if (tp < 1) fail("parallel.tp = {} must be at least 1", tp);
  if (tp == 1) return;
  // The vocabulary needs no divisibility: its rows are padded
  // (ModelConfig::padded_vocab_size).
  const std::pair<const char*, int64_t> split[] = {
      {"model.n_head", cfg.n_head}, {"model.n_kv_head", cfg.n_kv_head}, {"model.d_ff", cfg.d_ff}};
  if (cfg.architecture().block().post_norms || cfg.final_logit_softcap > 0)
    fail(
        "parallel.tp = {}: model.arch = {}: norms on the sub-blocks' outputs and soft-capped "
        "logits (Gemma) under tensor parallelism are not supported yet (set parallel.tp=1)",
        tp, cfg.arch);
  for (const auto& [key, value] : split)
    if (value % tp)
      fail("{} = {} is not divisible by parallel.tp = {} (split over the tensor-parallel ranks)",
           key, value, tp);
  // A MoE layer's experts and shared expert are split as an MLP is (nn/moe.h),
  // over the tp ranks or etp of them, unless they are whole on every rank
  // (parallel.etp = 1).
  if (etp == 0) etp = tp;
  if (!cfg.is_moe() || etp == 1) return;
  const std::pair<const char*, int64_t> experts[] = {
      {"model.moe_d_ff", cfg.expert_d_ff()}, {"model.moe_shared_d_ff", cfg.moe_shared_d_ff}};
  for (const auto& [key, value] : experts)
    if (value % etp && etp == tp)
      fail(
          "{} = {} is not divisible by parallel.tp = {} (each expert is split over the "
          "tensor-parallel ranks, parallel.etp = parallel.tp)",
          key, value, tp);
    else if (value % etp)
      fail(
          "{} = {} is not divisible by parallel.etp = {} (each expert is split over the expert "
          "tensor-parallel ranks)",
          key, value, etp);
}

void check_model_pieces(const ModelConfig& cfg, int64_t tp, bool staged, FrozenWeights frozen,
                        int64_t etp) {
  if (tp <= 1 && !staged) return;
  const std::string where =
      tp > 1 ? fmt::format("parallel.tp = {}", tp) : std::string("pipeline parallelism");
  if (frozen == FrozenWeights::Quantized && staged)
    fail(
        "{}: a block-quantised model runs inference on one process or split by tensor "
        "parallelism only",
        where);
  if (tp <= 1) return;
  if (const std::string why = adapters_unsplittable(cfg, tp, etp); !why.empty())
    fail("{}{}: {}; use parallel.ep, parallel.pp, data or context parallelism", where,
         etp > 1 && etp < tp ? fmt::format(", parallel.etp = {}", etp) : "", why);
}

std::string adapters_unsplittable(const ModelConfig& cfg, int64_t tp, int64_t etp) {
  if (tp <= 1 || !cfg.has_adapters()) return "";
  // A bottleneck adapter follows a row-parallel layer's summed output
  // (NeMo's linear_proj and linear_fc2, the defaults); a column-parallel
  // layer's output is split over the ranks, and its LayerNorm spans it.
  if (cfg.bottleneck.enabled() && cfg.is_moe())
    return "peft.method=adapter on a Mixture-of-Experts model under tensor parallelism is not "
           "supported yet";
  for (const AdaptedModule& m : bottleneck_targets(cfg))
    if (!m.linear.ends_with(".attn.proj") && !m.linear.ends_with(".mlp.down"))
      return fmt::format(
          "peft.target_modules: a bottleneck adapter on '{}' (a column-parallel layer, its "
          "output split over the ranks) under tensor parallelism is not supported yet (the "
          "row-parallel ones, linear_proj and linear_fc2, NeMo's defaults, are)",
          m.module);
  if (cfg.block().latent_attention)
    return "adapters on a latent-attention model under tensor parallelism are not supported yet";
  if (etp == 0) etp = tp;
  if (cfg.is_moe() && etp > 1 && etp < tp)
    return fmt::format(
        "adapters on a Mixture-of-Experts model with its experts split over fewer ranks than "
        "the attention are not supported yet (parallel.etp = 1 or {} are)",
        tp);
  return "";
}

std::vector<Tensor> Transformer::tensor_parallel_partial_grads() const {
  std::vector<Tensor> out;
  if (!tp_.active()) return out;
  auto add = [&](const nn::Norm& n) {
    for (const Tensor& g : {n.dw, n.db})
      if (g.defined()) out.push_back(g);
  };
  auto lora_grads = [&](const nn::Lora& l, bool a, bool b) {
    for (const nn::LoraPart& part : l.parts)
      for (const Tensor& g : {a ? part.da : Tensor(), b ? part.db : Tensor()})
        if (g.defined()) out.push_back(g);
  };
  for (const Block& b : blocks_) {  // (another pipeline stage's blocks hold nothing)
    if (tp_.sp()) {
      add(b.norm1);
      add(b.norm2);
      add(b.post1);
      add(b.post2);
    }
    // A q/k norm's weight is every head's: each rank adds its own heads' part.
    add(b.attn.q_norm);
    add(b.attn.k_norm);
    // An adapter's whole factor over a split layer (model/peft.cc): LoRA's A
    // over a column-parallel layer (each rank's dh = dz B is its output
    // columns' part) and B over a row-parallel one (its h = x A^T, the
    // rank's input columns' part); IA3's input scale over a column-parallel
    // layer and output scales over a row-parallel one (the layer's partial
    // products). The rest of them are the rank's own.
    for (const nn::Linear* lin : {&b.attn.qkv, &b.mlp.up}) lora_grads(lin->lora, true, false);
    for (const nn::Linear* lin : {&b.attn.proj, &b.mlp.down}) lora_grads(lin->lora, false, true);
    if (b.attn.qkv.ia3.din.defined()) out.push_back(b.attn.qkv.ia3.din);
    if (b.mlp.up.ia3.din.defined()) out.push_back(b.mlp.up.ia3.din);
    for (const nn::Linear* lin : {&b.attn.proj, &b.mlp.down})
      for (const nn::Ia3Part& part : lin->ia3.out)
        if (part.dl.defined()) out.push_back(part.dl);
    // A bottleneck adapter after a row-parallel layer's sum runs on every
    // row on every rank, but under sequence parallelism on the rank's rows.
    if (tp_.sp())
      for (const nn::Linear* lin : {&b.attn.proj, &b.mlp.down})
        if (lin->bottleneck_after_sum)
          for (const Tensor& gr : {lin->bottleneck.dln_w, lin->bottleneck.dln_b,
                                   lin->bottleneck.dw_in, lin->bottleneck.dw_out})
            if (gr.defined()) out.push_back(gr);
    // So are MLA's low-rank projections and norms (nn/latent_attention.h).
    const nn::LatentAttention& m = b.attn.mla;
    add(m.q_a_norm);
    add(m.kv_a_norm);
    for (const Tensor& gr : {m.q_a.dw, m.q_a.db, m.kv_a.dw, m.kv_a.db})
      if (gr.defined()) out.push_back(gr);
    // Whole experts (parallel.etp = 1): each rank's MoE block ran its own
    // rows (nn/token_split.h), so every weight of it holds that rows' part;
    // split experts are the ep group's, whose ranks hold different ones
    // (each tp group lies in one ep group: train/train_parallel.cc), and
    // reduce over the expert-dp group instead.
    if (tp_.experts_whole && b.moe.n_experts > 0) {
      for (const Tensor& gr :
           {b.moe.router.dw, b.moe.router.db, b.moe.shared_up.dw, b.moe.shared_up.db,
            b.moe.shared_down.dw, b.moe.shared_down.db, b.moe.shared_gate.dw})
        if (gr.defined()) out.push_back(gr);
      for (const nn::Linear* lin : {&b.moe.shared_up, &b.moe.shared_down})
        lora_grads(lin->lora, true, true);
      if (!experts_split_) {
        for (const Tensor& gr : {b.moe.dup, b.moe.ddown})
          if (gr.defined()) out.push_back(gr);
        for (const auto* experts : {&b.moe.up_lora, &b.moe.down_lora})
          for (const nn::Lora& l : *experts) lora_grads(l, true, true);
      }
    } else if (b.moe.n_experts > 0) {
      // Experts (and the shared expert) split over the group: as above, the
      // whole factor of each expert's adapter.
      lora_grads(b.moe.shared_up.lora, true, false);
      lora_grads(b.moe.shared_down.lora, false, true);
      for (const nn::Lora& l : b.moe.up_lora) lora_grads(l, true, false);
      for (const nn::Lora& l : b.moe.down_lora) lora_grads(l, false, true);
    }
  }
  if (tp_.sp()) add(norm_f_);
  // p-tuning's prompt under sequence parallelism: each rank's virtual
  // positions are its rows' (Transformer::place_prompt), its gradient their part.
  if (tp_.sp() && prompt_.active() && prompt_.dtable.defined()) {
    out.push_back(prompt_.dtable);
    for (const nn::Linear& lin : prompt_.mlp)
      for (const Tensor& gr : {lin.dw, lin.db})
        if (gr.defined()) out.push_back(gr);
  }
  return out;
}

std::vector<Tensor> Transformer::token_split_partial_grads() const {
  std::vector<Tensor> out;
  if (!tp_.experts_narrower() || tp_.experts_whole) return out;
  // Each expert-tp group's MoE blocks ran their own rows (nn/token_split.h):
  // the router's and shared expert's gradients (whole, or this expert-tp
  // rank's shares) are those rows' part; so are the experts' unless split
  // over ep, whose groups hold the expert-token peers' contributions to
  // their experts (they reduce over expert-dp).
  for (const Block& b : blocks_) {
    if (b.moe.n_experts == 0) continue;
    for (const Tensor& gr :
         {b.moe.router.dw, b.moe.router.db, b.moe.shared_up.dw, b.moe.shared_up.db,
          b.moe.shared_down.dw, b.moe.shared_down.db, b.moe.shared_gate.dw})
      if (gr.defined()) out.push_back(gr);
    if (!experts_split_)
      for (const Tensor& gr : {b.moe.dup, b.moe.ddown})
        if (gr.defined()) out.push_back(gr);
  }
  return out;
}

}  // namespace nk
