// main of test_parallel_mpi: MPI around GoogleTest, as test_dist_mpi's. Rank 0
// prints the usual report (and the trainers' logs); other ranks print only
// their failures, prefixed with the rank.
#include <fmt/format.h>

#include "core/log.h"
#include "parallel_env.h"

namespace nk::test {

namespace {
dist::MpiRuntime* g_runtime = nullptr;

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
}  // namespace

dist::MpiRuntime& mpi() {
  return *g_runtime;
}

}  // namespace nk::test

int main(int argc, char** argv) {
  nk::dist::MpiRuntime runtime(&argc, &argv);
  nk::test::g_runtime = &runtime;
  ::testing::InitGoogleTest(&argc, argv);
  if (runtime.rank() != 0) {
    nk::set_log_level(nk::LogLevel::Warn);
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new nk::test::RankFailurePrinter(runtime.rank()));
  }
  return RUN_ALL_TESTS();
}
