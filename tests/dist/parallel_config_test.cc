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
  // Megatron-Core's names only (not DeepSpeed's "ulysses" nor "allgather").
  EXPECT_TRUE(test::contains(bad("parallel.cp_comm_type=ulysses"),
                             "parallel.cp_comm_type = 'ulysses': expected p2p"));
  EXPECT_TRUE(test::contains(bad("parallel.cp_comm_type=A2A"), "parallel.cp_comm_type"));
}

TEST(ParallelConfig, PipelineLayoutRoundTripsThroughTheBinder) {
  auto p = parallel_config(
      Config::load(schema(), "", {"parallel.pp=4", "parallel.pp_layout=2,4,4,2", "parallel.vp=2"}));
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
