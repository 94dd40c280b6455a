#include "train/train_parallel.h"

#include "core/error.h"
#include "parallel/pipeline_parallel.h"

namespace nk {

namespace {

// Context parallelism (nn/context_parallel.h) trains a dense decoder's
// language-model loss over unpacked rows, alone, with data parallelism
// (gradients over dp-cp) and with tensor parallelism; what it does not
// support yet is refused here, naming the key.
void check_context_parallel(const TrainConfig& cfg, const dist::Mesh& mesh) {
  const int cp = mesh.cp();
  if (cfg.seq_len % (2 * cp))
    fail(
        "parallel.cp = {}: train.seq_len = {} is not a multiple of 2 × parallel.cp = {} (each "
        "row is cut into 2·cp equal chunks)",
        cp, cfg.seq_len, 2 * cp);
  const char* unsupported = mesh.pp() > 1 ? "parallel.pp (pipeline parallelism)"
                            : cfg.ddp.shard != parallel::Shard::None
                                ? "parallel.shard (ZeRO-1 / FSDP)"
                            : !cfg.data.sft_path.empty() ? "data.sft_path (packed or padded rows)"
                            : cfg.model.has_adapters()   ? "peft.method (adapters)"
                            : cfg.device != kHost ? "train.device (only the CPU has the ring "
                                                    "attention kernel)"
                            : cfg.parallel.sequence_parallel ? "parallel.sp (sequence parallelism)"
                                                             : nullptr;
  if (unsupported)
    fail("parallel.cp = {}: {} under context parallelism is not supported yet (set parallel.cp=1)",
         cp, unsupported);
}

}  // namespace

dist::Mesh train_mesh(const TrainConfig& cfg, int world, int rank) {
  dist::Mesh mesh(world, rank, cfg.parallel.mesh);
  check_train_layout(cfg, mesh);
  return mesh;
}

void check_train_layout(const TrainConfig& cfg, const dist::Mesh& mesh) {
  // Mixture of Experts runs data, expert and pipeline parallel (1F1B) for
  // now: no tensor, sequence or context split of its layers.
  if (cfg.model.is_moe()) {
    const std::pair<const char*, int> sizes[] = {{"parallel.tp", mesh.tp()},
                                                 {"parallel.cp", mesh.cp()}};
    const char* only =
        "a Mixture-of-Experts model (model.num_experts = {}) trains on one process, data, "
        "expert (parallel.ep) or pipeline parallel (parallel.pp) only for now";
    for (const auto& [key, size] : sizes)
      if (size != 1)
        fail("{} = {}: {} (set it to 1)", key, size,
             fmt::format(fmt::runtime(only), cfg.model.num_experts));
    if (cfg.parallel.sequence_parallel)
      fail("parallel.sp = true: {} (set it to false)",
           fmt::format(fmt::runtime(only), cfg.model.num_experts));
    // The stages hand on the layers' routing records beside the residual
    // stream (parallel/pipeline_parallel.h); the interleaved schedule's
    // posted receives do not carry them yet.
    if (cfg.parallel.vp > 1)
      fail(
          "parallel.vp = {}: a Mixture-of-Experts model (model.num_experts = {}) runs the plain "
          "1F1B pipeline schedule only for now (set parallel.vp=1)",
          cfg.parallel.vp, cfg.model.num_experts);
    if (cfg.model.num_experts % mesh.ep())
      fail(
          "parallel.ep = {}: model.num_experts = {} does not split into equal counts over the "
          "expert-parallel ranks",
          mesh.ep(), cfg.model.num_experts);
    if (mesh.ep() > 1 && cfg.model.has_adapters())
      fail(
          "parallel.ep = {}: adapters (peft.method) on a Mixture-of-Experts model run on one "
          "process or data parallel only for now (set parallel.ep=1)",
          mesh.ep());
  } else if (mesh.ep() != 1) {
    fail("parallel.ep = {}: the model has no experts (model.num_experts = 0); set it to 1",
         mesh.ep());
  }
  if (mesh.cp() != 1) check_context_parallel(cfg, mesh);
  if (mesh.etp() != mesh.tp())
    fail(
        "parallel.etp = {}: expert tensor parallelism (each expert split over ranks) is not "
        "supported yet (leave it 0: parallel.tp)",
        mesh.etp());
  if (mesh.pp() > 1)
    parallel::pipeline_stage(cfg.model, mesh.pp(), 0, cfg.parallel.pp_layout, cfg.parallel.vp);
  if (cfg.parallel.vp > 1 && (cfg.global_batch / (mesh.dp() * cfg.micro_batch)) % mesh.pp())
    fail(
        "parallel.vp = {}: the interleaved schedule needs each data-parallel rank's micro-batches "
        "per step (train.global_batch / (dp × train.micro_batch) = {} / ({} × {})) to be a "
        "multiple of parallel.pp = {}",
        cfg.parallel.vp, cfg.global_batch, mesh.dp(), cfg.micro_batch, mesh.pp());
  if (mesh.tp() > 1 || mesh.pp() > 1) {
    check_tensor_parallel(cfg.model, mesh.tp());
    const char* unsupported = cfg.model.has_adapters() ? "peft.method (adapters)"
                              : !cfg.data.sft_path.empty() && mesh.pp() > 1
                                  ? "data.sft_path (fine-tuning) with parallel.pp"
                              : cfg.ddp.shard == parallel::Shard::Full
                                  ? "parallel.shard=full (FSDP)"
                              : cfg.ddp.shard != parallel::Shard::None && mesh.pp() > 1
                                  ? "parallel.shard with parallel.pp"
                              : !cfg.init_from.empty()                      ? "train.init_from"
                              : cfg.frozen_weights != FrozenWeights::Master ? "train.frozen_weights"
                                                                            : nullptr;
    if (unsupported)
      fail(
          "parallel.tp = {}, parallel.pp = {}: {} under tensor or pipeline parallelism is not "
          "supported yet",
          mesh.tp(), mesh.pp(), unsupported);
  }
  if (cfg.parallel.sequence_parallel && cfg.seq_len % mesh.tp())
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
