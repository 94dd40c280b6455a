#include "apps/tensor_parallel_ranks.h"

#include "apps/mpirun_launch.h"
#include "apps/run_ranks.h"
#include "core/error.h"
#include "core/parallel.h"
#include "dist/mpi/launch_env.h"

namespace nk {

namespace {

dist::Mesh join(dist::MpiRuntime& mpi, const std::string& key, int64_t tp) {
  if (mpi.world_size() != tp)
    fail("{} = {}: {} processes were launched (one tensor-parallel group: as many as {})", key, tp,
         mpi.world_size(), key);
  quiet_unless_rank0(mpi.rank());
  if (const int threads = threads_per_local_rank()) set_num_threads(threads);
  dist::MeshSpec spec;
  spec.tp = int(tp);
  return dist::Mesh(mpi.world_size(), mpi.rank(), spec);
}

}  // namespace

bool launch_tensor_parallel(const std::string& command, const std::string& key, int64_t tp,
                            int nproc, const std::vector<std::string>& args) {
  if (tp < 1) fail("{}: must be >= 1, got {}", key, tp);
  if (dist::launched_by_mpi()) return true;
  if (nproc > 0) {
    if (nproc != tp)
      fail(
          "--nproc {}: nekton {} runs one tensor-parallel group of {} ranks (got {} = {}); set "
          "{}={}",
          nproc, command, key, key, tp, key, nproc);
    std::vector<std::string> all = {command};
    all.insert(all.end(), args.begin(), args.end());
    exec_mpirun(nproc, all);
  }
  if (tp > 1)
    fail("{} = {}: launch {} processes (nekton {} --nproc {} ..., or mpirun -np {} nekton {} ...)",
         key, tp, tp, command, tp, tp, command);
  return false;
}

TensorParallelRanks::TensorParallelRanks(dist::MpiRuntime& mpi, const std::string& key, int64_t tp,
                                         double timeout_s)
    : mesh(join(mpi, key, tp)), groups(mpi.make_groups(mesh, timeout_s)) {}

}  // namespace nk
