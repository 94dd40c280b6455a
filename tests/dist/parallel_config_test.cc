#include "dist/parallel_config.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace nk::dist {
namespace {

ConfigSchema schema() {
  return schema_of([](ConfigBinder& b) { ParallelConfig().bind(b); });
}

TEST(ParallelConfig, DefaultsAreOneProcessPerReplica) {
  auto p = parallel_config(Config::defaults(schema()));
  EXPECT_EQ(p.mesh.tp, 1);
  EXPECT_EQ(p.mesh.dp, 0);
  EXPECT_EQ(p.mesh.etp, 0);
  EXPECT_EQ(p.mesh.order, "tp-cp-ep-dp-pp");
  EXPECT_EQ(p.timeout_s, 300);
  EXPECT_EQ(p.cp_comm_type, "p2p");  // ring attention, as Megatron-Core's default
  Mesh m(4, 1, p.mesh);
  EXPECT_EQ(m.dp(), 4);
}

TEST(ParallelConfig, OverridesReachTheMesh) {
  auto c = Config::load(schema(), "",
                        {"parallel.tp=2", "parallel.pp=2", "parallel.order=tp-pp-dp",
                         "parallel.timeout_s=2.5", "parallel.cp_comm_type=a2a"});
  auto p = parallel_config(c);
  EXPECT_EQ(p.timeout_s, 2.5);
  EXPECT_EQ(p.cp_comm_type, "a2a");
  Mesh m(8, 0, p.mesh);
  EXPECT_EQ(m.dp(), 2);
  EXPECT_EQ(m.order(), "tp-pp-dp-cp-ep");
}

TEST(ParallelConfig, BadValuesNameTheKey) {
  auto bad = [](const std::string& o) {
    return test::error_of([&] { parallel_config(Config::load(schema(), "", {o})); });
  };
  EXPECT_TRUE(test::contains(bad("parallel.timeout_s=0"), "parallel.timeout_s must be positive"));
  EXPECT_TRUE(test::contains(bad("parallel.tp=-2"), "parallel.tp = -2 is out of range"));
  EXPECT_TRUE(test::contains(bad("parallel.tpp=2"), "parallel.tp"));
  EXPECT_TRUE(test::contains(bad("parallel.pp_layout=2,x"), "parallel.pp_layout: 'x'"));
  EXPECT_TRUE(test::contains(bad("parallel.vp=2"), "parallel.vp = 2 needs parallel.pp > 1"));
  EXPECT_TRUE(test::contains(bad("parallel.tp=99999999999"), "parallel.tp"));
  auto bad_all = [](std::vector<std::string> o) {
    return test::error_of([&] { parallel_config(Config::load(schema(), "", o)); });
  };
  EXPECT_TRUE(test::contains(bad_all({"parallel.pp=2", "parallel.pp_layout=1,2,3"}),
                             "parallel.pp_layout lists 3 stages, parallel.pp = 2"));
  // With virtual stages, one count each.
  EXPECT_TRUE(
      test::contains(bad_all({"parallel.pp=4", "parallel.vp=2", "parallel.pp_layout=2,4,4,2"}),
                     "parallel.pp_layout lists 4 stages, parallel.pp × parallel.vp = 4 × 2"));
  // Megatron-Core's names only (not DeepSpeed's "ulysses" nor "allgather").
  EXPECT_TRUE(test::contains(bad("parallel.cp_comm_type=ulysses"),
                             "parallel.cp_comm_type = 'ulysses': expected p2p"));
  EXPECT_TRUE(test::contains(bad("parallel.cp_comm_type=A2A"), "parallel.cp_comm_type"));
}

// Megatron-Core's other two: all_gather, and a2a+p2p with its group sizes
// (parallel.hierarchical_context_parallel_sizes, a2a first), which reach the
// mesh as its hierarchical groups.
TEST(ParallelConfig, AllGatherAndHierarchicalCommTypes) {
  auto ag = parallel_config(
      Config::load(schema(), "", {"parallel.cp=2", "parallel.cp_comm_type=all_gather"}));
  EXPECT_EQ(ag.cp_comm_type, "all_gather");
  EXPECT_TRUE(ag.hierarchical_cp_sizes.empty());
  EXPECT_EQ(ag.mesh.hcp_a2a, 0);
  auto h = parallel_config(Config::load(schema(), "",
                                        {"parallel.cp=4", "parallel.cp_comm_type=a2a+p2p",
                                         "parallel.hierarchical_context_parallel_sizes=2,2"}));
  EXPECT_EQ(h.cp_comm_type, "a2a+p2p");
  EXPECT_EQ(h.hierarchical_cp_sizes, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(h.mesh.hcp_a2a, 2);
  Mesh m(4, 3, h.mesh);
  EXPECT_EQ(m.group("hierarchical-cp-a2a").ranks, (std::vector<int>{2, 3}));
  EXPECT_EQ(m.group("hierarchical-cp-p2p").ranks, (std::vector<int>{1, 3}));
  EXPECT_EQ(m.group("hierarchical-cp-p2p").rank, 1);
}

// set_cp_comm (the layout search's way in): the type and the sizes as the
// keys set them, mesh.hcp_a2a with them; check() judges the result as it
// judges the keys.
TEST(ParallelConfig, SetCpCommSetsWhatTheKeysSet) {
  ParallelConfig p = parallel_config(Config::load(schema(), "", {"parallel.cp=4"}));
  p.set_cp_comm("a2a+p2p", {2, 2});
  EXPECT_EQ(p.cp_comm_type, "a2a+p2p");
  EXPECT_EQ(p.hierarchical_cp_sizes, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(p.mesh.hcp_a2a, 2);
  EXPECT_NO_THROW(p.check());
  EXPECT_EQ(Mesh(4, 0, p.mesh).group("hierarchical-cp-a2a").size(), 2);
  p.set_cp_comm("a2a");
  EXPECT_TRUE(p.hierarchical_cp_sizes.empty());
  EXPECT_EQ(p.mesh.hcp_a2a, 0);
  EXPECT_NO_THROW(p.check());
  p.set_cp_comm("a2a+p2p", {4, 2});  // 8 ranks for cp 4
  EXPECT_TRUE(test::contains(test::error_of([&] { p.check(); }),
                             "the a2a size × the p2p size must be parallel.cp = 4"));
}

TEST(ParallelConfig, BadContextParallelCommNamesTheKey) {
  auto bad = [](std::vector<std::string> o) {
    return test::error_of([&] { parallel_config(Config::load(schema(), "", o)); });
  };
  const std::string hs = "parallel.hierarchical_context_parallel_sizes";
  EXPECT_TRUE(test::contains(bad({"parallel.cp_comm_type=allgather"}),
                             "parallel.cp_comm_type = 'allgather': expected p2p (ring attention), "
                             "a2a (all-to-all, Ulysses), all_gather"));
  EXPECT_TRUE(test::contains(bad({"parallel.cp=4", "parallel.cp_comm_type=a2a+p2p"}),
                             "parallel.cp_comm_type = a2a+p2p needs " + hs));
  EXPECT_TRUE(test::contains(bad({"parallel.cp=4", "parallel.cp_comm_type=a2a+p2p", hs + "=3,2"}),
                             hs + " = 3,2: the a2a size 3 does not divide parallel.cp = 4"));
  EXPECT_TRUE(test::contains(bad({"parallel.cp=4", "parallel.cp_comm_type=a2a+p2p", hs + "=2,4"}),
                             hs + " = 2,4: the a2a size × the p2p size must be parallel.cp = 4"));
  EXPECT_TRUE(test::contains(bad({"parallel.cp=4", "parallel.cp_comm_type=a2a+p2p", hs + "=4"}),
                             "got '4'"));
  EXPECT_TRUE(test::contains(bad({"parallel.cp=4", "parallel.cp_comm_type=p2p", hs + "=2,2"}),
                             hs + " = 2,2 is for parallel.cp_comm_type=a2a+p2p"));
  EXPECT_TRUE(test::contains(bad({hs + "=2,x"}), hs + ": 'x' is not a count of ranks"));
  // The mesh refuses an a2a size that does not divide cp by the same key.
  MeshSpec spec;
  spec.cp = 4;
  spec.hcp_a2a = 3;
  EXPECT_TRUE(test::contains(test::error_of([&] { Mesh(4, 0, spec); }),
                             hs + ": the a2a size 3 does not divide parallel.cp = 4"));
}

TEST(ParallelConfig, PipelineLayoutRoundTripsThroughTheBinder) {
  // 2 stages of 2 virtual stages each: pp × vp counts.
  auto p = parallel_config(
      Config::load(schema(), "", {"parallel.pp=2", "parallel.pp_layout=2,4,4,2", "parallel.vp=2"}));
  EXPECT_EQ(p.pp_layout, (std::vector<int64_t>{2, 4, 4, 2}));
  EXPECT_EQ(p.vp, 2);
  // The schema a filled config declares shows its values as defaults
  // (what --print-config writes).
  ConfigSchema s = schema_of([&](ConfigBinder& b) { p.bind(b); });
  EXPECT_EQ(p.pp_layout, (std::vector<int64_t>{2, 4, 4, 2}));
  EXPECT_EQ(parallel_config(Config::defaults(s)).pp_layout, p.pp_layout);
}

}  // namespace
}  // namespace nk::dist
