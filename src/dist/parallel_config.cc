#include "dist/parallel_config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"

namespace nk::dist {

namespace {

// "2,4,4,2" as counts; nk::Error naming the key for anything else.
std::vector<int64_t> parse_counts(const std::string& layout, const char* key, const char* what,
                                  const char* example) {
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
      fail("{}: '{}' is not a count of {} (expected e.g. {})", key, item, what, example);
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
         "ranks), a2a (all-to-all of the heads, DeepSpeed-Ulysses: heads divisible by tp × cp), "
         "all_gather (the whole row's K/V gathered on every rank) or a2a+p2p (hierarchical: "
         "parallel.hierarchical_context_parallel_sizes)");
  b.bind_with<std::string>(
      "parallel.hierarchical_context_parallel_sizes",
      fmt::format("{}", fmt::join(hierarchical_cp_sizes, ",")),
      "cp_comm_type=a2a+p2p: a2a,p2p group sizes, product parallel.cp (e.g. 2,2: heads over "
      "all-to-all within pairs of neighbouring cp ranks, ring attention across the pairs)",
      [this](const std::string& s) {
        set_hierarchical_cp_sizes(
            parse_counts(s, "parallel.hierarchical_context_parallel_sizes", "ranks", "2,2"));
      });
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
      "layers per pipeline stage, comma-separated (e.g. 2,4,4,2; empty: an even split); with "
      "parallel.vp, per virtual stage in model order (pp × vp of them)",
      [this](const std::string& s) {
        pp_layout = parse_counts(s, "parallel.pp_layout", "layers", "2,4,4,2");
      });
  b.bind("parallel.order", mesh.order,
         "rank order of the mesh dimensions, first varies fastest (Megatron's)");
  b.bind("parallel.timeout_s", timeout_s,
         "seconds any collective may wait for a peer before every rank stops with an error");
}

void ParallelConfig::set_cp_comm(const std::string& type,
                                 const std::vector<int64_t>& hierarchical_sizes) {
  cp_comm_type = type;
  set_hierarchical_cp_sizes(hierarchical_sizes);
}

void ParallelConfig::set_hierarchical_cp_sizes(const std::vector<int64_t>& sizes) {
  hierarchical_cp_sizes = sizes;
  mesh.hcp_a2a = sizes.empty() ? 0 : int(sizes[0]);
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
  if (!pp_layout.empty() && vp == 1 && int64_t(pp_layout.size()) != mesh.pp)
    fail("parallel.pp_layout lists {} stages, parallel.pp = {}", pp_layout.size(), mesh.pp);
  if (!pp_layout.empty() && vp > 1 && int64_t(pp_layout.size()) != int64_t(mesh.pp) * vp)
    fail(
        "parallel.pp_layout lists {} stages, parallel.pp × parallel.vp = {} × {} (with virtual "
        "stages it lists each one's layers, in model order)",
        pp_layout.size(), mesh.pp, vp);
  if (sequence_parallel && mesh.tp < 2)
    fail("parallel.sp=true needs parallel.tp > 1 (it splits the tensor-parallel group's rows)");
  if (cp_comm_type != "p2p" && cp_comm_type != "a2a" && cp_comm_type != "all_gather" &&
      cp_comm_type != "a2a+p2p")
    // (nn::parse_cp_comm's words: dist sits below nn.)
    fail(
        "parallel.cp_comm_type = '{}': expected p2p (ring attention), a2a (all-to-all, Ulysses), "
        "all_gather (keys and values gathered) or a2a+p2p (hierarchical, with "
        "parallel.hierarchical_context_parallel_sizes)",
        cp_comm_type);
  const std::vector<int64_t>& h = hierarchical_cp_sizes;
  if (cp_comm_type != "a2a+p2p" && !h.empty())
    fail(
        "parallel.hierarchical_context_parallel_sizes = {} is for parallel.cp_comm_type=a2a+p2p "
        "(parallel.cp_comm_type = {})",
        fmt::join(h, ","), cp_comm_type);
  if (cp_comm_type == "a2a+p2p") {
    if (h.size() != 2)
      fail(
          "parallel.cp_comm_type = a2a+p2p needs parallel.hierarchical_context_parallel_sizes = "
          "a2a,p2p (two group sizes whose product is parallel.cp = {}, e.g. {},2); got '{}'",
          mesh.cp, std::max(1, mesh.cp / 2), fmt::join(h, ","));
    if (h[0] < 1 || mesh.cp % h[0])
      fail(
          "parallel.hierarchical_context_parallel_sizes = {},{}: the a2a size {} does not divide "
          "parallel.cp = {}",
          h[0], h[1], h[0], mesh.cp);
    if (h[0] * h[1] != mesh.cp)
      fail(
          "parallel.hierarchical_context_parallel_sizes = {},{}: the a2a size × the p2p size must "
          "be parallel.cp = {}",
          h[0], h[1], mesh.cp);
  }
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
