#include "train/train_parallel.h"

#include "core/error.h"

namespace nk {

dist::Mesh train_mesh(const TrainConfig& cfg, int world, int rank) {
  dist::Mesh mesh(world, rank, cfg.parallel.mesh);
  check_train_layout(cfg, mesh);
  return mesh;
}

void check_train_layout(const TrainConfig& cfg, const dist::Mesh& mesh) {
  const std::pair<const char*, int> model_parallel[] = {{"parallel.tp", mesh.tp()},
                                                        {"parallel.cp", mesh.cp()},
                                                        {"parallel.pp", mesh.pp()},
                                                        {"parallel.ep", mesh.ep()},
                                                        {"parallel.etp", mesh.etp()}};
  for (const auto& [key, size] : model_parallel)
    if (size != 1)
      fail("{} = {}: nekton train runs data parallel only for now (set it to 1)", key, size);
  const int64_t dp = mesh.dp(), B = cfg.micro_batch;
  if (cfg.global_batch % (dp * B))
    fail(
        "train.global_batch = {} is not a multiple of data-parallel size × train.micro_batch = "
        "{} × {} = {} (world {} with parallel.dp = world / (tp × cp × pp))",
        cfg.global_batch, dp, B, dp * B, mesh.world_size());
}

}  // namespace nk
