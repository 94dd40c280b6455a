// Megatron-Core's two other context-parallel attentions against one process
// (the fixture and tolerances of tests/parallel/context_parallel: losses and
// gradient norms of 10 steps within a relative 1e-5 in f32, the first
// step's gradients within 1e-5, the weights after ten steps within 1e-3):
//   parallel.cp_comm_type=all_gather  the whole row's keys and values
//       gathered on every rank: CP2 (grouped-query attention; Gemma 2's
//       capped scores and windows crossing the chunks with full recompute;
//       packed rows) on 2 ranks, CP4 (GQA, packed rows), CP2 × DP2 and
//       CP2 × TP2 on 4;
//   parallel.cp_comm_type=a2a+p2p     hierarchical, CP4 as 2 × 2
//       (parallel.hierarchical_context_parallel_sizes=2,2: the heads'
//       all-to-all within pairs of cp ranks, ring attention across them;
//       GQA, packed rows) on 4.
// Packed rows are fine-tuning rows of several prompt/answer documents each,
// the documents' boundaries crossing the chunks.
#include "parallel/context_parallel/cp_fixture.h"

namespace nk {
namespace {

using cp_test::kAllGather;

const std::vector<std::string> kHierarchical = {"parallel.cp_comm_type=a2a+p2p",
                                                "parallel.hierarchical_context_parallel_sizes=2,2"};

class ContextParallelVariants : public cp_test::ContextParallel {
 protected:
  void SetUp() override { set_up_with("cp_variants_mpi"); }
};

TEST_F(ContextParallelVariants, AllGatherCp2GroupedQuery) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 2, {kAllGather}});
}
TEST_F(ContextParallelVariants, AllGatherCp2CappedScoresWindowsFullRecompute) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gemma2-tiny",
         2,
         1,
         4,
         2,
         1,
         {kAllGather, "model.attn_logit_softcap=1.5", "model.query_pre_attn_scalar=20",
          "model.sliding_window=12", "train.recompute=full"}});
}
TEST_F(ContextParallelVariants, AllGatherCp2PackedRows) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  cp_test::Recipe r{"llama-tiny", 2, 1, 4, 2, 2, {kAllGather}};
  r.packed = true;
  check(r);
}
TEST_F(ContextParallelVariants, AllGatherCp4GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 4, 1, 4, 2, 1, {kAllGather}});
}
TEST_F(ContextParallelVariants, AllGatherCp4PackedRows) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  cp_test::Recipe r{"llama-tiny", 4, 1, 4, 2, 1, {kAllGather}};
  r.packed = true;
  check(r);
}
TEST_F(ContextParallelVariants, AllGatherCp2Dp2GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 2, {kAllGather}});
}
TEST_F(ContextParallelVariants, AllGatherCp2Tp2GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4, 1, {kAllGather}});
}
// 4 query and 2 key/value heads: each rank of an a2a pair takes 2 and 1
// (one GQA group) and rings them with the other pair's rank of its place.
TEST_F(ContextParallelVariants, HierarchicalCp4TwoByTwoGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 4, 1, 4, 2, 1, kHierarchical});
}
TEST_F(ContextParallelVariants, HierarchicalCp4TwoByTwoPackedRows) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  cp_test::Recipe r{"llama-tiny", 4, 1, 4, 2, 1, kHierarchical};
  r.packed = true;
  check(r);
}

}  // namespace
}  // namespace nk
