#include "parallel/ddp_config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk::parallel {

int64_t DdpConfig::bucket_elems() const {
  return std::max<int64_t>(1, int64_t(std::llround(bucket_mb * 1048576.0 / 4.0)));
}

void add_ddp_keys(ConfigSchema& s) {
  s.add_float("parallel.bucket_mb", 25,
              "data parallel: MiB of f32 gradients per all-reduce bucket (reverse layer order)");
  s.add_bool("parallel.overlap_grad_reduce", true,
             "data parallel: start each bucket's all-reduce during the backward pass as soon as "
             "its gradients are final (false: all after the backward)");
  s.add_string("parallel.shard", "none",
               "data parallel: none (plain DDP), optimizer (ZeRO-1: optimizer state and the "
               "update sharded over dp, gradients reduce-scattered), full (FSDP / ZeRO-3: the "
               "weights sharded too, each layer's gathered just before it runs)");
}

DdpConfig ddp_config(const Config& c) {
  DdpConfig d;
  d.bucket_mb = c.get_float("parallel.bucket_mb");
  if (!(d.bucket_mb > 0) || !std::isfinite(d.bucket_mb))
    fail("parallel.bucket_mb: must be positive, got {}", d.bucket_mb);
  d.overlap_grad_reduce = c.get_bool("parallel.overlap_grad_reduce");
  const std::string shard = c.get_string("parallel.shard");
  if (shard == "none")
    d.shard = Shard::None;
  else if (shard == "optimizer")
    d.shard = Shard::Optimizer;
  else if (shard == "full")
    d.shard = Shard::Full;
  else
    fail("parallel.shard: '{}' is not one of none, optimizer, full", shard);
  return d;
}

}  // namespace nk::parallel
