// dist_fault: a job where one rank fails, for the timeout tests
// (timeout_driver.cc starts it under mpirun).
//   dist_fault MODE VICTIM GROUP TP TIMEOUT_S [ring]
// Every rank makes a mesh with parallel.tp = TP, runs one all_reduce on GROUP
// (so setup is behind everyone), then the VICTIM (a world rank) fails before
// the second one: MODE hang sleeps, kill raises SIGKILL, none does nothing.
// With `ring` the second operation is a ring of send/recv in GROUP instead.
// The others must stop within the timeout with a message naming the group,
// the operation and the missing rank; any error ends the job through
// MpiRuntime::abort.
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <string>

#include "dist/mpi/runtime.h"

int main(int argc, char** argv) {
  nk::dist::MpiRuntime runtime(&argc, &argv);
  if (argc != 6 && argc != 7)
    runtime.abort("usage: dist_fault hang|kill|none VICTIM GROUP TP TIMEOUT_S [ring]", 2);
  bool ring = argc == 7 && std::string(argv[6]) == "ring";
  std::string mode = argv[1], group = argv[3];
  int victim = std::stoi(argv[2]);
  try {
    nk::dist::MeshSpec spec;
    spec.tp = std::stoi(argv[4]);
    nk::dist::Mesh mesh(runtime.world_size(), runtime.rank(), spec);
    // Set-up gets a generous timeout (ranks of a loaded machine start
    // seconds apart); the operations under test get TIMEOUT_S.
    auto groups = runtime.make_groups(mesh, 60);
    groups.set_timeout(std::stod(argv[5]));
    auto& comm = groups.get(group);
    nk::Tensor x = nk::Tensor::zeros({1024}, nk::DType::F32);
    comm.all_reduce(x);
    if (runtime.rank() == victim && mode == "hang") ::sleep(120);
    if (runtime.rank() == victim && mode == "kill") std::raise(SIGKILL);
    if (ring) {
      int p = comm.size(), r = comm.rank();
      nk::Tensor got = nk::Tensor::zeros({1024}, nk::DType::F32);
      auto rx = comm.recv_async(got, (r + p - 1) % p);
      comm.send(x, (r + 1) % p);
      rx->wait();
    } else {
      comm.all_reduce(x);
    }
    std::printf("rank %d: done\n", runtime.rank());
  } catch (const std::exception& e) {
    runtime.abort(e.what(), 3);
  }
  return 0;
}
