#include "dist/mpi/mpi_work.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "dist/mpi/mpi_communicator.h"

namespace nk::dist::mpi {

namespace {

using Clock = std::chrono::steady_clock;

// Polls back to back (yielding the core) for the first second of a wait: MPI's
// non-blocking collectives advance only inside MPI calls, so any sleep here
// stretches every round of their algorithm. A wait that lasts longer is
// waiting for a straggler: poll every 20 µs, growing to 1 ms, to leave the
// cores to the ranks still computing.
void pause(double waited_s, int& sleeps) {
  if (waited_s < 1.0) {
    std::this_thread::yield();
    return;
  }
  int us = std::min(1000, 20 << std::min(sleeps++ / 100, 6));
  std::this_thread::sleep_for(std::chrono::microseconds(us));
}

}  // namespace

MpiWork::MpiWork(MpiCommunicator& comm, const char* op, uint64_t seq, std::vector<int> peers)
    : comm_(comm), op_(op), seq_(seq), peers_(std::move(peers)) {}

MpiWork::~MpiWork() {
  // After a failure the requests are abandoned: the job is ending and MPI
  // forbids freeing a pending collective's request.
  if (done_ || requests.empty() || comm_.state().failed) return;
  try {
    wait();
  } catch (const std::exception& e) {
    comm_.state().abort(e.what(), 1);
  }
}

std::string MpiWork::where() const {
  return comm_.where_of(op_, seq_);
}

bool MpiWork::poll() {
  int flag = 0;
  statuses.resize(requests.size());
  int rc = MPI_Testall(int(requests.size()), requests.data(), &flag, statuses.data());
  if (rc == MPI_ERR_IN_STATUS)
    for (auto& s : statuses)
      if (s.MPI_ERROR != MPI_SUCCESS && s.MPI_ERROR != MPI_ERR_PENDING) rc = s.MPI_ERROR;
  check(comm_.state(), rc, [&] { return where(); });
  if (!flag) return false;
  done_ = true;
  if (finish) finish(*this);
  return true;
}

bool MpiWork::test() {
  if (done_) return true;
  comm_.state().liveness->serve();
  return poll();
}

void MpiWork::wait() {
  if (done_) return;
  auto& live = *comm_.state().liveness;
  auto start = Clock::now();
  auto deadline = start + std::chrono::duration<double>(comm_.timeout());
  live.enter(comm_.name(), op_, seq_);
  // Probes are served every millisecond at most: a prober waits 0.2 s or more.
  auto served = start;
  for (int sleeps = 0;;) {
    if (poll()) break;
    auto now = Clock::now();
    if (now - served >= std::chrono::milliseconds(1)) {
      live.serve();
      served = now;
    }
    if (now >= deadline) timed_out();
    pause(std::chrono::duration<double>(now - start).count(), sleeps);
  }
  live.leave();
}

void MpiWork::timed_out() {
  auto& state = comm_.state();
  std::vector<int> group_peers = peers_;
  if (group_peers.empty())
    for (int r = 0; r < comm_.size(); ++r)
      if (r != comm_.rank()) group_peers.push_back(r);
  std::vector<int> world_peers;
  for (int r : group_peers) world_peers.push_back(comm_.world_ranks()[r]);
  double grace = std::clamp(comm_.timeout() * 0.25, 0.2, 2.0);
  auto states = state.liveness->probe(world_peers, grace);

  bool collective = peers_.empty();
  std::vector<std::string> missing;
  int arrived = 0;
  for (size_t i = 0; i < states.size(); ++i) {
    auto& s = states[i];
    std::string who = fmt::format("rank {} (world {})", group_peers[i], s.world_rank);
    if (!s.answered) {
      missing.push_back(who + ": no answer (dead, hung, or busy outside any collective)");
    } else if (collective && s.group == comm_.name() && s.op == op_ && s.seq == seq_) {
      ++arrived;
    } else {
      missing.push_back(fmt::format("{}: waits in group '{}' {} #{}", who, s.group, s.op, s.seq));
    }
  }
  std::string msg = fmt::format("{} timed out after {:.1f} s: ", where(), comm_.timeout());
  if (missing.empty())
    msg += "every peer has arrived, yet it did not complete (stalled transport?)";
  else
    msg += fmt::format("missing {}", fmt::join(missing, "; "));
  if (collective) msg += fmt::format(" ({} of {} peers arrived)", arrived, states.size());
  state.failed = true;
  throw TimeoutError(msg);
}

}  // namespace nk::dist::mpi
