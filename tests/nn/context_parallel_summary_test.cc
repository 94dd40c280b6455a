// The step log's account of each context-parallel variant
// (nn::cp_comm_summary, the trainer's "context parallel: ..." line): what
// each rank holds and exchanges, and its buffers.
#include <gtest/gtest.h>

#include "nn/context_parallel.h"

namespace nk::nn {
namespace {

TEST(CpCommSummary, NamesEachVariantWithItsHeadsAndBuffers) {
  const int64_t MiB = 1048576;
  EXPECT_EQ(cp_comm_summary(CpComm::P2P, 2, 1, 4, 64, 3 * MiB / 2),
            "ring attention over the cp group (1.5 MiB of ring buffers shared by the layers)");
  EXPECT_EQ(cp_comm_summary(CpComm::A2A, 2, 1, 4, 64, MiB),
            "all-to-all attention (parallel.cp_comm_type=a2a: 2 of the 4 query heads on the whole "
            "row per rank) over the cp group (1.0 MiB of all-to-all buffers shared by the layers)");
  EXPECT_EQ(cp_comm_summary(CpComm::AllGather, 4, 1, 4, 128, MiB / 10),
            "all-gather attention (parallel.cp_comm_type=all_gather: the whole row's 128 keys and "
            "values on every rank) over the cp group (0.1 MiB of all-gather buffers shared by the "
            "layers)");
  // a2a+p2p 2 x 4 over cp 8: heads over pairs, a ring of 4 pairs.
  EXPECT_EQ(cp_comm_summary(CpComm::A2AP2P, 8, 2, 4, 256, 2 * MiB),
            "hierarchical attention (parallel.cp_comm_type=a2a+p2p: all-to-all within groups of 2 "
            "ranks, 2 of the 4 query heads per rank, ring attention across 4 groups) over the cp "
            "group (2.0 MiB of all-to-all and ring buffers shared by the layers)");
}

}  // namespace
}  // namespace nk::nn
