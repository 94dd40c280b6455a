// A lock-free union-find over document indices, shared by many threads.
//
// Invariant: parent[x] <= x for every x. unite() links the larger root under
// the smaller one and find() only ever moves a node closer to its root, so
// the root of every set is its smallest member whatever order the unions ran
// in: the structure after any interleaving of the same unions is the same
// partition with the same roots. Indices are 32-bit (4 bytes per document).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>

namespace nk::curate {

class ParallelUnionFind {
 public:
  // Singletons 0 .. n-1; nk::Error when n does not fit 32 bits.
  explicit ParallelUnionFind(uint64_t n);

  uint64_t size() const { return n_; }

  // The root (smallest member) of x's set. Path halving: each visited node is
  // re-pointed at its grandparent with one CAS; a lost race is harmless.
  uint32_t find(uint32_t x) {
    for (;;) {
      uint32_t p = parent_[x].load(std::memory_order_acquire);
      if (p == x) return x;
      uint32_t gp = parent_[p].load(std::memory_order_acquire);
      if (gp != p) parent_[x].compare_exchange_weak(p, gp, std::memory_order_acq_rel);
      x = gp;
    }
  }

  // Merges the sets of a and b; true when they were apart. Safe to call from
  // many threads at once.
  bool unite(uint32_t a, uint32_t b) {
    for (;;) {
      a = find(a);
      b = find(b);
      if (a == b) return false;
      uint32_t hi = a > b ? a : b, lo = a > b ? b : a;
      uint32_t expected = hi;
      // Only a root may be linked: the CAS fails when another thread linked
      // `hi` first, and the loop starts over from the new roots.
      if (parent_[hi].compare_exchange_strong(expected, lo, std::memory_order_acq_rel)) return true;
    }
  }

 private:
  uint64_t n_ = 0;
  std::unique_ptr<std::atomic<uint32_t>[]> parent_;
};

}  // namespace nk::curate
