// `nekton estimate`: what a training recipe needs on each rank before it
// runs. Memory is split into weights, gradients, optimizer state, saved
// activations and workspaces. The activations follow Korthikanti et al.
// (2022)'s accounting, applied to the buffers Nekton's step really
// allocates, for each recompute policy, tensor/sequence-parallel split and
// number of pipeline micro-batches in flight. The FLOPs per step are
// Megatron's formula (ModelConfig::train_flops). The step time is predicted
// from this machine's GEMM, attention and memory rates, measured once and
// cached.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "core/json.h"
#include "train/train_config.h"

namespace nk {

// One micro-batch's activation memory on one rank, in bytes.
struct ActivationBytes {
  // What the backward reads: the residual stream entering every layer, each
  // layer's saved tensors (per Recompute), and the one layer of buffers that
  // recomputing layers share.
  int64_t saved = 0;
  // Scratch reused by every layer: the block output, the final norm, a
  // row-chunk of logits, the per-token losses, the backward's gradients of
  // the residual stream and of one layer's tensors, sequence parallelism's
  // gathered copies.
  int64_t workspace = 0;
  int64_t total() const { return saved + workspace; }
};

// The activation memory of a micro-batch of B x T for a model of c computing
// in `dt`, with the training plan `recompute` ([n_layer]; empty: none), over
// tp tensor-parallel ranks (sp: sequence parallel) on pipeline stage
// `stage`. Per layer and token this is C·s·(3 + (qkv + hd + up + F) / C) +
// 16 + 4·heads/T bytes kept without recompute (s: the dtype's size; GPT-2:
// 18·C·s, Korthikanti's 34·h with their 2-byte s and attention dropout, less
// its 5·a·s/h score term: Nekton's fused attention keeps only the
// log-sum-exp). Equals Activations::bytes() for a model without adapters
// (tests/train/estimate_test.cc). training false: a forward-only workspace
// (one layer's tensors reused by every layer, no gradients; a whole model).
// etp: the ranks each expert is split over (parallel.etp; 0: tp; 1 under tp >
// 1: whole, nn::TensorParallel::experts_whole; else a divisor of tp,
// nn::TensorParallel::experts).
ActivationBytes activation_bytes(const ModelConfig& c, DType dt, int64_t B, int64_t T,
                                 const std::vector<Recompute>& recompute, int64_t tp = 1,
                                 bool sp = false, const PipelineStage& stage = {},
                                 bool training = true, int64_t ep = 1, int64_t etp = 0);

// Rates of this machine for the step-time prediction.
struct MachineRates {
  std::map<std::string, double> gemm;  // "f32 MxKxN": FLOP/s of a linear layer's forward + backward
  std::map<std::string, double> attention;  // "bf16 BxTxHxD": FLOP/s of attention fwd + bwd
  double bandwidth = 0;                     // bytes/s of a large copy
  std::string machine;                      // CPU model and threads they were measured with
  nlohmann::json to_json() const;
  static MachineRates from_json(const nlohmann::json& j, const std::string& what);
};

// One pipeline stage's rank (the only one without pipelining).
struct RankEstimate {
  int64_t stage = 0;
  int64_t params = 0;  // parameters this rank holds (elements, its shards under tp)
  int64_t weight_bytes = 0, grad_bytes = 0, optimizer_bytes = 0;
  // The gradient arena whole; grad_bytes is less where the gradients are
  // sharded (parallel.shard=grads, and full without a pipeline): this rank's
  // blocks plus the largest backward stage and a bucket on its way.
  int64_t grad_arena_bytes = 0;
  ActivationBytes per_micro_batch;
  int64_t in_flight = 1;  // micro-batches whose activations it holds at once
  // Context parallel: the attention's exchange buffers, shared by the layers
  // (nn::cp_buffer_bytes of parallel.cp_comm_type).
  int64_t cp_buffer_bytes = 0;
  int64_t activation_bytes() const { return per_micro_batch.saved * in_flight; }
  int64_t workspace_bytes() const { return per_micro_batch.workspace * in_flight; }
  int64_t total() const {
    return weight_bytes + grad_bytes + optimizer_bytes + activation_bytes() + workspace_bytes() +
           cp_buffer_bytes;
  }
};

struct StepTime {
  double gemm_s = 0, attention_s = 0, memory_s = 0;
  double total() const { return gemm_s + attention_s + memory_s; }
};

struct TrainEstimate {
  int64_t world = 1, dp = 1, tp = 1, pp = 1, ep = 1;
  int64_t etp = 1, edp = 1;  // the experts' tensor- and data-parallel sizes (parallel.etp)
  int64_t params = 0;        // the whole model's
  // MoE: the experts' weights (whole model), the share each rank holds and
  // computes (1/(ep etp): its experts' tensor-parallel shares, as counted in the stages' params,
  // weight_bytes, grad_bytes and optimizer_bytes), and the bytes one rank sends in the expert
  // all-to-alls of a step (even routing; 0 without expert parallelism).
  int64_t expert_params = 0, expert_params_computed = 0, a2a_bytes_per_step = 0;
  // Context parallel: its size and the bytes one rank sends in the
  // attention's exchanges of a step (nn::cp_exchange_bytes of
  // parallel.cp_comm_type over the busiest stage's layers; 0 without).
  int64_t cp = 1, cp_bytes_per_step = 0;
  std::vector<RankEstimate> stages;  // [pp]
  double flops_per_step = 0;         // Megatron's formula, whole step, all ranks
  double recompute_flops = 0;        // the forward work the recompute policy adds
  StepTime step;                     // predicted, on one rank (no communication)
  const RankEstimate& peak() const;  // the rank that needs the most memory
};

// `world`: processes (0: the mesh's product with parallel.dp, or 1 replica).
// rates: null skips the time prediction. nk::Error naming the key for a
// layout that does not fit.
TrainEstimate estimate_training(const TrainConfig& cfg, int64_t world, const MachineRates* rates);

// The rates estimate_training needs for cfg (its GEMM and attention shapes,
// at cfg's compute dtype, on cfg.threads threads): those in `known` are kept,
// the others measured and added.
void measure_missing_rates(const TrainConfig& cfg, MachineRates& known);
// What the rates of cfg are measured on: the CPU model and cfg's threads
// (set here, as the trainer does).
std::string rates_machine(const TrainConfig& cfg);
// The rate cache: $NEKTON_CACHE or ~/.cache/nekton, rates.json (one entry per
// machine string).
std::string rates_cache_path();

// The estimate as JSON (bytes, FLOPs, seconds).
nlohmann::json estimate_json(const TrainEstimate& e);

}  // namespace nk
