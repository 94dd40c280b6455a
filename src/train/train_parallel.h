// The processes of a multi-process training run and the checks that refuse an
// impossible layout before any work starts. Today `nekton train` does data
// parallelism (parallel/distributed_data_parallel.h): every rank reads its
// own slice of each global batch and holds the whole model, or with
// parallel.shard its shard of the optimizer state (ZeRO-1) or of the weights
// too (FSDP); and tensor parallelism, optionally with sequence parallelism
// (nn/tensor_parallel.h), within each data-parallel replica; and for a
// Mixture-of-Experts model expert parallelism (parallel.ep, carved out of the
// data-parallel ranks: nn/expert_parallel.h); and context parallelism
// (nn/context_parallel.h: each sequence split over the "cp" group, ring
// attention, the all-to-all of the heads, the keys and values all-gathered
// or the hierarchical a2a+p2p, gradients summed over "dp-cp").
#pragma once
#include <cstdint>

#include "dist/mesh.h"
#include "dist/process_groups.h"
#include "model/transformer.h"
#include "train/train_config.h"

namespace nk {

// Passed to the Trainer of a run under mpirun/srun; both pointers null for one
// process (today's code path, bit for bit). Both must outlive the Trainer.
struct TrainParallel {
  const dist::Mesh* mesh = nullptr;
  dist::ProcessGroups* groups = nullptr;
  bool active() const { return mesh != nullptr && mesh->world_size() > 1; }
  int64_t world() const { return mesh ? mesh->world_size() : 1; }
  int64_t pp() const { return mesh ? mesh->pp() : 1; }
  // The model's tensor-parallel group (size 1: none); sp: parallel.sp. With
  // parallel.etp = 1 the MoE blocks' experts stay whole on every tp rank
  // (TensorParallel::experts_whole); with 1 < etp < tp they are split over
  // the "expert-tp" group and their rows over "expert-token"
  // (check_train_layout refuses etp > tp or not dividing it).
  nn::TensorParallel tensor_parallel(bool sp) const {
    if (!mesh || mesh->tp() == 1) return {};
    nn::TensorParallel tp{&groups->get("tp"), sp, mesh->etp() == 1};
    if (mesh->etp() > 1 && mesh->etp() < mesh->tp()) {
      tp.experts = &groups->get("expert-tp");
      tp.tokens = &groups->get("expert-token");
    }
    return tp;
  }
  // Group `name` of a multi-process run; null for one process, or when this
  // rank is in none of that name (the embedding group skips middle stages).
  dist::Communicator* group(const char* name) const {
    return mesh && groups->has(name) ? &groups->get(name) : nullptr;
  }
  // The model's context-parallel group (nn/context_parallel.h; size 1: none)
  // and how its attention communicates (parallel.cp_comm_type; a2a+p2p:
  // with the mesh's hierarchical groups).
  nn::ContextParallel context_parallel(nn::CpComm comm_type = nn::CpComm::P2P) const {
    if (!mesh || mesh->cp() == 1) return {};
    nn::ContextParallel cp;
    cp.comm = &groups->get("cp");
    cp.comm_type = comm_type;
    if (comm_type == nn::CpComm::A2AP2P) {  // parallel.hierarchical_context_parallel_sizes
      cp.a2a_comm = &groups->get("hierarchical-cp-a2a");
      cp.p2p_comm = &groups->get("hierarchical-cp-p2p");
    }
    return cp;
  }
  int64_t cp() const { return mesh ? mesh->cp() : 1; }
  int64_t cp_rank() const { return mesh ? mesh->rank_in("cp") : 0; }
  int64_t dp() const { return mesh ? mesh->dp() : 1; }
  int64_t dp_rank() const { return mesh ? mesh->rank_in("dp") : 0; }
  // The rank that prints the step log and writes metrics, checkpoints and the model.
  bool writes() const { return !mesh || mesh->rank() == 0; }
};

// The mesh of `world` processes for cfg.parallel, checked for training:
// nk::Error naming the keys when the world size does not fit the layout, a
// model-parallel size other than tp is asked for (not supported yet), tp
// does not divide the model's heads, MLP or vocabulary (or with parallel.sp
// train.seq_len) or comes with what it does not support yet, or
// train.global_batch is not a multiple of dp × train.micro_batch.
dist::Mesh train_mesh(const TrainConfig& cfg, int world, int rank);
void check_train_layout(const TrainConfig& cfg, const dist::Mesh& mesh);

}  // namespace nk
