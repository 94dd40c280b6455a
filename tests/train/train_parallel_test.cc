#include "train/train_parallel.h"

#include <gtest/gtest.h>

#include "core/error.h"

namespace nk {
namespace {

TrainConfig config(const std::vector<std::string>& extra) {
  std::vector<std::string> o = {"data.path=unused.txt", "train.micro_batch=4",
                                "train.global_batch=8"};
  o.insert(o.end(), extra.begin(), extra.end());
  ConfigSchema s = train_schema();
  return train_config_from(Config::load(s, "", o));
}

std::string error_of(const TrainConfig& cfg, int world) {
  try {
    train_mesh(cfg, world, 0);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainParallel, KeysAreInTheTrainingSchema) {
  TrainConfig c = config(
      {"parallel.bucket_mb=0.5", "parallel.overlap_grad_reduce=false", "parallel.timeout_s=7"});
  EXPECT_EQ(c.ddp.bucket_mb, 0.5);
  EXPECT_FALSE(c.ddp.overlap_grad_reduce);
  EXPECT_EQ(c.parallel.timeout_s, 7);
  EXPECT_THROW(config({"parallel.bucket_mb=0"}), Error);
}

TEST(TrainParallel, GlobalBatchMustDivideOverTheDataParallelRanks) {
  TrainConfig c = config({});
  EXPECT_EQ(error_of(c, 1), "");
  EXPECT_EQ(error_of(c, 2), "");   // 8 = 2 ranks × 4
  std::string e = error_of(c, 4);  // 8 is not a multiple of 4 × 4
  EXPECT_NE(e.find("train.global_batch"), std::string::npos) << e;
  EXPECT_NE(e.find("train.micro_batch"), std::string::npos) << e;
  EXPECT_NE(e.find("4 × 4 = 16"), std::string::npos) << e;
  // 12 = 3 ranks × 4 works; 12 over 2 ranks is 1.5 micro-batches each.
  EXPECT_EQ(error_of(config({"train.global_batch=12"}), 3), "");
  EXPECT_NE(error_of(config({"train.global_batch=12"}), 2).find("train.global_batch"),
            std::string::npos);
}

TEST(TrainParallel, WorldSizeMustFitTheLayout) {
  std::string e = error_of(config({"parallel.dp=2"}), 3);
  EXPECT_NE(e.find("parallel."), std::string::npos) << e;
  e = error_of(config({"parallel.pp=2"}), 3);
  EXPECT_NE(e.find("parallel.pp"), std::string::npos) << e;
  // A layout the mesh accepts but nekton train cannot run yet.
  e = error_of(config({"parallel.tp=2"}), 2);
  EXPECT_NE(e.find("parallel.tp = 2"), std::string::npos) << e;
}

}  // namespace
}  // namespace nk
