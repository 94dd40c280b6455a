// The processes of one `nekton curate` run. Under mpirun or srun each rank
// curates its own block of shards, and the global stages (dedup) exchange
// their per-document records between ranks; started alone, one rank does
// everything and no collective runs. The collectives move bytes over the
// world's dist::Communicator, each with the communicator's timeout, so a
// rank that died or hangs is an error naming it, never a wait forever.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace nk::dist {
class Communicator;
}

namespace nk::curate {

class Ranks {
 public:
  Ranks() = default;  // one process
  explicit Ranks(dist::Communicator* world) : comm_(world) {}

  int rank() const;
  int size() const;
  bool alone() const { return size() == 1; }

  void barrier() const;
  // send[j] goes to rank j; returns what each rank sent to this one, by rank.
  std::vector<std::string> exchange(const std::vector<std::string>& send) const;
  // Every rank's `mine`, by rank.
  std::vector<std::string> all_gather(const std::string& mine) const;
  int64_t sum(int64_t x) const;
  // The items [first, last) of n this rank owns: contiguous blocks in rank
  // order, sizes differing by at most one.
  std::pair<size_t, size_t> block(size_t n) const;

 private:
  dist::Communicator* comm_ = nullptr;
};

}  // namespace nk::curate
