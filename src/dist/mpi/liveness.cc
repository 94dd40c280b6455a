#include "dist/mpi/liveness.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

namespace nk::dist::mpi {

// The wire messages (named outside the anonymous namespace: Outgoing holds them).
struct ProbeMsg {
  uint32_t id;
};

struct AnswerMsg {
  uint32_t probe_id;
  uint32_t waiting;
  uint64_t seq;
  char group[48];
  char op[24];
};

namespace {

constexpr int kProbeTag = 1, kAnswerTag = 2;

void copy_name(char* dst, size_t cap, const std::string& src) {
  size_t n = std::min(cap - 1, src.size());
  std::memcpy(dst, src.data(), n);
  dst[n] = 0;
}

}  // namespace

struct Liveness::Outgoing {
  MPI_Request request = MPI_REQUEST_NULL;
  union {
    ProbeMsg probe;
    AnswerMsg answer;
  };
};

Liveness::~Liveness() {
  // Messages still in flight go to peers that stopped answering; we are
  // failing or finishing, so their requests are dropped with their buffers.
  for (auto* o : outgoing_) delete o;
}

void Liveness::enter(const std::string& group, const char* op, uint64_t seq) {
  waiting_ = true;
  group_ = group;
  op_ = op;
  seq_ = seq;
}

void Liveness::purge() {
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    int done = 0;
    MPI_Test(&(*it)->request, &done, MPI_STATUS_IGNORE);
    if (done) {
      delete *it;
      it = outgoing_.erase(it);
    } else {
      ++it;
    }
  }
}

void Liveness::serve() {
  while (true) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kProbeTag, control_, &flag, &st) != MPI_SUCCESS || !flag) break;
    ProbeMsg in{};
    if (MPI_Recv(&in, sizeof in, MPI_BYTE, st.MPI_SOURCE, kProbeTag, control_, MPI_STATUS_IGNORE) !=
        MPI_SUCCESS)
      break;
    auto* o = new Outgoing;
    std::memset(&o->answer, 0, sizeof o->answer);
    o->answer.probe_id = in.id;
    o->answer.waiting = waiting_;
    o->answer.seq = seq_;
    copy_name(o->answer.group, sizeof o->answer.group, group_);
    copy_name(o->answer.op, sizeof o->answer.op, op_);
    MPI_Isend(&o->answer, sizeof o->answer, MPI_BYTE, st.MPI_SOURCE, kAnswerTag, control_,
              &o->request);
    outgoing_.push_back(o);
  }
  purge();
}

std::vector<PeerState> Liveness::probe(const std::vector<int>& peers, double grace_s) {
  uint32_t id = next_probe_++;
  std::vector<PeerState> states(peers.size());
  for (size_t i = 0; i < peers.size(); ++i) {
    states[i].world_rank = peers[i];
    auto* o = new Outgoing;
    o->probe.id = id;
    // A send to a dead peer may fail at once or never complete; either way
    // that peer will not answer, which is what we report.
    if (MPI_Isend(&o->probe, sizeof o->probe, MPI_BYTE, peers[i], kProbeTag, control_,
                  &o->request) != MPI_SUCCESS)
      o->request = MPI_REQUEST_NULL;
    outgoing_.push_back(o);
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  size_t answered = 0;
  while (answered < peers.size() && std::chrono::steady_clock::now() < deadline) {
    serve();
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kAnswerTag, control_, &flag, &st) == MPI_SUCCESS && flag) {
      AnswerMsg a{};
      if (MPI_Recv(&a, sizeof a, MPI_BYTE, st.MPI_SOURCE, kAnswerTag, control_,
                   MPI_STATUS_IGNORE) != MPI_SUCCESS)
        continue;
      auto at = std::find(peers.begin(), peers.end(), st.MPI_SOURCE);
      if (a.probe_id != id || at == peers.end()) continue;  // an answer to an older probe
      auto& s = states[at - peers.begin()];
      if (s.answered) continue;
      s.answered = a.waiting != 0;
      s.group = std::string(a.group, strnlen(a.group, sizeof a.group));
      s.op = std::string(a.op, strnlen(a.op, sizeof a.op));
      s.seq = a.seq;
      ++answered;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return states;
}

}  // namespace nk::dist::mpi
