// main of test_dist_mpi: MPI around GoogleTest. Rank 0 prints the usual report;
// other ranks print only their failures, prefixed with the rank. mpirun's exit
// status is non-zero when any rank fails.
#include <fmt/format.h>

#include "mpi_env.h"
#include "mpi_rank_report.h"

namespace nk::test {

namespace {
dist::MpiRuntime* g_runtime = nullptr;
std::map<std::string, std::unique_ptr<Layout>> g_layouts;
}  // namespace

dist::MpiRuntime& mpi() {
  return *g_runtime;
}

Layout& layout(const dist::MeshSpec& spec) {
  std::string key =
      fmt::format("{}/{}/{}/{}/{}/{}", spec.tp, spec.cp, spec.ep, spec.pp, spec.etp, spec.order);
  auto& slot = g_layouts[key];
  if (!slot) {
    dist::Mesh mesh(mpi().world_size(), mpi().rank(), spec);
    auto groups = mpi().make_groups(mesh, kTestTimeout);
    slot.reset(new Layout{std::move(mesh), std::move(groups)});
  }
  return *slot;
}

}  // namespace nk::test

int main(int argc, char** argv) {
  nk::dist::MpiRuntime runtime(&argc, &argv);
  nk::test::g_runtime = &runtime;
  ::testing::InitGoogleTest(&argc, argv);
  nk::test::report_failures_only_off_rank0(runtime.rank());
  int rc = RUN_ALL_TESTS();
  nk::test::g_layouts.clear();  // communicators go before MPI_Finalize
  return rc;
}
