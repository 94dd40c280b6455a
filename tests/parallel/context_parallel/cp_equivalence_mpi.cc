// Context parallelism (nn/context_parallel.h: each row split into 2·cp
// chunks over the "cp" group, ring attention, gradients summed over dp-cp)
// against one process (shared/DESIGN.md: every parallel feature has an
// equivalence test). Each rank trains the single-process reference itself,
// then takes part in the context-parallel run of the same recipe: the loss
// and gradient norm at each of 10 steps within a relative 1e-5 in f32, the
// first step's gradients per tensor within 1e-5, the weights after ten steps
// within 1e-3 (Adam's near-zero elements, as tests/parallel/tensor_parallel
// explains). The differences are only the order of additions: the ring's
// blocks merged through the log-sum-exp, the loss and gradients summed over
// the cp ranks' tokens.
//
// Run with 2 ranks (CP2: GPT-2's learned positions, Llama's rotary ones with
// grouped-query attention, a sliding window with full recompute, ZeRO-1 over the cp ranks) and 4
// (CP4 with GQA, CP2 × DP2, CP2 × DP2 with FSDP, CP2 × TP2, CP2 × TP2 with
// sequence parallelism; CP2 × PP2 with the 1F1B and the interleaved
// schedules, each stage's attention ringing over its own cp group, and its
// checkpoints resumed on one process and the other way); and 8 (CP2 × PP2 ×
// DP2 interleaved, CP2 × TP2 × PP2). The all-to-all variant
// (parallel.cp_comm_type=a2a, "A2a" tests) the same: CP2 (GQA, GPT-2, Gemma
// 2's caps and windows), CP4, CP2 × DP2, CP2 × TP2 with and without SP; its
// differences from one process are only the loss's and gradients' sums over
// the ranks (the attention is one process's kernel on each rank's heads).
#include "cp_fixture.h"

namespace nk {
namespace {

using cp_test::ContextParallel;
using cp_test::kA2a;
using cp_test::pipelined;
using cp_test::Recipe;

TEST_F(ContextParallel, Gpt2Cp2LearnedPositions) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gpt-tiny", 2, 1, 4, 4});
}
TEST_F(ContextParallel, LlamaCp2GroupedQuery) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 2});
}
// A sliding window shorter than the row and crossing the chunks' edges
// (chunks of 8 tokens, window 12), and full recompute (the ring runs again
// in the backward).
TEST_F(ContextParallel, LlamaCp2SlidingWindowFullRecompute) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 1, {"model.sliding_window=12", "train.recompute=full"}});
}
TEST_F(ContextParallel, LlamaCp4GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 4, 1, 4, 2});
}
TEST_F(ContextParallel, LlamaCp2Dp2GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 1, 8, 2, 2});
}
// Gemma 2: a score scale of its own (query_pre_attn_scalar), capped scores
// (a cap of 1.5, far from linear), local layers' windows crossing the chunks.
TEST_F(ContextParallel, Gemma2Cp2CappedScoresAndWindows) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gemma2-tiny",
         2,
         1,
         4,
         2,
         1,
         {"model.attn_logit_softcap=1.5", "model.query_pre_attn_scalar=20",
          "model.sliding_window=12"}});
}
// The distributed optimizer and FSDP shard over the same "dp-cp" group the
// gradients are summed over: a CP2 run alone shards over its two cp ranks.
TEST_F(ContextParallel, LlamaCp2ZeroOneShardsOverTheCpRanks) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 1, {"parallel.shard=optimizer"}});
}
TEST_F(ContextParallel, LlamaCp2Dp2Fsdp) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 1, 8, 2, 1, {"parallel.shard=full"}});
}
TEST_F(ContextParallel, LlamaCp2Tp2GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4});
}
// Pipeline parallel: each stage's layers ring over that stage's cp group,
// the residual streams sent between stages are a cp rank's chunks, the loss
// is summed over the chunks and the gradients over dp-cp. GPT-2 (learned
// positions on the first stage, the tied token table's two copies on the
// first and last) under 1F1B; Llama with grouped-query attention (8 query
// heads on 2 key/value heads) under 1F1B and under the interleaved
// schedule (2 virtual stages per rank: the last rank's chunk output goes on
// to rank 0's next chunk).
TEST_F(ContextParallel, Gpt2Cp2Pp2) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("gpt-tiny", 1, 4, 4));
}
TEST_F(ContextParallel, LlamaCp2Pp2GroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("llama-tiny", 1, 8, 2));
}
TEST_F(ContextParallel, LlamaCp2Pp2InterleavedGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check(pipelined("llama-tiny", 2, 8, 2));
}
// 8 ranks: CP2 × PP2 × DP2 interleaved (dp-cp of 4 ranks per stage) and
// CP2 × TP2 × PP2 (each stage's ring over cp, its heads over tp).
TEST_F(ContextParallel, LlamaCp2Dp2Pp2Interleaved) {
  if (world_ != 8) GTEST_SKIP() << "8 ranks";
  check(pipelined("llama-tiny", 2, 8, 2));
}
TEST_F(ContextParallel, LlamaCp2Tp2Pp2GroupedQuery) {
  if (world_ != 8) GTEST_SKIP() << "8 ranks";
  Recipe r = pipelined("llama-tiny", 1, 8, 2);
  r.tp = 2;
  check(r);
}
// A checkpoint saved under CP2 × PP2 (interleaved) resumes on one process,
// and one process's under CP2 × PP2, on one process's losses.
TEST_F(ContextParallel, ReshardCp2Pp2InterleavedAndOneProcess) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  reshard(pipelined("llama-tiny", 2, 8, 2));
}

// Sequence parallelism: each rank's local tokens (its two chunks) split over
// its tp pair for the norms and residual stream.
TEST_F(ContextParallel, LlamaCp2Tp2SequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4, 1, {"parallel.sp=true"}});
}

// All-to-all (Ulysses): 4 query and 2 key/value heads give each cp rank 2
// and 1 (one GQA group).
TEST_F(ContextParallel, LlamaCp2A2aGroupedQuery) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"llama-tiny", 2, 1, 4, 2, 2, {kA2a}});
}
TEST_F(ContextParallel, Gpt2Cp2A2aLearnedPositions) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gpt-tiny", 2, 1, 4, 4, 1, {kA2a}});
}
TEST_F(ContextParallel, Gemma2Cp2A2aCappedScoresAndWindows) {
  if (world_ != 2) GTEST_SKIP() << "2 ranks";
  check({"gemma2-tiny",
         2,
         1,
         4,
         2,
         1,
         {kA2a, "model.attn_logit_softcap=1.5", "model.query_pre_attn_scalar=20",
          "model.sliding_window=12", "train.recompute=full"}});
}
TEST_F(ContextParallel, LlamaCp4A2aGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 4, 1, 8, 4, 1, {kA2a}});
}
TEST_F(ContextParallel, LlamaCp2Dp2A2aGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 1, 8, 2, 2, {kA2a}});
}
TEST_F(ContextParallel, LlamaCp2Tp2A2aGroupedQuery) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4, 1, {kA2a}});
}
TEST_F(ContextParallel, LlamaCp2Tp2A2aSequenceParallel) {
  if (world_ != 4) GTEST_SKIP() << "4 ranks";
  check({"llama-tiny", 2, 2, 8, 4, 1, {kA2a, "parallel.sp=true"}});
}

}  // namespace
}  // namespace nk
