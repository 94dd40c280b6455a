#include "dist/parallel_config.h"

#include "core/error.h"

namespace nk::dist {

void add_parallel_keys(ConfigSchema& s) {
  s.add_int("parallel.tp", 1, "tensor-parallel size");
  s.add_int("parallel.cp", 1, "context-parallel size (sequence split for attention)");
  s.add_int("parallel.ep", 1, "expert-parallel size (carved out of dp × cp, as in Megatron)");
  s.add_int("parallel.etp", 0, "expert tensor-parallel size (0 = parallel.tp)");
  s.add_int("parallel.pp", 1, "pipeline-parallel size");
  s.add_int("parallel.dp", 0, "data-parallel size (0 = world / (tp × cp × pp))");
  s.add_bool("parallel.sp", false,
             "sequence parallel: norms and residual stream split over the tp ranks along the "
             "tokens (needs parallel.tp > 1)");
  s.add_int("parallel.vp", 1,
            "virtual pipeline stages per rank: the interleaved 1F1B schedule (needs parallel.pp > "
            "1)");
  s.add_string("parallel.pp_layout", "",
               "layers per pipeline stage, comma-separated (e.g. 2,4,4,2; empty: an even split)");
  s.add_string("parallel.order", "tp-cp-ep-dp-pp",
               "rank order of the mesh dimensions, first varies fastest (Megatron's)");
  s.add_float("parallel.timeout_s", 300,
              "seconds any collective may wait for a peer before every rank stops with an error");
}

ParallelConfig parallel_config(const Config& c) {
  ParallelConfig p;
  auto get = [&](const char* key) {
    int64_t v = c.get_int(key);
    if (v < 0 || v > (1 << 20)) fail("{} = {} is out of range", key, v);
    return int(v);
  };
  p.mesh.tp = get("parallel.tp");
  p.mesh.cp = get("parallel.cp");
  p.mesh.ep = get("parallel.ep");
  p.mesh.etp = get("parallel.etp");
  p.mesh.pp = get("parallel.pp");
  p.mesh.dp = get("parallel.dp");
  p.mesh.order = c.get_string("parallel.order");
  p.sequence_parallel = c.get_bool("parallel.sp");
  const std::string layout = c.get_string("parallel.pp_layout");
  for (size_t at = 0; !layout.empty() && at <= layout.size();) {
    const size_t comma = std::min(layout.find(',', at), layout.size());
    const std::string item = layout.substr(at, comma - at);
    size_t used = 0;
    int64_t n = -1;
    try {
      n = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != item.size() || item.empty() || n < 0)
      fail("parallel.pp_layout: '{}' is not a count of layers (expected e.g. 2,4,4,2)", item);
    p.pp_layout.push_back(n);
    at = comma + 1;
  }
  p.vp = c.get_int("parallel.vp");
  if (p.vp < 1 || p.vp > 1024) fail("parallel.vp = {} is out of range [1, 1024]", p.vp);
  if (p.vp > 1 && p.mesh.pp < 2)
    fail("parallel.vp = {} needs parallel.pp > 1 (virtual stages of a pipeline)", p.vp);
  if (!p.pp_layout.empty() && int64_t(p.pp_layout.size()) != p.mesh.pp)
    fail("parallel.pp_layout lists {} stages, parallel.pp = {}", p.pp_layout.size(), p.mesh.pp);
  if (p.sequence_parallel && p.mesh.tp < 2)
    fail("parallel.sp=true needs parallel.tp > 1 (it splits the tensor-parallel group's rows)");
  p.timeout_s = c.get_float("parallel.timeout_s");
  if (!(p.timeout_s > 0)) fail("parallel.timeout_s must be positive, got {}", p.timeout_s);
  return p;
}

}  // namespace nk::dist
