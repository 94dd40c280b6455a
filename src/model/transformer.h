// A decoder-only transformer (GPT-2 or Llama family) assembled from nn blocks.
//
// Memory: four flat f32 arenas over one ParamLayout (master weights, gradients,
// AdamW m and v, the last two owned by the optimizer; the last three cover
// only the trainable parameters, laid out first) plus, in bf16 mode, a
// bf16 copy of the weights that the kernels read. Activations live in an
// `Activations` workspace planned once for a (B, T) shape: the training step
// allocates nothing.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "model/kv_cache.h"
#include "model/model_config.h"
#include "nn/attention.h"
#include "nn/cross_entropy.h"
#include "nn/embedding.h"
#include "nn/mlp.h"
#include "nn/moe.h"
#include "nn/norm.h"
#include "nn/param_layout.h"
#include "nn/prompt.h"

namespace nk {

class Activations;

// Several documents packed into each row (data/packing.h): attention stays
// inside each document and positions (learned or rotary) restart at 0 at each
// document start. position_ids is required; cu_seqlens may be undefined
// (one document per row at explicit positions: a context-parallel rank's
// chunks at their global positions, nn/context_parallel.h).
struct PackedBatchInfo {
  Tensor cu_seqlens;    // i32 [B, S+1] per-row document starts, see ops::attention_forward
  Tensor position_ids;  // i32 [B, T], each < max_seq_len
};

// Random: GPT-2/Megatron-style initialisation from the seed. Zeros: all
// weights 0, for callers that load the weights next (no wasted init: 4.6 s
// single-threaded for GPT-2 124M); they call sync_compute_params() after.
// Added: what a run adds to a base model folder (ParamInfo::added: adapters,
// a classifier's score head) from the seed, as Random would, the base 0 (to
// be loaded).
enum class ParamInit { Random, Zeros, Added };

// Activation recompute (Korthikanti et al., 2022), per layer: what its
// forward keeps for its backward. The gradients are the same bits.
enum class Recompute {
  None,       // every activation
  Selective,  // not the norms' outputs nor the MLP's activation output (cheap
              // elementwise work recomputed in the backward): about a third
              // of a Llama layer's activations
  Full,       // only the layer's input (the residual stream): the backward
              // runs the layer's forward again first
};
// train.recompute as a plan: `policy` (none, selective, full) for the first
// `layers` layers (0: all; Megatron's "block" method), None for the rest.
// nk::Error naming the key for another policy or a count out of range.
std::vector<Recompute> recompute_plan(const std::string& policy, int64_t layers, int64_t n_layer);

// How the frozen parameters (a fine-tuned base) are held. Trainable ones
// always have an f32 master and, in bf16, a compute copy.
enum class FrozenWeights {
  Master,     // like the trainable ones: f32 master (+ compute copy)
  Compute,    // the compute-dtype copy only: 2 bytes each in bf16 instead of 6
  Nf4,        // as Compute, but every weight matrix (linear layers, the token
              // embedding and the head; not learned positions) in NF4 (ops.h):
              // QLoRA's base
  Quantized,  // as Compute, but the weight matrices a QuantPlan names in
              // ggml's block formats or int8 (ops/quant.h): inference only
};

// How each block-quantised parameter is held (FrozenWeights::Quantized): its
// rows in order as runs of one type each. One run is the usual case; a fused
// parameter may mix types, as llama.cpp's Q4_K_M files give attn_v more bits
// than attn_q and attn_k. Each run's rows must be whole fused parts.
struct QuantRun {
  int64_t rows = 0;
  ops::QuantType type = ops::QuantType::Q8_0;
};
using QuantPlan = std::map<std::string, std::vector<QuantRun>>;

// The plan that holds every weight matrix of a model of cfg in `type` (a
// whole-model load-time quantisation): linear layers and the head, and the
// token embedding unless the model has learned positions (its wte stays
// dense then; so does a tied head); split over tp > 1 tensor-parallel
// ranks, each rank quantises its share of each. nk::Error naming a
// matrix whose rows (a rank's share of them) are not a multiple of the
// type's block.
QuantPlan quant_plan_for(const ModelConfig& cfg, ops::QuantType type, int64_t tp = 1);
// Rank `rank` of n's runs of its share (shape `local`) of the whole
// parameter g held in `whole`'s runs: under a row split each run cut to the
// rows the rank holds (in its order; the vocabulary's padding rows close the
// last), else the same runs, whose rows' column share must be whole blocks
// of each run's type (nk::Error naming g otherwise).
std::vector<QuantRun> quant_share_runs(const ParamInfo& g, const Shape& local,
                                       const std::vector<QuantRun>& whole, int64_t rank, int64_t n);
// Whether parameter p of `layout` may be held block-quantised: a weight
// matrix that is neither an adapter's, p-tuning's table nor learned
// positions, and the token embedding only without learned positions (the
// quantised embedding lookup adds none).
bool block_quantizable(const ParamLayout& layout, const ParamInfo& p);
// Whether a run may add p to a base model that lacks it (ParamInit::Added):
// an adapter's parameter, a sequence classifier's score head (a reward
// model started from a causal LM) or a value head (PPO's).
inline bool added_to_base(const ParamInfo& p) {
  return p.adapter || p.name == "score.weight" || p.name.starts_with("value_head.");
}

// The part of the model one pipeline rank holds (parallel/pipeline_parallel.h):
// its layer ranges (one, or with the interleaved schedule one per virtual
// stage, its model chunks), the token (and position) embedding on the first
// rank, the final norm and the head on the last; with tied embeddings the
// last rank holds the token table too, for its head (kept equal to the first
// rank's: their gradients are summed). The default is the whole model.
struct PipelineStage {
  std::vector<std::pair<int64_t, int64_t>> chunks;  // [first, last) each, in order; empty: all
  bool embedding = true, head = true;
  // The layer ranges: chunks, or the whole model's one.
  std::vector<std::pair<int64_t, int64_t>> ranges(const ModelConfig& cfg) const {
    if (chunks.empty()) return {{0, cfg.n_layer}};
    return chunks;
  }
  bool holds_layer(const ModelConfig& cfg, int64_t l) const {
    for (const auto& [first, last] : ranges(cfg))
      if (l >= first && l < last) return true;
    return false;
  }
  // Whether the stage holds parameter `name` of a model of cfg.
  bool holds(const ModelConfig& cfg, const std::string& name) const;
  bool whole(const ModelConfig& cfg) const {
    const auto r = ranges(cfg);
    return r.size() == 1 && r[0].first == 0 && r[0].second == cfg.n_layer && embedding && head;
  }
};

// Refuses a tensor-parallel size that does not divide the model: nk::Error
// naming the model.* key and the numbers (query heads, key/value heads, MLP
// units, vocabulary rows are split over the tp ranks), before anything is
// allocated. etp: the ranks a MoE layer's experts are split over (parallel.etp:
// 0 = tp; 1: whole, nn::TensorParallel::experts_whole; else dividing tp,
// nn::TensorParallel::experts).
void check_tensor_parallel(const ModelConfig& cfg, int64_t tp, int64_t etp = 0);
// Refuses what a model split over tp > 1 tensor-parallel ranks, or over
// pipeline stages (`staged`), cannot hold yet: nk::Error naming the key. Its
// adapters are split as their layers are (model/peft.cc), a frozen base held
// as masters or in the compute dtype; not a block-quantised model
// (inference), nor under tensor parallelism bottleneck adapters on
// column-parallel layers or on MoE models, adapters on latent-attention
// models or on MoE models whose experts are split over 1 < etp < tp ranks
// (etp: the experts' split, TensorParallel::expert_size(); 0: tp). (A QLoRA
// base whose shares are not whole NF4 blocks: Transformer::check_nf4_shares.)
void check_model_pieces(const ModelConfig& cfg, int64_t tp, bool staged, FrozenWeights frozen,
                        int64_t etp = 0);
// Why cfg's adapters cannot be split over tp tensor-parallel ranks (experts
// over etp of them; 0: tp), or "" if they can: the part of
// check_model_pieces a tensor-parallel generate or serve checks too.
std::string adapters_unsplittable(const ModelConfig& cfg, int64_t tp, int64_t etp = 0);
// Refuses what a Mixture-of-Experts model (cfg.is_moe()) cannot do yet:
// experts that tp does not divide (check_tensor_parallel), a device other
// than the CPU. nk::Error naming the key.
void check_moe_support(const ModelConfig& cfg, int64_t tp, Device device, int64_t etp = 0);
// The NF4 weights a quantised parameter p is held as (FrozenWeights::Nf4),
// by their shapes, in row order: a MoE layer's stacked experts
// (Split::Experts) one per expert, quantised each on its own as
// bitsandbytes quantises each expert's nn.Linear, so no block or absmax
// group straddles two experts; any other parameter one.
std::vector<Shape> nf4_runs(const ModelConfig& cfg, const ParamInfo& p);

// optim.grad_dtype=bf16 (Transformer::set_grad_dtype): the backward stages,
// in the order units[0..n_layer) the layers, units[n_layer] the head with
// the final norm (and the tied embedding's head use), units[n_layer + 1] the
// embeddings with the prompt; each stage's trainable parameters placed one
// after another in a staging buffer of `elems` f32 values, the largest stage.
struct GradStaging {
  struct Span {
    int64_t grad, stage, n;  // grads()[grad, grad + n) <- staging[stage, stage + n)
    std::string name;
  };
  std::vector<std::vector<Span>> units;
  int64_t elems = 0;
  static int64_t unit_of(const ModelConfig& cfg, const std::string& name);
};
GradStaging plan_grad_staging(const ModelConfig& cfg, const ParamLayout& layout);

class Transformer {
 public:
  // compute: f32 or bf16. frozen: names of parameters that get no gradient
  // (nk::Error naming an unknown one); their grad views are undefined, so the
  // ops skip them, and the grads arena holds only the trainable parameters.
  // Initial values do not depend on what is frozen. device: where the
  // arenas, the RoPE table and the model's workspaces live (`train.device`).
  // frozen_weights: how the frozen parameters are held (FrozenWeights).
  // quant: with FrozenWeights::Quantized, the parameters held quantised
  // (each frozen, 2-d); empty otherwise.
  // tp: the tensor-parallel group (nn/tensor_parallel.h); with more than one
  // rank this process holds its shards of the parameters (layout() is their
  // layout, global_layout() the whole model's) with the initial values of
  // the same slices of a one-process model of the same seed, its adapters
  // split as their layers (check_model_pieces says what it cannot hold). A
  // MoE layer's experts are split
  // over the same group (expert tensor parallelism with etp = tp: each
  // expert's gate | up by rows, its down by columns; the router whole).
  // stage: the pipeline stage this process runs (PipelineStage); its
  // parameters alone are held (layout()), with the initial values the whole
  // model would give them (check_model_pieces).
  Transformer(const ModelConfig& cfg, DType compute, uint64_t seed,
              ParamInit init = ParamInit::Random, const std::vector<std::string>& frozen = {},
              Device device = kHost, FrozenWeights frozen_weights = FrozenWeights::Master,
              const QuantPlan& quant = {}, nn::TensorParallel tp = {}, PipelineStage stage = {});
  // The layout such a model has, without allocating it (parameter names).
  static ParamLayout layout_for(const ModelConfig& cfg, const std::vector<std::string>& frozen = {},
                                FrozenWeights frozen_weights = FrozenWeights::Master,
                                const QuantPlan& quant = {});
  // Refuses, before any rank builds its model, a QLoRA base (NF4) that
  // tensor parallelism over tp ranks (a MoE layer's experts over etp of
  // them: 0 = tp) would split into shares that are not whole NF4 blocks:
  // nk::Error naming peft.method, the tensor and the first such rank.
  static void check_nf4_shares(const ModelConfig& cfg, const std::vector<std::string>& frozen,
                               int64_t tp, int64_t etp = 0);
  // The whole model's layout as n-way tensor parallelism holds it (experts
  // over etp of the ranks): a MoE block's tensors replicated (etp = 1) or
  // split over etp < n ranks.
  static ParamLayout tensor_parallel_global(ParamLayout whole, int64_t n, int64_t etp);
  // Under n-way tensor parallelism, rank r's share `local` of an NF4
  // parameter (`held`: the whole model's entry, tensor_parallel_global) as
  // the pieces of the whole tensor's values it holds, one list per NF4 run
  // (nf4_runs), each in its own run's values: nk::Error naming the tensor
  // when a piece is not whole NF4 blocks (a row-parallel weight's columns
  // per rank not a multiple of ops::kNf4Block).
  static std::vector<std::vector<ops::Nf4Piece>> nf4_shard_pieces(const ModelConfig& cfg,
                                                                  const ParamInfo& held,
                                                                  const ParamInfo& local,
                                                                  int64_t rank, int64_t n);

  const ModelConfig& config() const { return cfg_; }
  DType compute_dtype() const { return compute_; }
  Device device() const { return device_; }
  // This process's parameters: the whole model's, or its pipeline stage's
  // and under tensor parallelism its shards of them (ParamLayout::shard),
  // named as the whole ones.
  const ParamLayout& layout() const { return layout_; }
  // The whole model's parameters (layout() of one process).
  const ParamLayout& global_layout() const { return global_layout_; }
  const nn::TensorParallel& tensor_parallel() const { return tp_; }
  // Expert parallelism (nn/expert_parallel.h): every MoE layer computes its
  // experts [r E/ep, (r+1) E/ep) for the tokens of the whole "ep" group, and
  // holds only theirs: the first call with ep > 1 re-lays the model out by
  // ParamLayout::shard_experts (layout() then holds the MoE up/down tensors'
  // rows of this rank's experts, global_layout() all of them), keeping the
  // values it had (so the split equals the slice of one process's model) and
  // zeroing the gradients. Set before the optimizer, data parallelism and
  // Activations are made (they size themselves from the layout).
  void set_expert_parallel(const nn::ExpertParallel& ep);
  // Context parallelism (nn/context_parallel.h): every layer's attention
  // runs as ring attention over the "cp" group, and the loss's count of
  // target tokens is the group's (each rank's loss is its tokens' share of
  // the row mean; summed over the group, one process's). The caller passes
  // this rank's local tokens with their global positions
  // (PackedBatchInfo::position_ids) and makes Activations of T / cp tokens.
  void set_context_parallel(const nn::ContextParallel& cp);
  const nn::ContextParallel& context_parallel() const { return cp_; }
  // Whether layout() holds only this rank's experts (set_expert_parallel).
  bool experts_split() const { return experts_split_; }
  // The layout before the experts' split: this stage's parameters, tensor
  // parallel shards, every expert (layout() when the experts are not split).
  const ParamLayout& unsplit_layout() const { return experts_split_ ? unsplit_layout_ : layout_; }
  const nn::ExpertParallel& expert_parallel() const { return ep_; }
  const PipelineStage& stage() const { return stage_; }
  // Under tensor parallelism, the gradients of replicated parameters that
  // are partial sums: over this rank's rows under sequence parallelism (the
  // norms' weights and biases), over this rank's heads (the q/k norms'
  // weights, Qwen3's), over this rank's rows or columns of a split layer
  // (an adapter's whole factor: LoRA's A over a column-parallel layer, B over
  // a row-parallel one, model/peft.cc); the trainer adds them over the tp
  // group once per step. Empty without tensor parallelism.
  std::vector<Tensor> tensor_parallel_partial_grads() const;
  // With 1 < parallel.etp < parallel.tp, the MoE blocks' gradients that are
  // partial sums over this rank's share of the rows (the router's, the
  // shared expert's, the experts' when not split over ep): the trainer adds
  // them over the "expert-token" group (TensorParallel::tokens) once per
  // step. Empty otherwise.
  std::vector<Tensor> token_split_partial_grads() const;
  FrozenWeights frozen_weights() const { return frozen_weights_; }
  // f32 master weights: [layout().total()] with FrozenWeights::Master, else
  // the parameters that have one (has_master), from offset 0.
  Tensor& params() { return params_; }
  Tensor& grads() { return grads_; }  // f32 or bf16 [layout().trainable_end()]
  // Gradients accumulated in bf16 (optim.grad_dtype=bf16, 2 bytes each):
  // grads() becomes bf16 and every backward stage (the head with the final
  // norm, each layer, the embeddings with the prompt) writes its gradients
  // in f32 into one staging buffer the size of the largest stage, added into
  // grads() (each value rounded once, to nearest even) as the stage ends.
  // A whole model on one device (no tensor or pipeline split); zeroes the
  // gradients and rebinds the views. F32 goes back to the f32 arena.
  void set_grad_dtype(DType dtype);
  DType grad_dtype() const { return grads_.dtype(); }
  // Bytes the gradients take: the arena, and the staging buffer of bf16 ones.
  size_t grad_bytes() const {
    return grads_.nbytes() + (grad_stage_.defined() ? grad_stage_.nbytes() : 0);
  }
  // Compute-dtype weights (aliases params() in f32 mode), up to
  // layout().dense_end(): the NF4 ones are held apart.
  const Tensor& compute_params() const { return compute_params_; }
  // Whether p's f32 master is in params() (always for trainable ones).
  bool has_master(const ParamInfo& p) const { return p.offset + p.numel() <= params_.numel(); }
  // p's values in f32: its master view, or a new tensor read back from its
  // compute-dtype copy or its NF4 or block-quantised storage.
  Tensor param_f32(const ParamInfo& p) const;
  // Sets p to `src` (f32, p's shape): its master and compute copy, its
  // compute copy alone, or its NF4 or block quantisation.
  void set_param(const ParamInfo& p, const Tensor& src);
  // Sets this rank's share of p from the whole tensor `whole` (any float
  // dtype, host, the global layout's shape): under tensor parallelism the
  // rank's slice of it (extract_shard); an NF4 parameter (QLoRA's base)
  // quantised whole as one process quantises it and this rank's blocks cut
  // from it, so every rank holds one process's values (set_param would
  // quantise the share on its own, with its own absmaxes). A master's
  // compute copy is left to sync_compute_params (once after many).
  // Before set_expert_parallel.
  void set_param_from_whole(const ParamInfo& p, const Tensor& whole);
  // The storage of a block-quantised parameter, one QuantWeight per QuantRun
  // (a loader copies a file's blocks into their data). nk::Error if `name`
  // is not one.
  std::vector<ops::QuantWeight>& quant_parts(const std::string& name);
  // For inference once the weights are loaded: reorders the block-quantised
  // storage into the layout the device's kernels read fastest
  // (ops::quant_pack) and returns how many runs it packed. The weights'
  // values stay the same (param_f32, set_param and exports see no
  // difference); decode products then take the packed kernels.
  int64_t pack_quant_weights();
  // p-tuning's prompt P [virtual tokens, C] in f32 (host memory): the
  // encoder's output, or the table. Needs config().prompt.
  Tensor prompt_f32() const;
  // Bytes the weights take: f32 masters, the compute copy, quantised storage.
  size_t weight_bytes() const;
  // Call after changing params() other than through the optimizer's fused copy.
  void sync_compute_params();
  // A bf16 model whose optimizer keeps the masters itself (optim.master_dtype
  // = bf16: the compute copy plus a compensation buffer): frees the f32
  // masters, so that has_master() is false and param_f32() reads the compute
  // copy. adopt_masters(f32 [n]) puts masters back (what a checkpoint save or
  // export reads), n at most layout().dense_end(); the compute copy is not touched.
  void release_masters();
  void adopt_masters(Tensor masters);
  void zero_grads();
  // The seed of the next forward/backward's dropout masks (LoRA's); the
  // trainer sets one per micro-batch, so a resumed run draws the same.
  void set_dropout_seed(uint64_t seed) { dropout_seed_ = seed; }
  // Adapters (LoRA, IA3, bottleneck) on or off for the next forwards. Off,
  // every adapted layer computes its base layer alone, so the model is its
  // base bit for bit: a preference objective's reference without a second
  // copy. A backward needs them on.
  void set_adapters_enabled(bool on) { adapters_on_ = on; }
  bool adapters_enabled() const { return adapters_on_; }

  // Mean loss over non-ignored targets; with backward, gradients ACCUMULATE
  // d(loss * grad_scale)/d params. tokens, targets: i32 [B, T]. packed:
  // document boundaries and position ids of packed rows, or nullptr for one
  // sequence per row. The stages below, run in order.
  float forward_backward(Activations& a, const Tensor& tokens, const Tensor& targets,
                         float grad_scale, const PackedBatchInfo* packed = nullptr);
  float forward_loss(Activations& a, const Tensor& tokens, const Tensor& targets,
                     const PackedBatchInfo* packed = nullptr);

  // ---- stages ----
  // The step split where a pipeline stage cuts it: the embedding, a range of
  // blocks, and the head with the loss, each with its backward. A stage that
  // runs layers [first, last) reads a.residual(first) (received from the
  // previous stage, or written by embed_forward) and leaves a.residual(last);
  // its backward reads d residual(last) from a.residual_grad() and leaves d
  // residual(first) there. Run in this order on one process, they are
  // forward_backward, bit for bit.
  //
  // tokens -> a.residual(0). With p-tuning (config().prompt) the first
  // virtual_tokens positions of every row take the prompt's embeddings (plus
  // learned positions) whatever their tokens are: the data leaves them free.
  void embed_forward(Activations& a, const Tensor& tokens, const PackedBatchInfo* packed = nullptr);
  // a.residual(first) -> a.residual(last), 0 <= first <= last <= n_layer.
  void blocks_forward(Activations& a, int64_t first, int64_t last,
                      const PackedBatchInfo* packed = nullptr);
  // Final norm, LM head and cross-entropy over a.residual(n_layer) -> mean
  // loss; with backward, writes d residual(n_layer) (scaled by grad_scale)
  // into a.residual_grad() and accumulates the head's and norm's gradients.
  float head_loss(Activations& a, const Tensor& targets, bool backward, float grad_scale);
  // Objectives over whole sequences (preference optimisation) need each
  // row's log-probability and a gradient weight per row. row_nll [B]: the
  // final norm, head and cross-entropy over a.residual(n_layer), row by row,
  // row_nll[b] = the sum of -log p(target) over row b's non-ignored targets
  // (0 for a row without any).
  void head_row_nll(Activations& a, const Tensor& targets, std::span<double> row_nll);
  // The backward of sum_b row_scale[b] * row_nll[b] over the activations of
  // the last forward: recomputes the head's logits row by row (the blocks
  // are not run again), writes d residual(n_layer) into a.residual_grad()
  // and accumulates the head's and final norm's gradients. row_scale [B].
  // moe_grad_scale: a Mixture of Experts model's balancing and z-losses
  // (moe_losses(a).total) join the objective with this weight, as
  // head_loss's grad_scale adds them to the cross-entropy; 0 (the default):
  // the routers learn from the objective alone.
  void head_row_backward(Activations& a, const Tensor& targets, std::span<const float> row_scale,
                         float moe_grad_scale = 0.f);
  // Per-token objectives (online RL: GRPO's clipped ratios) need each
  // position's log-probability and a gradient weight per position.
  // token_nll [B * T]: -log p(target) at each position (0 where ignored).
  void head_token_nll(Activations& a, const Tensor& targets, std::span<float> token_nll);
  // The backward of sum_i token_scale[i] * token_nll[i] over the last
  // forward's activations (the head recomputed, as head_row_backward).
  // value_grad (config().value_head; empty: none) [B * T] adds the backward
  // of sum_i value_grad[i] * values[i] over value_forward's values.
  void head_token_backward(Activations& a, const Tensor& targets,
                           std::span<const float> token_scale,
                           std::span<const float> value_grad = {}, float moe_grad_scale = 0.f);
  // The value head (config().value_head) at every position: values [B * T]
  // = value_head . lnf + bias over the final norm's output, as the last
  // head_token_nll left it (call that first, on the same activations).
  void value_forward(Activations& a, std::span<float> values);
  // The softmax temperature of the log-probabilities head_row_nll,
  // head_token_nll and their backwards compute: log softmax(logits / t), the
  // distribution a sampler at temperature t draws from (online RL scores its
  // samples with the temperature that drew them). 1 by default; > 0.
  void set_logit_temperature(float t);
  float logit_temperature() const { return logit_temperature_; }
  // nk::Error unless the model has an LM head (it is not a sequence
  // classifier), naming `what` ("generation").
  void need_lm_head(const char* what) const;
  // A sequence classifier's head (config().classifier(): a reward or
  // attribute model). scores [B * num_labels], row-major: the final norm and
  // the score head at position last[b] of each row b, over a.residual(n_layer)
  // as the caller's forward left it (HF's *ForSequenceClassification reads
  // the last non-padding token; the caller names it). A row whose last[b]
  // is -1 (under context parallelism, a position in another rank's chunks)
  // scores 0 here and gets no gradient.
  void score_forward(Activations& a, std::span<const int64_t> last, std::span<float> scores);
  // The backward of sum_b,j dscores[b * num_labels + j] * scores[b, j] over
  // the last score_forward: writes d residual(n_layer) into
  // a.residual_grad() and accumulates the score head's and final norm's
  // gradients. moe_grad_scale: as head_row_backward's.
  void score_backward(Activations& a, std::span<const int64_t> last, std::span<const float> dscores,
                      float moe_grad_scale = 0.f);
  // A one-label sequence classifier read at every position (PPO's separate
  // critic: TRL's value model, whose score head gives the value of each
  // state): values [B * T] over a.residual(n_layer) as the caller's forward
  // left it. Whole models only (no tensor or pipeline pieces).
  void token_scores_forward(Activations& a, std::span<float> values);
  // The backward of sum_i dvalues[i] * values[i] over the last
  // token_scores_forward: d residual(n_layer) into a.residual_grad(), the
  // score head's and final norm's gradients accumulated.
  void token_scores_backward(Activations& a, std::span<const float> dvalues);
  // d residual(last) -> d residual(first), in a.residual_grad(); accumulates
  // the blocks' parameter gradients. Needs training activations.
  void blocks_backward(Activations& a, int64_t first, int64_t last,
                       const PackedBatchInfo* packed = nullptr);
  // d residual(0) in a.residual_grad() -> the embedding's gradients (and
  // the prompt's, from its positions).
  void embed_backward(Activations& a, const Tensor& tokens,
                      const PackedBatchInfo* packed = nullptr);

  // Logits f32 [B*T, V] at every position (evaluation, parity tests).
  void forward_all_logits(Activations& a, const Tensor& tokens, Tensor logits,
                          const PackedBatchInfo* packed = nullptr);
  // Logits f32 [B, V] at the last position of each sequence.
  void forward_last_logits(Activations& a, const Tensor& tokens, Tensor logits);

  // Incremental inference: runs step.tokens through every layer, storing their
  // keys and values in `cache` and attending over each token's cached prefix
  // (its slot's positions 0..position). logits f32 [R, V] receives the logits
  // of step.logit_rows (R of them). A token at a position below p-tuning's
  // virtual_tokens is that virtual token. Allocates nothing: the cost of a call is
  // its tokens' share of the weights' products plus attention over their
  // prefixes, whatever the prompt length was (a block-quantised MLA model's
  // first call dequantises kv_b into the cache: dequantize_latent_kv_b).
  // An MLA model's cache keeps the latent rows (KVCache::latent).
  // Under tensor parallelism every rank of the group calls it with the same
  // step, over a cache of its heads (KVCacheShape::tp; a MoE layer's
  // experts over KVCacheShape::etp ranks, not over expert-parallel ones),
  // and receives the whole logits (collective).
  void forward_cached(KVCache& cache, const CachedStep& step, Tensor logits);

  static constexpr int64_t kIgnoreIndex = -100;

  // Mixture of Experts (config().is_moe()): the last forward's load-balancing
  // loss E sum_e f_e P_e and router z-loss, over every layer's tokens together
  // (ModelConfig::moe_aux_loss_coeff), unscaled by their coefficients. A
  // training head_loss adds coeff x each to the loss it returns and the
  // blocks' backward adds their gradients. Zeros for a dense model. Also,
  // for the logs: load_max, the largest over layers of the busiest expert's
  // routed pairs over the mean (1: even load), and dropped, the fraction of
  // routed pairs the capacity factor dropped.
  struct MoeLosses {
    double aux = 0, z = 0, load_max = 0, dropped = 0;
    double total(const ModelConfig& c) const {
      return c.moe_aux_loss_coeff * aux + c.moe_z_loss_coeff * z;
    }
  };
  MoeLosses moe_losses(const Activations& a) const;

 private:
  // cache.mla_kv_b: every layer's kv_b weight dense where it is
  // block-quantised (undefined where kv_b.w is, read in place).
  void dequantize_latent_kv_b(KVCache& cache) const;
  // Tensor parallel: the vocabulary-parallel head's logits of the final
  // norm's rows `normed` [n, C], every rank's gathered into logits f32
  // [n, vocab_size] (collective).
  void gather_vocab_logits(KVCache& kc, const Tensor& normed, Tensor logits) const;
  struct Block {
    nn::Norm norm1, norm2;
    nn::Norm post1, post2;  // on the attention's and the MLP's outputs (BlockSpec::post_norms)
    nn::SelfAttention attn;
    nn::MLP mlp;
    nn::MoE moe;  // in place of mlp when config().moe_layer(l)
  };
  // The per-expert d loss / d balancing score and d loss / d lse^2 of the
  // MoE losses (one value for every layer), from the last forward's routing.
  // balance [S E]: layer l's (the sequence-wise loss's differ per layer).
  void moe_loss_grads(const Activations& a, int64_t l, std::vector<float>& balance, float& z) const;
  // Layer l's feed-forward block, dense or MoE: y = ffn(x); a MoE layer's
  // routing statistics recorded in a.moe_stats[l].
  void ffn_forward(Activations& a, int64_t l, Tensor y, const Tensor& x);
  void forward_body(Activations& a, const Tensor& tokens, const PackedBatchInfo* packed);
  void final_norm_forward(Activations& a);
  // Final logit soft-capping in place (ModelConfig::final_logit_softcap; none without).
  void cap_logits(const Tensor& logits) const;
  // The embedding's factor (BlockSpec::embed_scale: sqrt(d_model) rounded to
  // the compute dtype), or 1.
  float embed_scale() const;
  // head_row_nll (scale null) and head_row_backward (scale [B]): row_nll
  // (when given) receives the per-row sums. The per-token forms: token_scale
  // [B * T] (a backward, scale null) and token_nll [B * T] receive and give
  // per-position values. moe_grad_scale: a backward's weight of the MoE losses.
  void head_rows(Activations& a, const Tensor& targets, const float* scale, double* row_nll,
                 const float* token_scale = nullptr, float* token_nll = nullptr,
                 const float* value_grad = nullptr, float moe_grad_scale = 0.f);
  // Each of score_forward's rows: row b's position last[b] in x (the final
  // norm's output, every row: [B·T, C]) and its logits buffer, [1, C] and
  // [1, num_labels].
  std::pair<Tensor, Tensor> score_row(Activations& a, const Tensor& x,
                                      std::span<const int64_t> last, int64_t b);

  // One chunk of rows of the head and cross-entropy (head_loss, head_rows).
  // row_scale (defined: f32 [rows of x] on the device): each row's logit
  // gradients also scaled by its own weight.
  void head_chunk(Activations& a, const Tensor& x, const Tensor& dx, const Tensor& tg, int64_t r,
                  int64_t n, bool backward, float scale, const Tensor& row_scale = {});
  // Layer l's forward from a.residual(l): its saved activations, and
  // res[l + 1] when `output` (a recompute needs only the former).
  void layer_forward(Activations& a, int64_t l, const Tensor& cu, const Tensor& pos, bool output);
  void bind_views();
  int64_t head_unit() const { return cfg_.n_layer; }
  int64_t embed_unit() const { return cfg_.n_layer + 1; }
  // p's gradient as stage `unit` writes it: its view of grads(), or of the staging buffer.
  Tensor grad_view(const ParamInfo& p, int64_t unit) const;
  void flush_grads(int64_t unit);  // bf16 gradients: staging -> grads(), staging zeroed
  // Rows [b T, b T + n) of x [B*T, C], for each b, <- the prompt P [n, C]
  // plus learned positions 0..n-1.
  void place_prompt(Tensor x, int64_t B, int64_t T, nn::Prompt::Saved& s) const;
  // f(local row, virtual position, count) for each run of a row's virtual
  // positions among the `rows` rows of the B x T this rank holds.
  void for_virtual_rows(int64_t B, int64_t T, int64_t rows,
                        const std::function<void(int64_t, int64_t, int64_t)>& f) const;

  ModelConfig cfg_;
  DType compute_;
  Device device_;
  FrozenWeights frozen_weights_;
  nn::TensorParallel tp_;
  nn::ExpertParallel ep_;
  nn::ContextParallel cp_;
  bool experts_split_ = false;
  void split_experts();  // see set_expert_parallel
  std::vector<std::vector<ops::Nf4Piece>> nf4_shard_pieces(const ParamInfo& p) const {
    return nf4_shard_pieces(cfg_, global_layout_.find(p.name), p, tp_.rank(), tp_.size());
  }
  PipelineStage stage_;
  ParamLayout global_layout_, layout_, unsplit_layout_;
  Tensor params_, grads_, compute_params_;
  GradStaging staging_;  // bf16 gradients only
  Tensor grad_stage_;    // f32 [staging_.elems], bf16 gradients only
  // The NF4 parameters, by name: one weight each, or for a MoE layer's
  // stacked experts one per expert (its rows, quantised on their own as
  // bitsandbytes quantises each expert's nn.Linear; nf4_runs).
  std::map<std::string, std::vector<ops::Nf4Weight>> nf4_;
  std::map<std::string, std::vector<ops::QuantWeight>> quant_;  // block-quantised, by name
  Tensor rope_;
  Tensor rope_local_;  // the windowed layers' table (ModelConfig::rope_local_theta), or undefined
  nn::Embedding embed_;
  std::vector<Block> blocks_;
  nn::Norm norm_f_;
  nn::Linear head_;   // shares embed_.wte when tied; vocabulary-parallel under tp
  nn::Linear value_;  // config().value_head: [1, C] and its bias
  // The head's rows this rank scores: its share of the vocabulary less the
  // padding (bind_views); the logits' columns.
  int64_t head_scored_rows_ = 0;
  float logit_temperature_ = 1.f;  // set_logit_temperature
  nn::VocabCrossEntropy loss_;
  nn::Prompt prompt_;  // p-tuning's virtual tokens; inactive without
  uint64_t dropout_seed_ = 0;
  bool adapters_on_ = true;
};

// One tensor a training layer keeps from its forward for its backward, and
// only for it: layer l's input (res[l], written before layer l's forward)
// and what layer l's forward writes for its own backward. Between the end of
// layer l's forward (ActivationObserver::forward_done) and the start of its
// backward (backward_next) nothing reads or writes it, so a policy may move
// it elsewhere (offload to host memory, compress) and put it back. Buffers
// several layers share (what recomputing layers drop, scratch) are not such
// tensors.
struct SavedActivation {
  std::string name;  // "res", "ln1", "attn.qkv", "mlp.h", "mlp.up_adapters.h", ...
  Tensor tensor;
};

class Activations;
// Told where each training layer's saved tensors (Activations::saved) begin
// and end their idle time, from blocks_forward and blocks_backward; the
// hook an activation offload policy needs, outside the model code.
class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  // Layer l's forward is done (its output written): its saved tensors idle.
  virtual void forward_done(Activations& a, int64_t l) = 0;
  // Layer l's backward (or its recompute) starts: they must hold their values.
  virtual void backward_next(Activations& a, int64_t l) = 0;
};

// Every activation of one (B, T) micro-batch, allocated once. recompute
// (training; empty: none): per layer, what it keeps (Recompute); layers that
// recompute share one set of buffers for what they drop, so the plan
// shrinks the workspace itself. tp: the model's tensor-parallel group: the
// buffers inside its region hold this rank's heads, MLP units and
// vocabulary columns, and under sequence parallelism those outside (the
// residual stream, the norms) this rank's rows, [B·T/t, C].
class Activations {
 public:
  // stage: only its layers' buffers (and the head's on the last stage).
  // expert_ranks: the expert-parallel size (a MoE layer's products then run
  // over up to expert_ranks times its own rows, nn/moe.h).
  Activations(const ModelConfig& cfg, DType compute, int64_t B, int64_t T, bool training,
              Device device = kHost, std::vector<Recompute> recompute = {},
              const nn::TensorParallel& tp = {}, const PipelineStage& stage = {},
              int64_t expert_ranks = 1);
  // For `model`: its config, compute dtype, device, tensor- and expert-parallel groups and stage.
  Activations(const Transformer& model, int64_t B, int64_t T, bool training,
              std::vector<Recompute> recompute = {})
      : Activations(model.config(), model.compute_dtype(), B, T, training, model.device(),
                    std::move(recompute), model.tensor_parallel(), model.stage(),
                    model.expert_parallel().size()) {}
  int64_t B, T;
  // Bytes of every buffer this workspace allocated (shared ones once).
  int64_t bytes() const { return bytes_; }
  // The residual stream entering layer l [B, T, C] (l = n_layer: the last
  // block's output; this rank's rows under sequence parallelism): what a
  // pipeline stage sends forward.
  Tensor residual(int64_t l) const;
  // d loss / d residual stream [B, T, C] at the current stage boundary: what
  // a pipeline stage sends backward.
  Tensor residual_grad() const { return dres; }
  // The tensors training layer l keeps for its backward alone (SavedActivation),
  // per its Recompute: all of its own with none, without the norms' and the
  // MLP activation's outputs with selective, its input alone with full.
  // Empty for inference or a layer of another pipeline stage.
  std::vector<SavedActivation> saved(int64_t l) const;
  // Where layers report their saved tensors' idle time (null: nowhere). Not
  // owned; it must outlive the steps that use this workspace.
  void set_observer(ActivationObserver* o) { observer_ = o; }
  ActivationObserver* observer() const { return observer_; }
  // MoE: per layer, the pairs the last forward routed to each expert [E]
  // (zeros for a dense layer).
  const std::vector<std::vector<int64_t>>& expert_counts() const { return moe_counts; }
  // MoE under pipeline parallelism: every layer's routing record (counts,
  // stats, dropped pairs, per-sequence counts) and the MoE losses' gradient
  // scale as f64 values (exact: the counts are far below 2^53), for a stage
  // to hand on what its layers routed: forward, so that the last stage's
  // losses cover every layer; backward, so that each stage's balancing
  // gradient sees every layer's counts (HF's loss couples the layers).
  // read_moe_record takes every layer but [first, last), this chunk's own.
  int64_t moe_record_size() const;
  void write_moe_record(std::span<double> out) const;
  void read_moe_record(std::span<const double> in, int64_t first, int64_t last);

 private:
  friend class Transformer;
  struct Layer {
    Tensor res_mid;  // residual after attention [B, T, C]
    Tensor ln1, ln2, mean1, rstd1, mean2, rstd2;
    // BlockSpec::post_norms: the attention's and the MLP's outputs before
    // their norms [B, T, C], and those norms' inverse RMS [B T].
    Tensor attn_y, mlp_y, rstd3, rstd4;
    nn::SelfAttention::Saved attn;
    nn::MLP::Saved mlp;
    nn::MoE::Saved moe;  // a MoE model's, in place of mlp
  };
  // The adapters' workspace (model/peft.h), when the model has any: the
  // scratch every adapted layer shares (its seed set per forward), and per
  // layer LoRA's saved x A^T of each of its four linear layers' parts.
  std::unique_ptr<nn::AdapterScratch> adapters;
  std::vector<Tensor> res;  // residual stream entering layer l; res[L] is the output
  std::vector<Layer> layers;
  Tensor lnf, meanf, rstdf;
  Tensor tmp;             // [B, T, C] block outputs before the residual add
  Tensor logits;          // [chunk, V] one row-chunk of logits / dlogits
  Tensor losses;          // f32 [B*T]
  Tensor ce_stats;        // f32 vocabulary-parallel cross-entropy scratch (tensor parallel)
  Tensor full_x, full_y;  // [B, T, C] sequence-parallel scratch (nn/tensor_parallel.h)
  Tensor dres, dln;       // [B, T, C]
  Tensor dpost;           // [B, T, C] d (a sub-block's output) under post norms
  Tensor capped;          // [chunk, V] the soft-capped logits of a training chunk
  nn::SelfAttention::Scratch dattn;
  nn::MLP::Scratch dmlp;
  nn::MoE::Scratch dmoe;
  // MoE: per layer, the routed pairs per expert [E] and ops::moe_route's
  // stats [E + 1] of the last forward (kept apart from the buffers
  // recomputing layers share), and the grad_scale of the last training
  // head_loss (or a sequence objective's moe_grad_scale), which scales the
  // MoE losses' gradients (0: none).
  std::vector<std::vector<int64_t>> moe_counts;
  std::vector<std::vector<float>> moe_stats;
  std::vector<int64_t> moe_dropped;  // [n_layer] pairs dropped (capacity factor)
  // The sequence-wise balancing loss (moe_aux_loss_type seq): the stats are
  // per sequence (moe_segments = B; else 1), and moe_seq_counts[l] [B E]
  // counts each sequence's routed pairs per expert (empty unless seq).
  int64_t moe_segments = 1;
  std::vector<std::vector<int64_t>> moe_seq_counts;
  float moe_grad_scale = 0.f;
  std::vector<float> moe_balance;  // [moe_segments E] scratch of the backward
  nn::Prompt::Saved prompt;        // p-tuning's encoder activations (model config().prompt)
  std::vector<float> host_losses;
  int64_t chunk = 0;
  std::vector<Recompute> recompute;  // [n_layer] in training, else empty
  int64_t bytes_ = 0;
  ActivationObserver* observer_ = nullptr;
  Recompute recompute_of(int64_t l) const {
    return recompute.empty() ? Recompute::None : recompute[size_t(l)];
  }
};

}  // namespace nk
