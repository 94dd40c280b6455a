// Liveness: how a rank whose wait timed out finds out which peers are missing.
//
// MPI cannot say who has not joined a collective, and a rank may be dead (its
// socket or shared memory simply goes quiet) or hung (alive, never calling in).
// So every wait loop in this backend also answers *probes*: small messages on a
// private duplicate of MPI_COMM_WORLD (`control`), tagged apart from any data.
// A rank whose wait passes its deadline sends a probe to each peer of the
// operation and, for a grace period, collects the answers while answering
// probes itself. An answer says where the peer is waiting right now (group,
// operation, sequence number). A peer that does not answer is dead, hung, or
// busy outside any collective; one that answers from another operation is
// stuck elsewhere. Either way it is missing here.
//
// Cost while nothing fails: one MPI_Iprobe per poll of a wait loop; no messages.
// Probes are answered only from wait loops, so a rank computing for longer
// than the grace period while its peers time out is reported as missing,
// which is what it is from their side.
#pragma once
#include <mpi.h>

#include <cstdint>
#include <list>
#include <string>
#include <vector>

namespace nk::dist::mpi {

// Where a peer said it was waiting, or answered = false.
struct PeerState {
  int world_rank = -1;
  bool answered = false;
  std::string group, op;
  uint64_t seq = 0;
};

class Liveness {
 public:
  Liveness(MPI_Comm control, int world_rank) : control_(control), world_rank_(world_rank) {}
  ~Liveness();

  // What this rank is waiting in, for answers; cleared by leave().
  void enter(const std::string& group, const char* op, uint64_t seq);
  void leave() { waiting_ = false; }
  // Answers the probes that have arrived. Called from every poll of a wait loop.
  void serve();
  // Probes `peers` (world ranks) and waits `grace_s` seconds at most for all
  // of them to answer, serving probes meanwhile.
  std::vector<PeerState> probe(const std::vector<int>& peers, double grace_s);

 private:
  struct Outgoing;  // a message in flight with the buffer it is sent from
  void purge();

  MPI_Comm control_;
  int world_rank_;
  bool waiting_ = false;
  std::string group_;
  const char* op_ = "";
  uint64_t seq_ = 0;
  uint32_t next_probe_ = 1;
  std::list<Outgoing*> outgoing_;
};

}  // namespace nk::dist::mpi
