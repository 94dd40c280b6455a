// The order a dataset of n items is read in: sample i is item at(i) of
// epoch i / n, the epoch's items shuffled by Fisher-Yates from the stream
// (seed, epoch), or in file order. Sample i depends only on i, so a run that
// resumes at sample k reads what an uninterrupted one would. Thread-safe
// (a loader's workers share it); the current epoch's order is kept.
#pragma once
#include <cstdint>
#include <mutex>
#include <vector>

namespace nk {

class EpochOrder {
 public:
  EpochOrder(int64_t n, uint64_t seed, bool shuffle) : n_(n), seed_(seed), shuffle_(shuffle) {}
  int64_t at(int64_t i) const;
  int64_t size() const { return n_; }

 private:
  int64_t n_;
  uint64_t seed_;
  bool shuffle_;
  mutable std::mutex mu_;
  mutable int64_t epoch_ = -1;  // the epoch order_ holds
  mutable std::vector<int64_t> order_;
};

}  // namespace nk
