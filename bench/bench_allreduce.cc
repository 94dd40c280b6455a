// All-reduce through dist's MPI Communicator (non-blocking post + the timed
// polling wait, liveness probes served) against plain blocking MPI_Allreduce on
// the same ranks and buffer, f32 sum in place. Run under mpirun:
//
//   mpirun -np 2 bench_allreduce [--reps 5]
//
// Each figure is the best of `reps` rounds of a size-dependent iteration
// count, the two variants alternating; rank 0 prints µs per call, the ratio
// (ours / MPI) and the bus bandwidth 2·(p-1)/p·bytes / time.
#include <fmt/format.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>
#include <string>

#include "dist/mpi/runtime.h"

namespace {

double seconds_per_call(int iters, const std::function<void()>& f) {
  MPI_Barrier(MPI_COMM_WORLD);
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) f();
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / iters;
  // Every rank reports the slowest rank's time.
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  nk::dist::MpiRuntime runtime(&argc, &argv);
  int reps = 5;
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], "--reps") == 0) reps = std::atoi(argv[i + 1]);
  nk::dist::Mesh mesh(runtime.world_size(), runtime.rank(), nk::dist::MeshSpec{});
  auto groups = runtime.make_groups(mesh, 300);
  auto& world = groups.get("world");
  int p = world.size();
  if (runtime.rank() == 0)
    fmt::print("ranks {}   {:>10} {:>12} {:>12} {:>7} {:>10}\n", p, "bytes", "ours µs", "MPI µs",
               "ratio", "bus GB/s");
  for (int64_t bytes : {int64_t(4) << 10, int64_t(64) << 10, int64_t(1) << 20, int64_t(16) << 20,
                        int64_t(64) << 20}) {
    int64_t n = bytes / 4;
    nk::Tensor x = nk::Tensor::zeros({n}, nk::DType::F32);
    int iters = int(std::clamp<int64_t>((int64_t(256) << 20) / bytes, 3, 2000));
    auto ours = [&] { world.all_reduce(x); };
    auto plain = [&] {
      MPI_Allreduce(MPI_IN_PLACE, x.raw(), int(n), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    };
    ours();
    plain();
    double best_ours = 1e30, best_plain = 1e30;
    for (int r = 0; r < reps; ++r) {
      best_ours = std::min(best_ours, seconds_per_call(iters, ours));
      best_plain = std::min(best_plain, seconds_per_call(iters, plain));
    }
    if (runtime.rank() == 0)
      fmt::print("          {:>10} {:>12.1f} {:>12.1f} {:>7.2f} {:>10.2f}\n", bytes,
                 best_ours * 1e6, best_plain * 1e6, best_ours / best_plain,
                 2.0 * (p - 1) / p * double(bytes) / best_ours / 1e9);
  }
  return 0;
}
