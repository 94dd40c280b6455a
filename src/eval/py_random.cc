#include "eval/py_random.h"

#include <cmath>
#include <unordered_set>

#include "core/error.h"

namespace nk {

void PyRandom::init_genrand(uint32_t s) {
  mt_[0] = s;
  for (int i = 1; i < N; ++i)
    mt_[size_t(i)] = 1812433253u * (mt_[size_t(i - 1)] ^ (mt_[size_t(i - 1)] >> 30)) + uint32_t(i);
  mti_ = N;
}

PyRandom::PyRandom(uint64_t seed) {
  // CPython seeds an int with its absolute value's 32-bit words, low first
  // (zero is one word).
  std::vector<uint32_t> key;
  do {
    key.push_back(uint32_t(seed & 0xffffffffu));
    seed >>= 32;
  } while (seed);
  init_genrand(19650218u);
  int i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(N, key.size()); k; --k) {
    mt_[size_t(i)] =
        (mt_[size_t(i)] ^ ((mt_[size_t(i - 1)] ^ (mt_[size_t(i - 1)] >> 30)) * 1664525u)) + key[j] +
        uint32_t(j);
    ++i, ++j;
    if (i >= N) mt_[0] = mt_[N - 1], i = 1;
    if (j >= key.size()) j = 0;
  }
  for (int k = N - 1; k; --k) {
    mt_[size_t(i)] =
        (mt_[size_t(i)] ^ ((mt_[size_t(i - 1)] ^ (mt_[size_t(i - 1)] >> 30)) * 1566083941u)) -
        uint32_t(i);
    if (++i >= N) mt_[0] = mt_[N - 1], i = 1;
  }
  mt_[0] = 0x80000000u;
  mti_ = N;
}

uint32_t PyRandom::genrand_uint32() {
  constexpr int M = 397;
  constexpr uint32_t kUpper = 0x80000000u, kLower = 0x7fffffffu, kMatrix = 0x9908b0dfu;
  if (mti_ >= N) {
    for (int k = 0; k < N; ++k) {
      const uint32_t y = (mt_[size_t(k)] & kUpper) | (mt_[size_t((k + 1) % N)] & kLower);
      mt_[size_t(k)] = mt_[size_t((k + M) % N)] ^ (y >> 1) ^ ((y & 1u) ? kMatrix : 0u);
    }
    mti_ = 0;
  }
  uint32_t y = mt_[size_t(mti_++)];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint32_t PyRandom::getrandbits(int k) {
  return genrand_uint32() >> (32 - k);
}

uint64_t PyRandom::randbelow(uint64_t n) {
  int k = 0;
  while (k < 64 && (n >> k)) ++k;
  NK_CHECK(k <= 32, "randbelow: {} is past 32 bits", n);
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

double PyRandom::random() {
  const uint32_t a = genrand_uint32() >> 5, b = genrand_uint32() >> 6;
  return (double(a) * 67108864.0 + double(b)) * (1.0 / 9007199254740992.0);
}

std::vector<int64_t> PyRandom::sample(int64_t n, int64_t k) {
  if (k < 0 || k > n) fail("sample: {} draws from a population of {}", k, n);
  std::vector<int64_t> out(static_cast<size_t>(k));
  // CPython's rule: a pool when the population is small next to a set's table.
  int64_t setsize = 21;
  if (k > 5) setsize += int64_t(std::pow(4.0, std::ceil(std::log(double(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<int64_t> pool(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) pool[size_t(i)] = i;
    for (int64_t i = 0; i < k; ++i) {
      const int64_t j = int64_t(randbelow(uint64_t(n - i)));
      out[size_t(i)] = pool[size_t(j)];
      pool[size_t(j)] = pool[size_t(n - i - 1)];
    }
    return out;
  }
  std::unordered_set<int64_t> selected;
  for (int64_t i = 0; i < k; ++i) {
    int64_t j = int64_t(randbelow(uint64_t(n)));
    while (selected.count(j)) j = int64_t(randbelow(uint64_t(n)));
    selected.insert(j);
    out[size_t(i)] = j;
  }
  return out;
}

}  // namespace nk
