// main of test_parallel_mpi: MPI around GoogleTest, as test_dist_mpi's. Rank 0
// prints the report (and the trainers' logs); other ranks only their failures.
#include "core/log.h"
#include "mpi_rank_report.h"
#include "parallel_env.h"

namespace nk::test {

namespace {
dist::MpiRuntime* g_runtime = nullptr;
}  // namespace

dist::MpiRuntime& mpi() {
  return *g_runtime;
}

}  // namespace nk::test

int main(int argc, char** argv) {
  nk::dist::MpiRuntime runtime(&argc, &argv);
  nk::test::g_runtime = &runtime;
  ::testing::InitGoogleTest(&argc, argv);
  if (runtime.rank() != 0) nk::set_log_level(nk::LogLevel::Warn);
  nk::test::report_failures_only_off_rank0(runtime.rank());
  return RUN_ALL_TESTS();
}
