#include "dist/mpi/mpi_work.h"

#include "dist/mpi/mpi_communicator.h"
#include "dist/mpi/timed_wait.h"

namespace nk::dist::mpi {

MpiWork::MpiWork(MpiCommunicator& comm, const char* op, uint64_t seq, std::vector<int> peers)
    : comm_(comm), op_(op), seq_(seq), peers_(std::move(peers)) {}

MpiWork::~MpiWork() {
  // After a failure the requests are abandoned: the job is ending and MPI
  // forbids freeing a pending collective's request.
  if (!done_ && !requests.empty() && !comm_.state().failed) {
    try {
      wait();
    } catch (const std::exception& e) {
      comm_.state().abort(e.what(), 1);
    }
  }
  // A completed operation's staging serves the next one (an abandoned
  // one's may still be written by MPI: it is not reused).
  if (done_) comm_.give_back_staging(std::move(staging));
}

std::string MpiWork::where() const {
  return comm_.where(op_, seq_);
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
  timed_wait(comm_, comm_.state(), op_, seq_, peers_, [this] { return poll(); });
}

}  // namespace nk::dist::mpi
