// For GoogleTest run inside every rank of an MPI job (test_dist_mpi,
// test_parallel_mpi): rank 0 prints the usual report; the other ranks print
// only their failures, each prefixed with the rank, so the log stays readable.
#pragma once
#include <fmt/format.h>
#include <gtest/gtest.h>

namespace nk::test {

class RankFailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit RankFailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed())
      fmt::print(stderr, "rank {}: {}:{}: {}\n", rank_, r.file_name() ? r.file_name() : "?",
                 r.line_number(), r.summary());
  }

 private:
  int rank_;
};

// Call after InitGoogleTest: replaces the default printer on ranks other than 0.
inline void report_failures_only_off_rank0(int rank) {
  if (rank == 0) return;
  auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
  delete listeners.Release(listeners.default_result_printer());
  listeners.Append(new RankFailurePrinter(rank));
}

}  // namespace nk::test
