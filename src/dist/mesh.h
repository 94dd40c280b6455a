// Mesh: which processes work together on what. Built from the world size, this
// process's rank and the parallel sizes (config keys parallel.*), it gives every
// process group by name. Passed explicitly to whatever needs it, never a global.
//
// Layout (Megatron-Core's, initialize_model_parallel): two foldings of the same
// ranks over one order string (default "tp-cp-ep-dp-pp", first varies fastest):
//   dense layers:   tp × cp × dp × pp  = world   (ep is 1 here; dp = world / (tp·cp·pp))
//   expert layers: etp × ep × edp × pp = world   (cp is 1 here; edp = world / (etp·ep·pp))
// so expert parallelism is carved out of the dense data-parallel ranks (dp × cp),
// as in Megatron: with 8 ranks, tp 1, ep 8, dense layers see dp 8 and experts
// edp 1. The pipeline groups of both foldings must agree (checked).
//
// Groups (names as Megatron's), each a list of world ranks in group-rank order:
//   tp, cp, dp, pp          one dimension of the dense folding
//   dp-cp                   gradient reduction / distributed optimizer of dense params
//   tp-cp, tp-dp, tp-dp-cp  tensor with context / data parallel (fp8 amax, MoE)
//   tp-pp                   "model parallel": every rank holding one model replica
//   embedding               first and last stage of each pp group (tied embeddings)
//   position-embedding      first stage of each pp group
//   ep, expert-tp, expert-dp, expert-tp-ep, expert-tp-ep-pp   the expert folding
//   expert-token            with parallel.etp dividing parallel.tp: the tp/etp ranks of one tp
//                           group that split a MoE block's rows (nn/token_split.h), tp ranks
//                           c·etp + j for one j (its expert-tp rank when the expert-tp groups
//                           are the tp groups' runs of etp consecutive ranks: train_parallel.cc)
//   hierarchical-cp-a2a, hierarchical-cp-p2p   with MeshSpec::hcp_a2a = a only
//                           (Megatron's hierarchical cp groups): each cp group
//                           [m0 .. m(cp-1)] cut into a2a groups of a neighbours
//                           [m(j a) .. m(j a + a - 1)] and rings of the members
//                           at the same place in them [m(s), m(a + s), ...]
//   world                   every rank
#pragma once
#include <string>
#include <vector>

#include "dist/rank_grid.h"

namespace nk::dist {

struct MeshSpec {
  int tp = 1, cp = 1, ep = 1, pp = 1;
  int dp = 0;   // 0: inferred, world / (tp·cp·pp); else checked against it
  int etp = 0;  // expert tensor parallel size; 0: same as tp
  // Hierarchical context parallelism (parallel.cp_comm_type=a2a+p2p): the
  // inner (a2a) group size, a divisor of cp; 0: no hierarchical groups.
  int hcp_a2a = 0;
  std::string order = "tp-cp-ep-dp-pp";
};

struct MeshGroup {
  std::string name;                   // "dp-cp"
  std::vector<int> ranks;             // this process's group: world ranks, group-rank order
  int rank = -1;                      // this process's index in `ranks`; -1: not a member
  std::vector<std::vector<int>> all;  // every group of this name (disjoint; may not cover
                                      // the world: embedding groups skip middle stages)
  int size() const { return int(ranks.size()); }
};

class Mesh {
 public:
  // Throws nk::Error naming the parallel.* keys for an impossible layout.
  Mesh(int world_size, int rank, const MeshSpec& spec);

  int world_size() const { return world_; }
  int rank() const { return rank_; }
  int tp() const { return spec_.tp; }
  int cp() const { return spec_.cp; }
  int dp() const { return spec_.dp; }
  int pp() const { return spec_.pp; }
  int ep() const { return spec_.ep; }
  int etp() const { return spec_.etp; }
  int edp() const { return edp_; }
  // The order with the dimensions it omitted (all of size 1) appended.
  const std::string& order() const { return spec_.order; }

  // Throws nk::Error listing the known names when `name` is not one.
  const MeshGroup& group(const std::string& name) const;
  // This process's index in group `name` (its coordinate, for one dimension); -1 if outside.
  int rank_in(const std::string& name) const { return group(name).rank; }
  const std::vector<MeshGroup>& groups() const { return groups_; }

  const RankGrid& dense() const { return dense_; }
  const RankGrid& expert() const { return expert_; }
  // "world 8 = tp 2 × cp 1 × dp 4 × pp 1, experts etp 2 × ep 2 × edp 2 × pp 1 (order ...)"
  std::string describe() const;

 private:
  void add(const std::string& name, std::vector<std::vector<int>> all);

  int world_, rank_, edp_ = 1;
  MeshSpec spec_;
  RankGrid dense_, expert_;
  std::vector<MeshGroup> groups_;
};

}  // namespace nk::dist
