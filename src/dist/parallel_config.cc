#include "dist/parallel_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "core/error.h"

namespace nk::dist {

namespace {

// "2,4,4,2" as layer counts; nk::Error naming the key for anything else.
std::vector<int64_t> parse_pp_layout(const std::string& layout) {
  std::vector<int64_t> out;
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
    out.push_back(n);
    at = comma + 1;
  }
  return out;
}

}  // namespace

void ParallelConfig::bind(ConfigBinder& b) {
  b.bind("parallel.tp", mesh.tp, "tensor-parallel size");
  b.bind("parallel.cp", mesh.cp, "context-parallel size (sequence split for attention)");
  b.bind("parallel.cp_comm_type", cp_comm_type,
         "context parallelism's attention: p2p (ring attention, K/V blocks passed round the cp "
         "ranks) or a2a (all-to-all of the heads, DeepSpeed-Ulysses: heads divisible by tp × cp)");
  b.bind("parallel.ep", mesh.ep, "expert-parallel size (carved out of dp × cp, as in Megatron)");
  b.bind("parallel.etp", mesh.etp, "expert tensor-parallel size (0 = parallel.tp)");
  b.bind("parallel.pp", mesh.pp, "pipeline-parallel size");
  b.bind("parallel.dp", mesh.dp, "data-parallel size (0 = world / (tp × cp × pp))");
  b.bind("parallel.sp", sequence_parallel,
         "sequence parallel: norms and residual stream split over the tp ranks along the tokens "
         "(needs parallel.tp > 1)");
  b.bind("parallel.vp", vp,
         "virtual pipeline stages per rank: the interleaved 1F1B schedule (needs parallel.pp > 1)");
  b.bind_with<std::string>(
      "parallel.pp_layout", fmt::format("{}", fmt::join(pp_layout, ",")),
      "layers per pipeline stage, comma-separated (e.g. 2,4,4,2; empty: an even split)",
      [this](const std::string& s) { pp_layout = parse_pp_layout(s); });
  b.bind("parallel.order", mesh.order,
         "rank order of the mesh dimensions, first varies fastest (Megatron's)");
  b.bind("parallel.timeout_s", timeout_s,
         "seconds any collective may wait for a peer before every rank stops with an error");
}

void ParallelConfig::check() const {
  const std::pair<const char*, int> sizes[] = {{"parallel.tp", mesh.tp}, {"parallel.cp", mesh.cp},
                                               {"parallel.ep", mesh.ep}, {"parallel.etp", mesh.etp},
                                               {"parallel.pp", mesh.pp}, {"parallel.dp", mesh.dp}};
  for (const auto& [key, v] : sizes)
    if (v < 0 || v > (1 << 20)) fail("{} = {} is out of range", key, v);
  if (vp < 1 || vp > 1024) fail("parallel.vp = {} is out of range [1, 1024]", vp);
  if (vp > 1 && mesh.pp < 2)
    fail("parallel.vp = {} needs parallel.pp > 1 (virtual stages of a pipeline)", vp);
  if (!pp_layout.empty() && int64_t(pp_layout.size()) != mesh.pp)
    fail("parallel.pp_layout lists {} stages, parallel.pp = {}", pp_layout.size(), mesh.pp);
  if (sequence_parallel && mesh.tp < 2)
    fail("parallel.sp=true needs parallel.tp > 1 (it splits the tensor-parallel group's rows)");
  if (cp_comm_type != "p2p" && cp_comm_type != "a2a")
    fail(
        "parallel.cp_comm_type = '{}': expected p2p (ring attention) or a2a (all-to-all, "
        "Ulysses)",
        cp_comm_type);
  if (!(timeout_s > 0)) fail("parallel.timeout_s must be positive, got {}", timeout_s);
}

ParallelConfig parallel_config(const Config& c) {
  ParallelConfig p;
  ConfigReader r(c);
  p.bind(r);
  p.check();
  return p;
}

}  // namespace nk::dist
