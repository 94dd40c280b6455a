// Counter-based RNG (splitmix64 stream): the same seed gives the same numbers on
// every machine, and a stream can be forked by a name-derived offset.
#pragma once
#include <cmath>
#include <cstdint>

namespace nk {

class Rng {
 public:
  explicit Rng(uint64_t seed = 0) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next_u64() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return double(next_u64() >> 11) * (1.0 / 9007199254740992.0); }  // [0, 1)
  double normal() {                                                                   // Box-Muller
    double u1 = uniform(), u2 = uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  uint64_t below(uint64_t n) { return next_u64() % n; }
  uint64_t state() const { return state_; }
  void set_state(uint64_t s) { state_ = s; }

 private:
  uint64_t state_;
};

}  // namespace nk
