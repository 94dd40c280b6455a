#include "dist/mesh.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "core/error.h"

namespace nk::dist {

namespace {

const std::vector<std::string> kDims = {"tp", "cp", "ep", "dp", "pp"};

int spec_size(const MeshSpec& s, const std::string& dim) {
  if (dim == "tp") return s.tp;
  if (dim == "cp") return s.cp;
  if (dim == "ep") return s.ep;
  if (dim == "dp") return s.dp;
  return s.pp;
}

// The order's names, checked, with omitted size-1 dimensions appended (as Megatron does).
std::vector<std::string> complete_order(const MeshSpec& s) {
  auto parts = split_order(s.order);
  for (size_t i = 0; i < parts.size(); ++i) {
    if (std::find(kDims.begin(), kDims.end(), parts[i]) == kDims.end())
      fail("parallel.order '{}': unknown dimension '{}' (expected names from {})", s.order,
           parts[i], fmt::join(kDims, ", "));
    if (std::find(parts.begin(), parts.begin() + i, parts[i]) != parts.begin() + i)
      fail("parallel.order '{}': '{}' appears twice", s.order, parts[i]);
  }
  for (auto& d : kDims) {
    if (std::find(parts.begin(), parts.end(), d) != parts.end()) continue;
    if (spec_size(s, d) != 1)
      fail("parallel.order '{}' leaves out '{}', but its size is {} (parallel.{})", s.order, d,
           spec_size(s, d), d);
    parts.push_back(d);
  }
  return parts;
}

}  // namespace

Mesh::Mesh(int world_size, int rank, const MeshSpec& spec) : world_(world_size), rank_(rank) {
  if (world_size < 1 || rank < 0 || rank >= world_size)
    fail("rank {} is outside a world of {} processes", rank, world_size);
  const std::initializer_list<std::pair<const char*, int>> sizes = {
      {"tp", spec.tp}, {"cp", spec.cp}, {"ep", spec.ep}, {"pp", spec.pp}};
  for (auto [key, v] : sizes)
    if (v < 1) fail("parallel.{} must be at least 1, got {}", key, v);
  if (spec.dp < 0) fail("parallel.dp must be 0 (inferred) or at least 1, got {}", spec.dp);
  if (spec.etp < 0) fail("parallel.etp must be 0 (= parallel.tp) or at least 1, got {}", spec.etp);

  spec_ = spec;
  int model = spec.tp * spec.cp * spec.pp;
  if (world_ % model != 0)
    fail("world size {} is not divisible by parallel.tp × parallel.cp × parallel.pp = {} × {} × {}",
         world_, spec.tp, spec.cp, spec.pp);
  if (spec.dp != 0 && spec.dp != world_ / model)
    fail(
        "parallel.dp={} does not fit: world size {} / (parallel.tp × parallel.cp × parallel.pp = "
        "{}) = {} (parallel.dp=0 infers it)",
        spec.dp, world_, model, world_ / model);
  spec_.dp = world_ / model;
  if (spec_.etp == 0) spec_.etp = spec.tp;
  int expert_model = spec_.etp * spec.ep * spec.pp;
  if (world_ % expert_model != 0)
    fail(
        "world size {} is not divisible by parallel.etp × parallel.ep × parallel.pp = {} × {} × {}",
        world_, spec_.etp, spec.ep, spec.pp);
  edp_ = world_ / expert_model;

  auto parts = complete_order(spec_);
  spec_.order = fmt::format("{}", fmt::join(parts, "-"));
  if (spec.pp > 1 && parts.back() != "pp" && edp_ != spec_.dp)
    fail(
        "parallel.order '{}' does not end with pp while parallel.pp={}: the dense data-parallel "
        "size ({}) and the expert one ({}) must then be equal",
        spec_.order, spec.pp, spec_.dp, edp_);

  std::vector<RankGrid::Dim> dense, expert;
  for (auto& d : parts) {
    dense.push_back({d, d == "ep" ? 1 : spec_size(spec_, d)});
    int e = d == "tp" ? spec_.etp : d == "cp" ? 1 : d == "dp" ? edp_ : spec_size(spec_, d);
    expert.push_back({d, e});
  }
  dense_ = RankGrid(dense);
  expert_ = RankGrid(expert);
  if (dense_.groups("pp") != expert_.groups("pp"))
    fail(
        "parallel.order '{}': the pipeline groups of dense and expert layers differ "
        "(parallel.etp={}, parallel.ep={}); put pp last",
        spec_.order, spec_.etp, spec.ep);

  for (auto* t :
       {"tp", "cp", "dp", "pp", "dp-cp", "tp-cp", "tp-dp", "tp-dp-cp", "tp-pp", "tp-cp-pp"})
    add(t, dense_.groups(t));
  std::vector<std::vector<int>> embedding, position;
  for (auto& g : dense_.groups("pp")) {
    embedding.push_back(g.size() == 1 ? std::vector<int>{g[0]} : std::vector<int>{g[0], g.back()});
    position.push_back({g[0]});
  }
  add("embedding", embedding);
  add("position-embedding", position);
  add("ep", expert_.groups("ep"));
  for (auto* t : {"tp", "dp", "tp-ep", "tp-ep-pp"})
    add(std::string("expert-") + t, expert_.groups(t));
  // Expert tensor parallelism narrower than the attention's (Megatron-Core's
  // expert_tensor_parallel_size below tensor_model_parallel_size): of each
  // tp group's ranks, those c·etp + j (c < tp/etp) hold the same experts'
  // shares and split the MoE blocks' rows.
  if (spec_.tp % spec_.etp == 0) {
    std::vector<std::vector<int>> tokens;
    const int rows = spec_.tp / spec_.etp;
    for (auto& g : dense_.groups("tp"))
      for (int j = 0; j < spec_.etp; ++j) {
        std::vector<int> t;
        for (int c = 0; c < rows; ++c) t.push_back(g[size_t(c * spec_.etp + j)]);
        tokens.push_back(std::move(t));
      }
    add("expert-token", tokens);
  }
  if (spec.hcp_a2a > 0) {
    const int a = spec.hcp_a2a;
    if (spec.cp % a)
      fail(
          "parallel.hierarchical_context_parallel_sizes: the a2a size {} does not divide "
          "parallel.cp = {}",
          a, spec.cp);
    std::vector<std::vector<int>> inner, outer;
    for (const std::vector<int>& g : dense_.groups("cp")) {
      for (int j = 0; j < spec.cp / a; ++j)
        inner.emplace_back(g.begin() + j * a, g.begin() + (j + 1) * a);
      for (int s = 0; s < a; ++s) {
        outer.emplace_back();
        for (int j = 0; j < spec.cp / a; ++j) outer.back().push_back(g[size_t(j * a + s)]);
      }
    }
    add("hierarchical-cp-a2a", inner);
    add("hierarchical-cp-p2p", outer);
  }
  std::vector<int> world(world_);
  for (int r = 0; r < world_; ++r) world[r] = r;
  add("world", {world});
}

void Mesh::add(const std::string& name, std::vector<std::vector<int>> all) {
  MeshGroup g;
  g.name = name;
  for (auto& members : all) {
    auto at = std::find(members.begin(), members.end(), rank_);
    if (at == members.end()) continue;
    g.ranks = members;
    g.rank = int(at - members.begin());
  }
  g.all = std::move(all);
  groups_.push_back(std::move(g));
}

const MeshGroup& Mesh::group(const std::string& name) const {
  for (auto& g : groups_)
    if (g.name == name) return g;
  std::vector<std::string> names;
  for (auto& g : groups_) names.push_back(g.name);
  fail("no process group '{}' in the mesh (groups: {})", name, fmt::join(names, ", "));
}

std::string Mesh::describe() const {
  return fmt::format(
      "world {} = tp {} × cp {} × dp {} × pp {}, experts etp {} × ep {} × edp {} × pp {} "
      "(order {})",
      world_, spec_.tp, spec_.cp, spec_.dp, spec_.pp, spec_.etp, spec_.ep, edp_, spec_.pp,
      spec_.order);
}

}  // namespace nk::dist
