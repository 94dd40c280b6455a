// Collectives on the sub-groups of 2×2 meshes (4 ranks): each group reduces and
// gathers over exactly the members the Mesh lists, several groups in flight at
// once. Skipped on other world sizes.
#include "dist/communicator.h"
#include "mpi_env.h"
#include "tensors.h"
#include "test_util.h"

namespace nk::test {
namespace {

dist::MeshSpec tp_dp() {
  dist::MeshSpec s;
  s.tp = 2;  // dp = 2
  return s;
}

#define NK_NEED_FOUR_RANKS() \
  if (mpi().world_size() != 4) GTEST_SKIP() << "needs 4 ranks"

// all_reduce of the world rank over a group equals the sum of its listed members.
void expect_group_sum(dist::Communicator& c, const dist::MeshGroup& g, DType dt) {
  Tensor x = tensor_f32(std::vector<float>(8, float(mpi().rank())), dt);
  c.all_reduce(x);
  float want = 0;
  for (int w : g.ranks) want += float(w);
  for (float v : values(x)) ASSERT_EQ(v, want) << g.name;
}

TEST(MeshGroups, TensorAndDataGroupsReduceOverTheirMembers) {
  NK_NEED_FOUR_RANKS();
  auto& l = layout(tp_dp());
  for (DType dt : {DType::F32, DType::BF16})
    for (auto* name : {"tp", "dp", "dp-cp", "tp-pp", "tp-dp", "world"})
      expect_group_sum(l.groups.get(name), l.mesh.group(name), dt);
  EXPECT_EQ(l.groups.get("tp").world_ranks(), l.mesh.group("tp").ranks);
  EXPECT_EQ(l.groups.get("dp").rank(), l.mesh.rank_in("dp"));
}

TEST(MeshGroups, GatherListsMembersInGroupOrder) {
  NK_NEED_FOUR_RANKS();
  auto& l = layout(tp_dp());
  for (auto* name : {"tp", "dp"}) {
    auto& c = l.groups.get(name);
    Tensor in = tensor_f32({float(mpi().rank())}, DType::I32);
    Tensor out = Tensor::zeros({c.size()}, DType::I32);
    c.all_gather(in, out);
    std::vector<float> want(l.mesh.group(name).ranks.begin(), l.mesh.group(name).ranks.end());
    EXPECT_EQ(values(out), want) << name;
  }
}

// A tp and a dp all-reduce in flight together (as a TP layer's reduction would
// overlap a DP bucket), bf16 and f32, waited in either order.
TEST(MeshGroups, TwoGroupsInFlightAtOnce) {
  NK_NEED_FOUR_RANKS();
  auto& l = layout(tp_dp());
  float r = float(mpi().rank());
  Tensor a = tensor_f32(std::vector<float>(1000, r), DType::BF16);
  Tensor b = tensor_f32(std::vector<float>(1000, 10 * r), DType::F32);
  auto wa = l.groups.get("tp").all_reduce_async(a, dist::ReduceOp::Avg);
  auto wb = l.groups.get("dp").all_reduce_async(b, dist::ReduceOp::Max);
  wb->wait();
  wa->wait();
  auto& tp = l.mesh.group("tp").ranks;
  auto& dp = l.mesh.group("dp").ranks;
  for (float v : values(a)) ASSERT_EQ(v, float(tp[0] + tp[1]) / 2);
  for (float v : values(b)) ASSERT_EQ(v, 10.f * float(std::max(dp[0], dp[1])));
}

TEST(MeshGroups, ExpertGroups) {
  NK_NEED_FOUR_RANKS();
  dist::MeshSpec s;
  s.ep = 2;  // dense dp 4; experts ep 2 × edp 2
  auto& l = layout(s);
  for (auto* name : {"ep", "expert-dp", "expert-tp-ep", "dp"})
    expect_group_sum(l.groups.get(name), l.mesh.group(name), DType::F32);
}

TEST(MeshGroups, EmbeddingGroupOnlyOnFirstAndLastStage) {
  NK_NEED_FOUR_RANKS();
  dist::MeshSpec s;
  s.pp = 4;
  auto& l = layout(s);
  int stage = l.mesh.rank_in("pp");
  bool member = stage == 0 || stage == 3;
  ASSERT_EQ(l.groups.has("embedding"), member);
  if (member) {
    expect_group_sum(l.groups.get("embedding"), l.mesh.group("embedding"), DType::F32);
  } else {
    EXPECT_TRUE(contains(error_of([&] { l.groups.get("embedding"); }),
                         "this rank is not in process group 'embedding'"));
  }
  expect_group_sum(l.groups.get("pp"), l.mesh.group("pp"), DType::F32);
}

}  // namespace
}  // namespace nk::test
