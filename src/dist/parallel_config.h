// The parallel.* config keys that dist owns: the mesh sizes, its order and the
// collective timeout. A recipe binds them with ParallelConfig::bind like any
// other settings (core/config_bind.h) and checks them with check().
#pragma once
#include <string>
#include <vector>

#include "core/config_bind.h"
#include "dist/mesh.h"

namespace nk::dist {

struct ParallelConfig {
  MeshSpec mesh;
  // Sequence parallelism (parallel.sp): the norms and residual stream split
  // over the tp group along the tokens (needs tp > 1).
  bool sequence_parallel = false;
  // How context parallelism's attention communicates (parallel.cp_comm_type,
  // Megatron-Core's key): "p2p" ring attention, "a2a" all-to-all over the
  // heads (DeepSpeed-Ulysses), "all_gather" the whole row's keys and values
  // gathered, "a2a+p2p" hierarchical (nn/context_parallel.h).
  std::string cp_comm_type = "p2p";
  // a2a+p2p: the a2a (inner) and p2p (outer) group sizes, a × p = cp
  // (parallel.hierarchical_context_parallel_sizes, Megatron-Core's key);
  // empty otherwise. Its first value is mesh.hcp_a2a.
  std::vector<int64_t> hierarchical_cp_sizes;
  // Layers per pipeline stage, in order (parallel.pp_layout); empty: even.
  std::vector<int64_t> pp_layout;
  // Virtual pipeline stages per rank (parallel.vp): the interleaved schedule.
  int64_t vp = 1;
  double timeout_s = 300;  // every collective and point-to-point wait, in seconds

  void bind(ConfigBinder& b);
  // parallel.cp_comm_type and parallel.hierarchical_context_parallel_sizes
  // set as the keys set them (the sizes' first value is also mesh.hcp_a2a);
  // check() and the trainer's layout checks say whether they train.
  void set_cp_comm(const std::string& type, const std::vector<int64_t>& hierarchical_sizes = {});
  void set_hierarchical_cp_sizes(const std::vector<int64_t>& sizes);
  // nk::Error naming the key for a value out of range or two keys that do
  // not go together (layout checks that need the world size come later, from
  // Mesh).
  void check() const;
};

// The keys as a recipe reads them: bound from `config`, then checked.
ParallelConfig parallel_config(const Config& config);

}  // namespace nk::dist
