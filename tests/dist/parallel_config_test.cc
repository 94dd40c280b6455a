#include "dist/parallel_config.h"

#include <gtest/gtest.h>

#include "test_util.h"

namespace nk::dist {
namespace {

ConfigSchema schema() {
  ConfigSchema s;
  add_parallel_keys(s);
  return s;
}

TEST(ParallelConfig, DefaultsAreOneProcessPerReplica) {
  auto p = parallel_config(Config::defaults(schema()));
  EXPECT_EQ(p.mesh.tp, 1);
  EXPECT_EQ(p.mesh.dp, 0);
  EXPECT_EQ(p.mesh.etp, 0);
  EXPECT_EQ(p.mesh.order, "tp-cp-ep-dp-pp");
  EXPECT_EQ(p.timeout_s, 300);
  Mesh m(4, 1, p.mesh);
  EXPECT_EQ(m.dp(), 4);
}

TEST(ParallelConfig, OverridesReachTheMesh) {
  auto c = Config::load(
      schema(), "",
      {"parallel.tp=2", "parallel.pp=2", "parallel.order=tp-pp-dp", "parallel.timeout_s=2.5"});
  auto p = parallel_config(c);
  EXPECT_EQ(p.timeout_s, 2.5);
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
}

}  // namespace
}  // namespace nk::dist
