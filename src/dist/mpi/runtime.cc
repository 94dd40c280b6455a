#include "dist/mpi/runtime.h"

#include <algorithm>
#include <exception>
#include <limits>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "dist/mpi/mpi_communicator.h"
#include "dist/mpi/state.h"

namespace nk::dist {

namespace {

// A rank keeps the memory it frees for its next allocation: no block is
// mmapped (each would be unmapped at its free) and the heap is never
// trimmed. MPI's non-blocking collectives allocate their scratch (as large
// as a bucket) at every call, and every page of fresh memory faults once:
// 20-22 us a page on the 2-core Zen 5 VM (an all-reduce of 4 MiB took
// 23 ms at its first two calls, 1 ms once glibc's heap held the memory; of
// 130 MB, above glibc's 32 MiB mmap ceiling, 0.5 s at every call). GPT-2
// 124M on dp 2 (bf16, micro-batch 4, 1 thread a rank, 2026-12-05): 5.7-5.8 s a
// step with 2.3-2.7 s outside the kernels, 3.2-3.7 s with 0.2-0.4 s. (The cost: the
// ranks' resident memory stays at its peak, as with a caching allocator.)
void keep_freed_memory() {
#ifdef __GLIBC__
  mallopt(M_MMAP_MAX, 0);
  mallopt(M_TRIM_THRESHOLD, std::numeric_limits<int>::max());
#endif
}

}  // namespace

MpiRuntime::MpiRuntime(int* argc, char*** argv) : state_(std::make_shared<mpi::State>()) {
  keep_freed_memory();
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) fail("MPI is initialised already: create one MpiRuntime per process");
  // Serialized: any thread may call MPI, one at a time (the main thread today).
  int provided = 0;
  if (MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
    fail("MPI_Init_thread failed");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &state_->rank);
  MPI_Comm_size(MPI_COMM_WORLD, &state_->size);
  if (provided < MPI_THREAD_SERIALIZED) {
    state_->failed = true;
    fail("rank {}: this MPI offers thread level {}, Nekton needs MPI_THREAD_SERIALIZED",
         state_->rank, provided);
  }
  mpi::check(*state_, MPI_Comm_dup(MPI_COMM_WORLD, &state_->control),
             [&] { return fmt::format("rank {}: duplicating the world", state_->rank); });
  state_->liveness = std::make_unique<mpi::Liveness>(state_->control, state_->rank);
}

MpiRuntime::~MpiRuntime() {
  if (state_->failed || std::uncaught_exceptions() > 0) {
    MPI_Abort(MPI_COMM_WORLD, 1);
    return;
  }
  // MPI_Finalize waits for every rank, without a timeout, and OpenMPI's
  // launcher mishandles a job where some ranks finalized and another aborts
  // later. So ranks leave together: a timed barrier first, aborting if a peer
  // never comes.
  try {
    world_barrier(state_->timeout_s);
  } catch (const std::exception& e) {
    state_->abort(std::string("at exit: ") + e.what(), 1);
  }
  state_->liveness.reset();
  MPI_Comm_free(&state_->control);
  MPI_Finalize();
}

// On the control communicator (collectives never match its probe messages),
// which was duplicated at MPI_Init, when all ranks were there.
void MpiRuntime::world_barrier(double timeout_s) {
  std::vector<int> everyone(state_->size);
  for (int r = 0; r < state_->size; ++r) everyone[r] = r;
  mpi::MpiCommunicator("world", everyone, state_->rank, timeout_s, state_->control, state_, false)
      .barrier();
}

int MpiRuntime::rank() const {
  return state_->rank;
}

int MpiRuntime::world_size() const {
  return state_->size;
}

void MpiRuntime::mark_failed() {
  state_->failed = true;
}

bool MpiRuntime::failed() const {
  return state_->failed;
}

void MpiRuntime::abort(const std::string& msg, int code) {
  state_->abort(msg, code);
}

ProcessGroups MpiRuntime::make_groups(const Mesh& mesh, double timeout_s) {
  auto& s = *state_;
  if (mesh.world_size() != s.size || mesh.rank() != s.rank)
    fail("rank {}: the mesh is for rank {} of {} processes, MPI runs {}", s.rank, mesh.rank(),
         mesh.world_size(), s.size);
  // Everyone must be here before the blocking MPI_Comm_split calls below.
  s.timeout_s = timeout_s;
  world_barrier(timeout_s);
  ProcessGroups groups;
  for (auto& g : mesh.groups()) {
    int color = MPI_UNDEFINED;
    for (size_t i = 0; i < g.all.size(); ++i)
      if (std::find(g.all[i].begin(), g.all[i].end(), s.rank) != g.all[i].end()) color = int(i);
    MPI_Comm c = MPI_COMM_NULL;
    mpi::check(s, MPI_Comm_split(MPI_COMM_WORLD, color, std::max(g.rank, 0), &c),
               [&] { return fmt::format("rank {}: making group '{}'", s.rank, g.name); });
    if (c == MPI_COMM_NULL) continue;
    MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN);
    groups.add(
        std::make_unique<mpi::MpiCommunicator>(g.name, g.ranks, g.rank, timeout_s, c, state_));
  }
  return groups;
}

}  // namespace nk::dist
