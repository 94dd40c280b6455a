#include "train/train_parallel.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <map>

#include "core/error.h"
#include "model/peft.h"
#include "model/transformer.h"
#include "parallel/pipeline_parallel.h"

namespace nk {

namespace {

// Context parallelism (nn/context_parallel.h) trains a decoder's
// language-model loss over packed or unpacked rows, by ring attention, the
// all-to-all of the heads, the keys and values all-gathered or the
// hierarchical a2a+p2p, alone, with data parallelism (gradients over dp-cp),
// tensor (and sequence) and pipeline parallelism (1F1B and interleaved:
// every stage's attention works over its own cp group), and
// Mixture-of-Experts layers (each rank routes its own chunks' tokens; the
// routing statistics are summed over cp, so the balancing and z-losses are
// the whole rows'; with expert parallelism carved out of dp × cp); what it
// does not support yet is refused here, naming the key.
void check_context_parallel(const TrainConfig& cfg, const dist::Mesh& mesh) {
  const int cp = mesh.cp();
  if (cfg.seq_len % (2 * cp))
    fail(
        "parallel.cp = {}: train.seq_len = {} is not a multiple of 2 × parallel.cp = {} (each "
        "row is cut into 2·cp equal chunks)",
        cp, cfg.seq_len, 2 * cp);
  // (A capacity factor drops each expert's pairs past it in the
  // micro-batch's token order, which no cp rank sees whole.)
  const char* unsupported =
      cfg.model.lora.enabled() && cfg.model.lora.dropout > 0
          ? "peft.lora_dropout > 0 (each rank would draw the masks of its own chunks)"
      : cfg.device != kHost
          ? "train.device (the ring kernel and the all-to-all's packing are CPU only)"
      : cfg.model.is_moe() && cfg.model.moe_capacity_factor > 0
          ? "model.moe_capacity_factor (each cp rank would drop by its own chunks' share of the "
            "micro-batch's tokens; use the dropless mode, 0)"
          : nullptr;
  if (unsupported)
    fail("parallel.cp = {}: {} under context parallelism is not supported yet (set parallel.cp=1)",
         cp, unsupported);
  // All-to-all: each cp rank takes 1/cp of its tp rank's query heads and of
  // its key/value heads, whole heads, each query head with its own group.
  const int64_t heads = int64_t(mesh.tp()) * cp, hq = cfg.model.n_head, hkv = cfg.model.n_kv_head;
  const nn::CpComm comm = nn::parse_cp_comm(cfg.parallel.cp_comm_type);
  if (comm == nn::CpComm::A2A && (hq % heads || hkv % heads))
    fail(
        "parallel.cp = {}, parallel.cp_comm_type = a2a: model.n_head = {} and model.n_kv_head = "
        "{} must both be multiples of parallel.tp × parallel.cp = {} × {} (the all-to-all gives "
        "each rank whole heads); use parallel.cp_comm_type=p2p (ring attention)",
        cp, hq, hkv, mesh.tp(), cp);
  // a2a+p2p: the same within each a2a group of a ranks.
  const std::vector<int64_t>& hcp = cfg.parallel.hierarchical_cp_sizes;
  if (comm == nn::CpComm::A2AP2P) {
    NK_CHECK(hcp.size() == 2 && mesh.group("hierarchical-cp-a2a").size() == hcp[0],
             "parallel.hierarchical_context_parallel_sizes: the mesh has no a2a groups of {}",
             hcp.empty() ? 0 : hcp[0]);
    const int64_t a = hcp[0], inner = int64_t(mesh.tp()) * a;
    if (hq % inner || hkv % inner)
      fail(
          "parallel.cp = {}, parallel.cp_comm_type = a2a+p2p, "
          "parallel.hierarchical_context_parallel_sizes = {},{}: model.n_head = {} and "
          "model.n_kv_head = {} must both be multiples of parallel.tp × the a2a size = {} × {} "
          "(the all-to-all gives each rank of an a2a group whole heads); use a smaller a2a size",
          cp, hcp[0], hcp[1], hq, hkv, mesh.tp(), a);
  }
  // Sequence parallelism splits each rank's B·T/cp local rows over its tp group.
  if (cfg.parallel.sequence_parallel && (cfg.micro_batch * (cfg.seq_len / cp)) % mesh.tp())
    fail(
        "parallel.sp=true, parallel.cp = {}: train.micro_batch × train.seq_len / parallel.cp = {} "
        "× {} local tokens do not split evenly over parallel.tp = {}",
        cp, cfg.micro_batch, cfg.seq_len / cp, mesh.tp());
}

// Every group of that name in the mesh (each in group-rank order), sorted.
std::vector<std::vector<int>> sorted_groups(const dist::Mesh& mesh, const char* name) {
  std::vector<std::vector<int>> all = mesh.group(name).all;
  std::sort(all.begin(), all.end());
  return all;
}

// LoRA on a Mixture-of-Experts model under expert parallelism: each rank
// holds its experts' adapters (rows of the layers' stacked A and B,
// model/peft.h, split as the experts are; under QLoRA its experts' NF4
// runs), so every expert must have the same modules adapted.
void check_expert_parallel_lora(const TrainConfig& cfg, int64_t ep) {
  // linear -> expert -> its adapted modules; and one module's path to name it.
  std::map<std::string, std::map<int64_t, int64_t>> parts;
  std::map<std::string, std::string> path;
  for (const AdaptedModule& t : lora_targets(cfg.model))
    if (const int64_t e = adapted_expert(t); e >= 0) {
      ++parts[t.linear][e];
      path.emplace(t.linear, t.module);
    }
  for (const auto& [linear, per_expert] : parts) {
    const auto [lo, hi] =
        std::minmax_element(per_expert.begin(), per_expert.end(),
                            [](const auto& a, const auto& b) { return a.second < b.second; });
    if (int64_t(per_expert.size()) != cfg.model.num_experts)
      fail(
          "parallel.ep = {}: peft.target_modules adapts {} of the {} experts of a layer ({}); "
          "under expert parallelism every expert must be adapted alike (name the experts' "
          "modules, e.g. all-linear or the module's own name, not one expert's path)",
          ep, per_expert.size(), cfg.model.num_experts, path.at(linear));
    if (lo->second != hi->second)
      fail(
          "parallel.ep = {}: peft.target_modules adapts {} modules of expert {} but {} of expert "
          "{} ({}); under expert parallelism every expert must be adapted alike",
          ep, lo->second, lo->first, hi->second, hi->first, path.at(linear));
  }
}

// parallel.etp < parallel.tp: each expert split over etp of the tp ranks
// (the "expert-tp" group; etp = 1: whole on every rank), the tp / etp
// expert-tp groups of a tp group splitting the MoE blocks' rows among them
// ("expert-token", nn/token_split.h), as Megatron-Core's
// expert_tensor_parallel_size below tensor_model_parallel_size. Experts
// split over ranks that hold different tokens (etp > tp) are not built.
void check_expert_tensor_parallel(const TrainConfig& cfg, const dist::Mesh& mesh) {
  const int etp = mesh.etp(), tp = mesh.tp();
  if (!cfg.model.is_moe() || etp > tp)
    fail(
        "parallel.etp = {} with parallel.tp = {}: only parallel.etp = parallel.tp (each expert "
        "split over the tensor-parallel ranks, as their attention is; parallel.etp 0), "
        "parallel.etp = 1 (whole experts, the tp ranks splitting the MoE layers' tokens) or an "
        "etp dividing tp (each expert split over etp ranks, the tp / etp groups of them "
        "splitting the tokens) for a Mixture-of-Experts model is supported",
        etp, tp);
  if (tp % etp)
    fail(
        "parallel.etp = {} does not divide parallel.tp = {}: each tensor-parallel group is cut "
        "into tp / etp expert tensor-parallel groups that split the MoE layers' tokens (set "
        "parallel.etp to a divisor of parallel.tp)",
        etp, tp);
  const int64_t N = cfg.micro_batch * cfg.seq_len, rows = tp / etp;
  const char* unsupported =
      cfg.model.moe_capacity_factor > 0
          ? "model.moe_capacity_factor (each expert tensor-parallel group would drop by its own "
            "share of the micro-batch's tokens; use the dropless mode, 0)"
      : cfg.model.moe_aux_loss_type == "seq"
          ? "model.moe_aux_loss_type=seq (the sequence-wise balancing loss)"
      : mesh.ep() > 1 && cfg.ddp.shard != parallel::Shard::None
          ? "parallel.shard (ZeRO-1 / FSDP) with parallel.ep"
          : nullptr;
  if (unsupported)
    fail("parallel.etp = {} with parallel.tp = {}: {} is not supported yet", etp, tp, unsupported);
  if (N % rows)
    fail(
        "parallel.etp = {} with parallel.tp = {}: train.micro_batch × train.seq_len = {} × {} is "
        "not a multiple of parallel.tp / parallel.etp = {} (the MoE layers' tokens are split "
        "over the tensor-parallel ranks' {} expert tensor-parallel groups)",
        etp, tp, cfg.micro_batch, cfg.seq_len, rows, rows);
  // Each expert-tp group: a run of etp consecutive ranks of one tp group
  // (tp rank c·etp + j its rank j: the shares of a gather, ParamInfo::tp_ways).
  if (etp > 1) {
    const std::vector<std::vector<int>> xs = sorted_groups(mesh, "expert-tp");
    for (const std::vector<int>& g : mesh.group("tp").all)
      for (int c = 0; c < rows; ++c) {
        const std::vector<int> run(g.begin() + c * etp, g.begin() + (c + 1) * etp);
        if (!std::binary_search(xs.begin(), xs.end(), run))
          fail(
              "parallel.order '{}': the experts' tensor-parallel groups (parallel.etp = {}) are "
              "not runs of consecutive ranks of the attention's (parallel.tp = {}; ranks {} are "
              "not one); put tp first, as the default order tp-cp-ep-dp-pp does",
              mesh.order(), etp, tp, fmt::format("{}", fmt::join(run, ",")));
      }
  }
  // Whole experts: the experts each rank's ep group computes must be other
  // experts than its tp peers' (their gradients are then whole per ep
  // group, summed over the expert-dp group alone): every tp group inside
  // one ep group.
  if (etp == 1 && mesh.ep() > 1)
    for (const std::vector<int>& t : mesh.group("tp").all)
      for (const std::vector<int>& e : mesh.group("ep").all)
        if (std::find(e.begin(), e.end(), t[0]) != e.end())
          for (int r : t)
            if (std::find(e.begin(), e.end(), r) == e.end())
              fail(
                  "parallel.etp = 1, parallel.ep = {}, parallel.tp = {}, parallel.order '{}': "
                  "the tensor-parallel group {} is not inside one expert-parallel group (make "
                  "parallel.ep a multiple of parallel.tp, with tp first in the order)",
                  mesh.ep(), mesh.tp(), mesh.order(), fmt::format("{}", fmt::join(t, ",")));
}

}  // namespace

dist::Mesh train_mesh(const TrainConfig& cfg, int world, int rank) {
  dist::Mesh mesh(world, rank, cfg.parallel.mesh);
  check_train_layout(cfg, mesh);
  return mesh;
}

void check_train_layout(const TrainConfig& cfg, const dist::Mesh& mesh) {
  // Mixture of Experts runs data, tensor (with sequence), expert, context
  // (check_context_parallel) and pipeline parallel (1F1B or interleaved:
  // the stages hand on the layers' routing records,
  // parallel/pipeline_parallel.h).
  if (cfg.model.is_moe()) {
    // Each expert is split over the tp group itself (nn/moe.h): the expert
    // folding's tensor-parallel groups must be the dense ones, and each ep
    // group must hold one tp rank of each of its dp replicas.
    if (mesh.etp() == mesh.tp() && mesh.tp() > 1 &&
        sorted_groups(mesh, "expert-tp") != sorted_groups(mesh, "tp"))
      fail(
          "parallel.order '{}': the experts' tensor-parallel groups differ from the attention's "
          "(parallel.tp = {}, parallel.ep = {}); put tp first, as the default order "
          "tp-cp-ep-dp-pp does",
          mesh.order(), mesh.tp(), mesh.ep());
    if (cfg.model.num_experts % mesh.ep())
      fail(
          "parallel.ep = {}: model.num_experts = {} does not split into equal counts over the "
          "expert-parallel ranks",
          mesh.ep(), cfg.model.num_experts);
    if (mesh.ep() > 1 && cfg.model.has_adapters()) check_expert_parallel_lora(cfg, mesh.ep());
  } else if (mesh.ep() != 1) {
    fail("parallel.ep = {}: the model has no experts (model.num_experts = 0); set it to 1",
         mesh.ep());
  }
  if (mesh.cp() != 1) check_context_parallel(cfg, mesh);
  if (mesh.etp() != mesh.tp()) check_expert_tensor_parallel(cfg, mesh);
  if (mesh.pp() > 1 && cfg.ddp.shard == parallel::Shard::Gradients)
    fail(
        "parallel.shard=grads with parallel.pp = {}: a pipeline's micro-batches accumulate their "
        "gradients whole until the schedule ends, so ZeRO-2 would shard nothing at the peak (as "
        "DeepSpeed, which refuses ZeRO-2 with pipeline parallelism); use parallel.shard=optimizer "
        "or full",
        mesh.pp());
  if (mesh.pp() > 1)
    parallel::pipeline_stage(cfg.model, mesh.pp(), 0, cfg.parallel.pp_layout, cfg.parallel.vp);
  if (cfg.parallel.vp > 1 && (cfg.global_batch / (mesh.dp() * cfg.micro_batch)) % mesh.pp())
    fail(
        "parallel.vp = {}: the interleaved schedule needs each data-parallel rank's micro-batches "
        "per step (train.global_batch / (dp × train.micro_batch) = {} / ({} × {})) to be a "
        "multiple of parallel.pp = {}",
        cfg.parallel.vp, cfg.global_batch, mesh.dp(), cfg.micro_batch, mesh.pp());
  if (mesh.tp() > 1 || mesh.pp() > 1) {
    check_tensor_parallel(cfg.model, mesh.tp(), mesh.etp());
    check_model_pieces(cfg.model, mesh.tp(), mesh.pp() > 1, cfg.frozen_weights, mesh.etp());
    if (cfg.frozen_weights == FrozenWeights::Nf4)
      Transformer::check_nf4_shares(cfg.model, cfg.frozen, mesh.tp(), mesh.etp());
  }
  if (cfg.parallel.sequence_parallel && mesh.cp() == 1 && cfg.seq_len % mesh.tp())
    fail(
        "parallel.sp=true: train.seq_len = {} is not divisible by parallel.tp = {} (the tokens "
        "are split over the tensor-parallel ranks)",
        cfg.seq_len, mesh.tp());
  const int64_t dp = mesh.dp(), B = cfg.micro_batch;
  if (cfg.global_batch % (dp * B))
    fail(
        "train.global_batch = {} is not a multiple of data-parallel size × train.micro_batch = "
        "{} × {} = {} (world {} with parallel.dp = world / (tp × cp × pp))",
        cfg.global_batch, dp, B, dp * B, mesh.world_size());
}

}  // namespace nk
