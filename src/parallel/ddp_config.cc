#include "parallel/ddp_config.h"

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk::parallel {

namespace {

const char* shard_name(Shard s) {
  switch (s) {
    case Shard::Optimizer:
      return "optimizer";
    case Shard::Gradients:
      return "grads";
    case Shard::Full:
      return "full";
    case Shard::None:
      break;
  }
  return "none";
}

}  // namespace

int64_t DdpConfig::bucket_elems() const {
  return std::max<int64_t>(1, int64_t(std::llround(bucket_mb * 1048576.0 / 4.0)));
}

void DdpConfig::bind(ConfigBinder& b) {
  b.bind("parallel.bucket_mb", bucket_mb,
         "data parallel: MiB of f32 gradients per all-reduce bucket (reverse layer order)");
  b.bind("parallel.overlap_grad_reduce", overlap_grad_reduce,
         "data parallel: start each bucket's all-reduce during the backward pass as soon as its "
         "gradients are final (false: all after the backward)");
  b.bind_with<std::string>(
      "parallel.shard", shard_name(shard),
      "data parallel: none (plain DDP), optimizer (ZeRO-1: optimizer state and the update "
      "sharded over dp, gradients reduce-scattered), grads (ZeRO-2: the gradients sharded too, "
      "every micro-batch's reduce-scattered as they are final and the rest handed back), full "
      "(FSDP / ZeRO-3: the weights sharded too, each layer's gathered just before it runs)",
      [this](const std::string& s) {
        for (Shard v : {Shard::None, Shard::Optimizer, Shard::Gradients, Shard::Full})
          if (s == shard_name(v)) {
            shard = v;
            return;
          }
        fail("parallel.shard: '{}' is not one of none, optimizer, grads, full", s);
      });
}

void DdpConfig::check() const {
  if (!(bucket_mb > 0) || !std::isfinite(bucket_mb))
    fail("parallel.bucket_mb: must be positive, got {}", bucket_mb);
}

DdpConfig ddp_config(const Config& c) {
  DdpConfig d;
  ConfigReader r(c);
  d.bind(r);
  d.check();
  return d;
}

}  // namespace nk::parallel
