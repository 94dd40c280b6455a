// Python's `random.Random` as CPython implements it (MT19937 seeded through
// init_by_array with the seed's 32-bit words), for the draws the evaluation
// harness makes: lm-evaluation-harness picks few-shot examples with
// random.Random(1234).sample(docs, n), one generator per task whose state
// runs on from document to document. The same seed gives the same indices
// as Python does.
#pragma once
#include <array>
#include <cstdint>
#include <vector>

namespace nk {

class PyRandom {
 public:
  explicit PyRandom(uint64_t seed);
  uint32_t genrand_uint32();
  // getrandbits(k), 0 < k <= 32.
  uint32_t getrandbits(int k);
  // _randbelow(n), n >= 1: getrandbits(n.bit_length()) redrawn while >= n.
  uint64_t randbelow(uint64_t n);
  double random();  // in [0, 1), 53 bits
  // The indices random.sample(range(n), k) returns, in order (CPython's
  // pool or set method by its size rule). nk::Error if k > n.
  std::vector<int64_t> sample(int64_t n, int64_t k);

 private:
  static constexpr int N = 624;
  std::array<uint32_t, N> mt_{};
  int mti_ = N + 1;
  void init_genrand(uint32_t s);
};

}  // namespace nk
