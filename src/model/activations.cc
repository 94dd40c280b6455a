// The activation workspace of the training and inference steps
// (Activations, model/transformer.h): its plan of buffers per recompute
// policy, tensor-parallel split and pipeline stage, and the tensors each
// layer keeps for its backward.
#include "model/arch.h"
#include "model/transformer.h"

#include <algorithm>
#include <array>
#include <optional>
#include <type_traits>

namespace nk {

std::vector<Recompute> recompute_plan(const std::string& policy, int64_t layers, int64_t n_layer) {
  Recompute r = Recompute::None;
  if (policy == "selective")
    r = Recompute::Selective;
  else if (policy == "full")
    r = Recompute::Full;
  else if (policy != "none")
    fail("train.recompute: expected none, selective or full, got '{}'", policy);
  if (layers < 0 || layers > n_layer)
    fail("train.recompute_layers: {} is not in [0, model.n_layer = {}] (0: every layer)", layers,
         n_layer);
  std::vector<Recompute> plan(size_t(n_layer), Recompute::None);
  for (int64_t l = 0; l < (layers ? layers : n_layer); ++l) plan[size_t(l)] = r;
  return plan;
}

Activations::Activations(const ModelConfig& c, DType dt, int64_t B_, int64_t T_, bool training,
                         Device device, std::vector<Recompute> plan, const nn::TensorParallel& tp,
                         const PipelineStage& stage, int64_t expert_ranks)
    : B(B_), T(T_) {
  if (T > c.max_seq_len)
    fail("sequence length {} exceeds model.max_seq_len = {}", T, c.max_seq_len);
  if (training) recompute = std::move(plan);
  NK_CHECK(recompute.empty() || int64_t(recompute.size()) == c.n_layer,
           "Activations: a recompute plan of {} layers for {}", recompute.size(), c.n_layer);
  check_tensor_parallel(c, tp.size(), tp.expert_size());
  if (tp.sp() && (B * T) % tp.size())
    fail(
        "sequence parallelism: a micro-batch of {} x {} tokens does not split evenly over "
        "parallel.tp = {} ranks",
        B, T, tp.size());
  // This rank's share of the heads, MLP units and (padded) vocabulary (all of
  // them at tp 1).
  const int64_t t = tp.size(), C = c.d_model, HD = c.n_head * c.head_dim() / t,
                up = c.mlp_up_dim() / t, F = c.d_ff / t,
                V = c.classifier() ? c.num_labels : c.padded_vocab_size(t) / t;
  auto alloc = [&](Shape shape, DType dtype) {
    Tensor x = Tensor::empty(std::move(shape), dtype, device);
    bytes_ += int64_t(x.nbytes());
    return x;
  };
  auto act = [&](int64_t X) { return alloc({B, T, X}, dt); };
  // Outside the tensor-parallel region: this rank's rows under sequence parallelism.
  const int64_t R = tp.local_rows(B * T);
  // The experts' (and shared expert's) share of their units: all of them
  // when they are whole on every rank (TensorParallel::experts_whole), 1/etp
  // when split over fewer ranks than tp; the MoE blocks then keep their rows
  // in the region's scratch (full_x, full_y, dmoe.dx_full: nn/token_split.h).
  const int64_t te = tp.expert_size();
  const bool moe_rows = tp.experts_narrower() && c.is_moe();
  auto region = [&]() { return tp.sp() ? alloc({R, C}, dt) : act(C); };
  auto stat = [&]() { return alloc({R}, DType::F32); };
  // A pipeline stage: its layers' buffers only (the others stay undefined).
  NK_CHECK(stage.whole(c) || training, "Activations: inference over a pipeline stage");
  for (int64_t l = 0; l <= c.n_layer; ++l) {  // res[l]: the input of layer l (or the output)
    bool used = false;
    for (const auto& [first, last] : stage.ranges(c)) used = used || (l >= first && l <= last);
    res.push_back(used ? region() : Tensor());
  }
  // One layer's buffers; `cheap`: with the norms' and the activation's outputs
  // (a selective layer takes those from `shared`).
  Layer shared;
  if (tp.sp() || moe_rows) {
    full_x = act(C);
    full_y = act(C);
  }
  // A MoE model with dense layers (moe_first_dense_layers, moe_dense_layers) holds
  // both kinds; a buffer shared by layers (inference's one layer, full
  // recompute's) has both. The sequence-wise balancing loss keeps the
  // router's statistics per sequence.
  const bool any_dense = c.has_dense_layers();
  const int64_t segments = c.is_moe() && c.moe_aux_loss_type == "seq" ? B : 1;
  const bool qk_norm = c.block().qk_norm;
  const bool post_norms = c.architecture().block().post_norms;
  auto layer = [&](bool cheap, int64_t l) {
    Layer y;
    y.res_mid = region();
    y.ln1 = cheap ? region() : shared.ln1;
    y.ln2 = cheap ? region() : shared.ln2;
    y.mean1 = stat();
    y.rstd1 = stat();
    y.mean2 = stat();
    y.rstd2 = stat();
    y.attn.qkv = act(c.qkv_dim() / t);
    y.attn.out = act(HD);
    y.attn.lse = alloc({B, c.n_head / t, T}, DType::F32);
    if (post_norms) {
      y.attn_y = region();
      y.mlp_y = region();
      y.rstd3 = stat();
      y.rstd4 = stat();
    }
    if (c.mla())
      y.attn.mla = nn::LatentAttention::acts_for(B * T, c.n_head / t, c.q_lora_rank, c.kv_lora_rank,
                                                 c.head_dim() - c.qk_rope_head_dim,
                                                 c.qk_rope_head_dim, c.v_head_dim, dt, alloc);
    if (qk_norm)
      y.attn.qk = nn::SelfAttention::qk_acts_for(B * T, c.n_head / t, c.n_kv_head / t, c.head_dim(),
                                                 dt, alloc);
    // l < 0: a layer's buffers that any layer may use.
    if (c.is_moe() && (l < 0 || c.moe_layer(l))) {
      // Every row (gathered under sp), this rank's share of each expert's units.
      y.moe = nn::MoE::saved_for(B * T, C, c.num_experts, c.num_experts_per_tok,
                                 c.expert_d_ff() / te, dt, alloc, expert_ranks, segments);
      if (c.moe_shared_d_ff > 0)
        nn::MoE::add_shared(&y.moe, nullptr, B * T, C, c.moe_shared_d_ff / te,
                            c.moe_shared_expert_gate, dt, alloc);
      y.moe.full_x = full_x;
      y.moe.full_y = full_y;
    }
    if (l < 0 ? any_dense : !c.moe_layer(l)) {
      y.mlp.h = act(up);
      y.mlp.a = cheap ? act(F) : shared.mlp.a;
    }
    y.attn.full_x = y.mlp.full_x = full_x;
    y.attn.full_y = y.mlp.full_y = full_y;
    return y;
  };
  // Inference keeps one layer's activations and reuses it for every layer;
  // in training, layers that recompute share what they drop.
  const int64_t saved_layers = training ? c.n_layer : 1;
  bool any_full = false, any_selective = false;
  for (Recompute r : recompute) {
    any_full |= r == Recompute::Full;
    any_selective |= r == Recompute::Selective;
  }
  if (any_full) {
    shared = layer(true, -1);
  } else if (any_selective) {
    shared.ln1 = region();
    shared.ln2 = region();
    if (any_dense) shared.mlp.a = act(F);
  }
  for (int64_t l = 0; l < saved_layers; ++l) {
    const Recompute r = recompute_of(l);
    if (training && !stage.holds_layer(c, l))
      layers.emplace_back();
    else
      layers.push_back(r == Recompute::Full ? shared
                                            : layer(r == Recompute::None, training ? l : -1));
  }
  // Adapters: what each adapted linear layer keeps for its backward (LoRA's
  // x A^T of each part, a bottleneck's input, hidden and norm statistics),
  // per layer, and one scratch they all share.
  const AdapterSizes s = adapter_sizes(c, expert_ranks);
  adapters = make_adapter_scratch(c, s, B * T, dt, device, training);
  if (adapters) {
    for (const Tensor* t :
         {&adapters->z, &adapters->dh, &adapters->dx, &adapters->xd, &adapters->base})
      bytes_ += t->defined() ? int64_t(t->nbytes()) : 0;
    auto flat = [&](int64_t n, DType t) { return n ? alloc({n * B * T}, t) : Tensor(); };
    // Inference reuses one layer's buffers for all, and the fully recomputing
    // layers share one set: each sized for the most of the layers it serves.
    using Set = std::array<nn::AdapterActs, kAdapterSlots>;
    std::optional<Set> full_set;
    for (size_t l = 0; l < layers.size(); ++l) {
      const bool full = recompute_of(int64_t(l)) == Recompute::Full;
      Set set;
      if (full && full_set) {
        set = *full_set;
      } else {
        std::array<int64_t, kAdapterSlots> saved = s.saved[l], saved_f32 = s.saved_f32[l];
        std::array<bool, kAdapterSlots> adapted = s.adapted[l];
        for (size_t o = 0; o < s.adapted.size(); ++o) {
          if (training && !(full && recompute_of(int64_t(o)) == Recompute::Full)) continue;
          for (size_t i = 0; i < kAdapterSlots; ++i) {
            saved[i] = std::max(saved[i], s.saved[o][i]);
            saved_f32[i] = std::max(saved_f32[i], s.saved_f32[o][i]);
            adapted[i] = adapted[i] || s.adapted[o][i];
          }
        }
        for (size_t i = 0; i < kAdapterSlots; ++i)
          if (adapted[i])
            set[i] =
                nn::AdapterActs{flat(saved[i], dt), adapters.get(), flat(saved_f32[i], DType::F32)};
        if (full) full_set = set;
      }
      layers[l].attn.qkv_adapters = set[0];
      layers[l].attn.proj_adapters = set[1];
      layers[l].mlp.up_adapters = set[2];
      layers[l].mlp.down_adapters = set[3];
      // A MoE layer: its experts' in the MLP's slots, its shared expert's.
      layers[l].moe.up_adapters = set[2];
      layers[l].moe.down_adapters = set[3];
      layers[l].moe.shared_up_adapters = set[4];
      layers[l].moe.shared_down_adapters = set[5];
    }
  }
  if (c.prompt.enabled()) {
    prompt = nn::Prompt::saved_for(c.prompt.virtual_tokens, C, c.prompt.encoder_hidden, dt, device);
    for (const Tensor* t : {&prompt.h1, &prompt.a1, &prompt.h2, &prompt.a2, &prompt.out, &prompt.dp,
                            &prompt.dh, &prompt.da, &prompt.dp_c, &prompt.dtab})
      bytes_ += t->defined() ? int64_t(t->nbytes()) : 0;
  }
  lnf = region();
  meanf = stat();
  rstdf = stat();
  tmp = region();
  // Logits are produced in row chunks so that [B*T, V] never exists at once.
  // Chunks hold at most ~32M logits (64 MiB in bf16) and are equal-sized, so
  // the head's products keep a large M and K (the dW product sums over rows).
  int64_t max_rows = std::max<int64_t>(256, (int64_t(1) << 25) / V);
  int64_t n_chunks = (B * T + max_rows - 1) / max_rows;
  chunk = (B * T + n_chunks - 1) / n_chunks;
  if (stage.head) {  // the last pipeline stage's (every stage's without pipelining)
    logits = alloc({chunk, V}, dt);
    if (training && c.final_logit_softcap > 0) capped = alloc({chunk, V}, dt);
    losses = alloc({B * T}, DType::F32);
    if (tp.active()) ce_stats = alloc({nn::VocabCrossEntropy::stats_size(chunk)}, DType::F32);
    host_losses.resize(size_t(B * T));
  }
  if (training) {
    dres = region();
    dln = region();
    if (post_norms) dpost = region();
    dattn.dqkv = act(c.qkv_dim() / t);
    dattn.dout = act(HD);
    if (qk_norm) dattn.dqk = act(HD);
    if (c.mla())
      dattn.mla = nn::LatentAttention::grads_for(B * T, C, c.n_head / t, c.q_lora_rank,
                                                 c.kv_lora_rank, c.head_dim() - c.qk_rope_head_dim,
                                                 c.qk_rope_head_dim, c.v_head_dim, dt, alloc);
    if (c.is_moe()) {
      dmoe = nn::MoE::scratch_for(B * T, C, c.num_experts, c.num_experts_per_tok,
                                  c.expert_d_ff() / te, dt, alloc, expert_ranks, segments);
      if (c.moe_shared_d_ff > 0) {
        nn::MoE::add_shared(nullptr, &dmoe, B * T, C, c.moe_shared_d_ff / te,
                            c.moe_shared_expert_gate, dt, alloc);
      }
      if (tp.sp() || moe_rows)
        dmoe.dx_full = act(C);  // the input gradient's partial sums, every row
      moe_balance.resize(size_t(segments * c.num_experts));
    }
    if (any_dense) {
      dmlp.dh = act(up);
      dmlp.da = act(F);
    }
  }
  if (c.is_moe()) {
    moe_counts.assign(size_t(c.n_layer), std::vector<int64_t>(size_t(c.num_experts), 0));
    moe_stats.assign(size_t(c.n_layer),
                     std::vector<float>(size_t(segments * (c.num_experts + 1)), 0.f));
    moe_segments = segments;
    if (c.moe_aux_loss_type == "seq")
      moe_seq_counts.assign(size_t(c.n_layer),
                            std::vector<int64_t>(size_t(segments * c.num_experts), 0));
    moe_dropped.assign(size_t(c.n_layer), 0);
  }
}

// Per layer: counts [E], stats [S (E + 1)], dropped, seq counts [S E] (seq
// only); then the gradient scale.
int64_t Activations::moe_record_size() const {
  int64_t n = 1;
  for (size_t l = 0; l < moe_counts.size(); ++l)
    n += int64_t(moe_counts[l].size() + moe_stats[l].size()) + 1 +
         (moe_seq_counts.empty() ? 0 : int64_t(moe_seq_counts[l].size()));
  return n;
}

void Activations::write_moe_record(std::span<double> out) const {
  NK_CHECK(int64_t(out.size()) == moe_record_size(), "write_moe_record: {} values for {}",
           out.size(), moe_record_size());
  size_t at = 0;
  auto put = [&](const auto& v) {
    for (auto x : v) out[at++] = double(x);
  };
  for (size_t l = 0; l < moe_counts.size(); ++l) {
    put(moe_counts[l]);
    put(moe_stats[l]);
    out[at++] = double(moe_dropped[l]);
    if (!moe_seq_counts.empty()) put(moe_seq_counts[l]);
  }
  out[at] = double(moe_grad_scale);
}

void Activations::read_moe_record(std::span<const double> in, int64_t first, int64_t last) {
  NK_CHECK(int64_t(in.size()) == moe_record_size(), "read_moe_record: {} values for {}", in.size(),
           moe_record_size());
  size_t at = 0;
  auto get = [&](auto& v, bool keep) {
    for (auto& x : v) {
      if (!keep) x = static_cast<std::remove_reference_t<decltype(x)>>(in[at]);
      ++at;
    }
  };
  for (size_t l = 0; l < moe_counts.size(); ++l) {
    const bool mine = int64_t(l) >= first && int64_t(l) < last;
    get(moe_counts[l], mine);
    get(moe_stats[l], mine);
    if (!mine) moe_dropped[l] = int64_t(in[at]);
    ++at;
    if (!moe_seq_counts.empty()) get(moe_seq_counts[l], mine);
  }
  moe_grad_scale = float(in[at]);
}

std::vector<SavedActivation> Activations::saved(int64_t l) const {
  std::vector<SavedActivation> out;
  const bool training = dres.defined();
  if (!training || l < 0 || l >= int64_t(layers.size()) || !res[size_t(l)].defined()) return out;
  const Layer& y = layers[size_t(l)];
  auto add = [&](const char* name, const Tensor& t) {
    if (t.defined()) out.push_back({name, t});
  };
  add("res", res[size_t(l)]);
  const Recompute r = recompute_of(l);
  if (r == Recompute::Full) return out;  // the rest is the shared set it recomputes
  add("res_mid", y.res_mid);
  for (auto [name, t] : {std::pair<const char*, const Tensor*>{"mean1", &y.mean1},
                         {"rstd1", &y.rstd1},
                         {"mean2", &y.mean2},
                         {"rstd2", &y.rstd2},
                         {"attn.qkv", &y.attn.qkv},
                         {"attn.out", &y.attn.out},
                         {"attn.lse", &y.attn.lse},
                         {"attn_y", &y.attn_y},
                         {"mlp_y", &y.mlp_y},
                         {"rstd3", &y.rstd3},
                         {"rstd4", &y.rstd4},
                         {"mlp.h", &y.mlp.h},
                         {"moe.logits", &y.moe.logits},
                         {"moe.probs", &y.moe.probs},
                         {"moe.idx", &y.moe.idx},
                         {"moe.weights", &y.moe.weights},
                         {"moe.src", &y.moe.src},
                         {"moe.slot", &y.moe.slot},
                         {"moe.xs", &y.moe.xs},
                         {"moe.h", &y.moe.h},
                         {"moe.a", &y.moe.a},
                         {"moe.out", &y.moe.out},
                         {"attn.q_raw", &y.attn.qk.q_raw},
                         {"attn.k_raw", &y.attn.qk.k_raw},
                         {"attn.q_rstd", &y.attn.qk.q_rstd},
                         {"attn.k_rstd", &y.attn.qk.k_rstd},
                         {"moe.sh_h", &y.moe.sh_h},
                         {"moe.sh_a", &y.moe.sh_a},
                         {"moe.sh_out", &y.moe.sh_out},
                         {"moe.gate_logits", &y.moe.gate_logits},
                         {"moe.gate_probs", &y.moe.gate_probs},
                         {"moe.gate_w", &y.moe.gate_w}})
    add(name, *t);
  if (y.moe.exchange) add("moe.xe", y.moe.xe);  // expert parallel: the experts' own inputs
  if (r == Recompute::None) {
    add("ln1", y.ln1);
    add("ln2", y.ln2);
    add("mlp.a", y.mlp.a);
  }
  for (auto [name, acts] :
       {std::pair<std::string, const nn::AdapterActs*>{"attn.qkv_adapters", &y.attn.qkv_adapters},
        {"attn.proj_adapters", &y.attn.proj_adapters},
        {"mlp.up_adapters", &y.mlp.up_adapters},
        {"mlp.down_adapters", &y.mlp.down_adapters},
        {"moe.shared_up_adapters", &y.moe.shared_up_adapters},
        {"moe.shared_down_adapters", &y.moe.shared_down_adapters}}) {
    if (!acts->defined()) continue;
    if (acts->h.defined()) out.push_back({name + ".h", acts->h});
    if (acts->stats.defined()) out.push_back({name + ".stats", acts->stats});
  }
  return out;
}

Tensor Activations::residual(int64_t l) const {
  NK_CHECK(l >= 0 && l < int64_t(res.size()), "Activations::residual({}) of {} layers", l,
           res.size() - 1);
  return res[size_t(l)];
}

}  // namespace nk
