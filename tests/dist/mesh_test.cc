// Mesh layouts against hand-worked groups: Megatron-Core's documented examples
// (initialize_model_parallel's and generate_masked_orthogonal_rank_groups'
// docstrings) and a few of our own, plus the errors for impossible layouts.
#include "dist/mesh.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "test_util.h"

namespace nk::dist {
namespace {

using Groups = std::vector<std::vector<int>>;

MeshSpec spec(int tp, int cp, int ep, int pp, std::string order = "tp-cp-ep-dp-pp") {
  MeshSpec s;
  s.tp = tp;
  s.cp = cp;
  s.ep = ep;
  s.pp = pp;
  s.order = std::move(order);
  return s;
}

TEST(Mesh, MegatronSixteenGpuExample) {
  // 16 GPUs, tp 2, pp 4: 8 dp groups of 2, 8 tp groups, 4 pp groups.
  Mesh m(16, 0, spec(2, 1, 1, 4));
  EXPECT_EQ(m.dp(), 2);
  EXPECT_EQ(m.group("dp").all,
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(m.group("tp").all,
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(m.group("pp").all,
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  EXPECT_EQ(m.group("embedding").all, (Groups{{0, 12}, {1, 13}, {2, 14}, {3, 15}}));
  EXPECT_EQ(m.group("position-embedding").all, (Groups{{0}, {1}, {2}, {3}}));
}

TEST(Mesh, MegatronMaskedGroupsExample) {
  // parallel_size [tp, dp, pp] = [2, 3, 4]: dp_group[0] = [0, 2, 4] ... dp_group[7] = [19, 21, 23].
  Mesh m(24, 0, spec(2, 1, 1, 4, "tp-dp-pp"));
  auto dp = m.group("dp").all;
  ASSERT_EQ(dp.size(), 8u);
  EXPECT_EQ(dp[0], (std::vector<int>{0, 2, 4}));
  EXPECT_EQ(dp[1], (std::vector<int>{1, 3, 5}));
  EXPECT_EQ(dp[7], (std::vector<int>{19, 21, 23}));
}

TEST(Mesh, OrderTpPpDp) {
  // 8 GPUs, order tp-pp-dp, sizes 2-2-2: dp groups [[0, 4], [1, 5], [2, 6], [3, 7]].
  Mesh m(8, 5, spec(2, 1, 1, 2, "tp-pp-dp"));
  EXPECT_EQ(m.group("dp").all, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.group("pp").all, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.group("tp-pp").all, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  // Rank 5 = tp 1 + 2·pp 0 + 4·dp 1.
  EXPECT_EQ(m.rank_in("tp"), 1);
  EXPECT_EQ(m.rank_in("pp"), 0);
  EXPECT_EQ(m.rank_in("dp"), 1);
  EXPECT_EQ(m.group("dp").ranks, (std::vector<int>{1, 5}));
}

TEST(Mesh, ContextParallelExample) {
  // 8 GPUs, tp 4, cp 2: cp groups [0, 4], [1, 5], [2, 6], [3, 7]; dp 1.
  Mesh m(8, 6, spec(4, 2, 1, 1));
  EXPECT_EQ(m.dp(), 1);
  EXPECT_EQ(m.group("cp").all, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.group("tp-cp").all, (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(m.group("cp").ranks, (std::vector<int>{2, 6}));
  EXPECT_EQ(m.rank_in("cp"), 1);
}

TEST(Mesh, DataWithContextParallel) {
  // 8 ranks, tp 2, cp 2 -> dp 2; rank = tp + 2·cp + 4·dp. dp-cp lists cp fastest
  // (the grid's order), whatever order the token names them in.
  Mesh m(8, 3, spec(2, 2, 1, 1));
  EXPECT_EQ(m.group("dp").all, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.group("dp-cp").all, (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(m.dense().groups("cp-dp"), m.group("dp-cp").all);
  EXPECT_EQ(m.group("tp-dp").all, (Groups{{0, 1, 4, 5}, {2, 3, 6, 7}}));
  EXPECT_EQ(m.group("tp-dp-cp").all, (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(m.group("dp-cp").ranks, (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(m.rank_in("dp-cp"), 1);
}

TEST(Mesh, ReplicaOfContextAndPipelineParallel) {
  // 16 ranks, tp 2, cp 2, pp 2 -> dp 2; rank = tp + 2·cp + 4·dp + 8·pp. A
  // data-parallel replica's ranks (tp-cp-pp): those of one dp coordinate.
  Mesh m(16, 13, spec(2, 2, 1, 2));
  EXPECT_EQ(m.dp(), 2);
  EXPECT_EQ(m.group("tp-cp-pp").all,
            (Groups{{0, 1, 2, 3, 8, 9, 10, 11}, {4, 5, 6, 7, 12, 13, 14, 15}}));
  EXPECT_EQ(m.rank_in("tp-cp-pp"), 5);  // rank 13: tp 1, cp 0, pp 1
}

TEST(Mesh, ExpertFoldingCarvesEpOutOfDp) {
  // 8 ranks, tp 2, ep 2: dense dp = 4; experts etp 2 × ep 2 × edp 2;
  // expert rank = etp + 2·ep + 4·edp.
  Mesh m(8, 6, spec(2, 1, 2, 1));
  EXPECT_EQ(m.dp(), 4);
  EXPECT_EQ(m.edp(), 2);
  EXPECT_EQ(m.group("dp").all, (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(m.group("ep").all, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.group("expert-dp").all, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.group("expert-tp").all, m.group("tp").all);
  EXPECT_EQ(m.group("expert-tp-ep").all, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.group("expert-tp-ep-pp").all, m.group("expert-tp-ep").all);
  EXPECT_EQ(m.rank_in("ep"), 1);
  EXPECT_EQ(m.rank_in("expert-dp"), 1);
}

TEST(Mesh, ExpertTensorParallelDiffers) {
  // 8 ranks, tp 2, etp 1, ep 4: experts 1 × 4 × 2 over the same ranks.
  MeshSpec s = spec(2, 1, 4, 1);
  s.etp = 1;
  Mesh m(8, 0, s);
  EXPECT_EQ(m.group("ep").all, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.group("expert-tp").all, (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(m.group("expert-dp").all, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
}

TEST(Mesh, ExpertTensorParallelNarrowerThanTpSplitsTheTokens) {
  // 8 ranks, tp 4, etp 2, ep 2: dense tp 4 × dp 2; experts etp 2 × ep 2 ×
  // edp 2 (expert rank = etp + 2·ep + 4·edp). Each tp group's ranks c·2 + j
  // (c < 2) hold expert-tp rank j's shares and split the MoE rows.
  MeshSpec s = spec(4, 1, 2, 1);
  s.etp = 2;
  Mesh m(8, 5, s);
  EXPECT_EQ(m.group("tp").all, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(m.group("expert-tp").all, (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(m.group("expert-token").all, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.group("ep").all, (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(m.group("expert-dp").all, (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(m.rank_in("expert-token"), 0);  // rank 5: tp rank 1 = 0·2 + 1
  EXPECT_EQ(m.rank_in("expert-tp"), 1);
  // etp = 1: the token split is the whole tp group; etp = tp: no split.
  s.etp = 1;
  EXPECT_EQ(Mesh(8, 0, s).group("expert-token").all, (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  s.etp = 4;
  s.ep = 1;
  EXPECT_EQ(Mesh(8, 0, s).group("expert-token").all,
            (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  // etp not dividing tp: no token groups (train_parallel.cc refuses it by key).
  s.tp = 3;
  s.etp = 2;
  const Mesh odd(6, 0, s);
  EXPECT_TRUE(test::contains(test::error_of([&] { odd.group("expert-token"); }),
                             "no process group 'expert-token'"));
}

TEST(Mesh, EmbeddingGroupsSkipMiddleStages) {
  // 8 ranks, tp 2, pp 4, dp 1: pp groups [0, 2, 4, 6] and [1, 3, 5, 7].
  Mesh middle(8, 2, spec(2, 1, 1, 4));
  EXPECT_EQ(middle.group("embedding").all, (Groups{{0, 6}, {1, 7}}));
  EXPECT_EQ(middle.rank_in("embedding"), -1);
  EXPECT_TRUE(middle.group("embedding").ranks.empty());
  Mesh last(8, 7, spec(2, 1, 1, 4));
  EXPECT_EQ(last.group("embedding").ranks, (std::vector<int>{1, 7}));
  EXPECT_EQ(last.rank_in("embedding"), 1);
  Mesh flat(2, 1, spec(1, 1, 1, 1));
  EXPECT_EQ(flat.group("embedding").all, (Groups{{0}, {1}}));
}

TEST(Mesh, SingleProcessHasTrivialGroups) {
  Mesh m(1, 0, MeshSpec{});
  for (auto& g : m.groups()) {
    EXPECT_EQ(g.ranks, (std::vector<int>{0})) << g.name;
    EXPECT_EQ(g.rank, 0) << g.name;
  }
}

TEST(Mesh, OmittedSizeOneDimensionsAreAppended) {
  MeshSpec s = spec(2, 1, 1, 1, "tp-dp");
  Mesh m(4, 0, s);
  EXPECT_EQ(m.order(), "tp-dp-cp-ep-pp");
  EXPECT_EQ(m.group("dp").all, (Groups{{0, 2}, {1, 3}}));
}

// Every group name partitions the world (embedding groups aside), each member
// sits at its own coordinate, and this rank's group is the one holding it.
TEST(Mesh, GroupsPartitionTheWorldForManyLayouts) {
  struct L {
    int world, tp, cp, ep, pp;
    const char* order;
  };
  for (L l : {L{8, 2, 2, 1, 2, "tp-cp-ep-dp-pp"}, L{12, 3, 1, 2, 2, "tp-cp-ep-dp-pp"},
              L{16, 2, 1, 4, 1, "tp-ep-dp-pp-cp"}, L{16, 1, 2, 2, 2, "tp-cp-ep-dp-pp"},
              L{6, 1, 1, 1, 3, "pp-dp-tp-cp-ep"}, L{24, 2, 1, 1, 3, "tp-pp-dp"}}) {
    for (int r = 0; r < l.world; ++r) {
      Mesh m(l.world, r, spec(l.tp, l.cp, l.ep, l.pp, l.order));
      for (auto& g : m.groups()) {
        if (g.name.find("embedding") != std::string::npos) continue;
        std::vector<int> seen;
        for (auto& members : g.all) {
          EXPECT_EQ(members.size(), g.all[0].size()) << g.name;
          seen.insert(seen.end(), members.begin(), members.end());
        }
        std::sort(seen.begin(), seen.end());
        for (int i = 0; i < l.world; ++i) ASSERT_EQ(seen[i], i) << g.name << " " << m.describe();
        ASSERT_GE(g.rank, 0) << g.name;
        EXPECT_EQ(g.ranks[g.rank], r) << g.name;
        const RankGrid& grid =
            g.name.rfind("expert-", 0) == 0 || g.name == "ep" ? m.expert() : m.dense();
        std::string token = g.name.rfind("expert-", 0) == 0 ? g.name.substr(7) : g.name;
        if (g.name != "world" && g.name != "expert-token") {  // (not one grid's dimension)
          EXPECT_EQ(grid.group_of(r, token), g.ranks) << g.name;
        }
      }
      EXPECT_EQ(m.rank_in("tp"), m.dense().coord(r, "tp"));
      EXPECT_EQ(m.rank_in("dp"), m.dense().coord(r, "dp"));
      EXPECT_EQ(m.rank_in("pp"), m.dense().coord(r, "pp"));
      EXPECT_EQ(m.rank_in("ep"), m.expert().coord(r, "ep"));
      EXPECT_EQ(m.group("pp").all, m.expert().groups("pp"));
    }
  }
}

TEST(Mesh, ImpossibleLayoutsNameTheKeys) {
  using test::contains;
  using test::error_of;
  auto err = [](int world, MeshSpec s) { return error_of([&] { Mesh(world, 0, s); }); };
  EXPECT_TRUE(contains(err(6, spec(4, 1, 1, 1)),
                       "world size 6 is not divisible by parallel.tp × parallel.cp × parallel.pp"))
      << err(6, spec(4, 1, 1, 1));
  MeshSpec dp3 = spec(2, 1, 1, 1);
  dp3.dp = 3;
  EXPECT_TRUE(contains(err(8, dp3), "parallel.dp=3 does not fit: world size 8")) << err(8, dp3);
  EXPECT_TRUE(contains(err(4, spec(2, 1, 1, 1, "tp-xx-dp")),
                       "parallel.order 'tp-xx-dp': unknown dimension 'xx'"));
  EXPECT_TRUE(contains(err(4, spec(2, 1, 1, 1, "tp-dp-tp")),
                       "parallel.order 'tp-dp-tp': 'tp' appears twice"));
  EXPECT_TRUE(contains(err(4, spec(2, 1, 1, 2, "tp-dp")),
                       "parallel.order 'tp-dp' leaves out 'pp', but its size is 2 (parallel.pp)"));
  EXPECT_TRUE(
      contains(err(4, spec(1, 1, 3, 1)),
               "world size 4 is not divisible by parallel.etp × parallel.ep × parallel.pp"));
  EXPECT_TRUE(contains(err(4, spec(0, 1, 1, 1)), "parallel.tp must be at least 1, got 0"));
  // pp not last and the dense and expert dp differ (Megatron refuses it too).
  EXPECT_TRUE(contains(err(8, spec(1, 1, 2, 2, "tp-cp-ep-pp-dp")), "does not end with pp"))
      << err(8, spec(1, 1, 2, 2, "tp-cp-ep-pp-dp"));
  EXPECT_TRUE(contains(error_of([] { Mesh(4, 0, MeshSpec{}).group("dpcp"); }),
                       "no process group 'dpcp' in the mesh (groups: tp, cp, dp, pp, dp-cp"));
  EXPECT_TRUE(contains(error_of([] { Mesh(4, 4, MeshSpec{}); }), "rank 4 is outside a world of 4"));
}

}  // namespace
}  // namespace nk::dist
