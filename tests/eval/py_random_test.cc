// PyRandom against CPython's random module itself: the same seed gives the
// same words, floats, randbelow draws and sample() indices (both of
// CPython's methods: the pool for small populations, the set for large
// ones), with one generator's state running on across calls as the
// harness's few-shot sampler's does.
#include "eval/py_random.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_util.h"

namespace nk {
namespace {

nlohmann::json python(const std::string& code) {
  test::TempDir d("nk_pyrandom");
  test::write_file(d / "r.py", code);
  auto r = test::run_command("/usr/bin/python3 " + (d / "r.py"), false);
  EXPECT_EQ(r.code, 0) << r.out;
  return nlohmann::json::parse(r.out);
}

TEST(PyRandom, MatchesCPython) {
  const nlohmann::json want = python(R"(import json, random
r = random.Random(1234)
out = {"words": [r.getrandbits(32) for _ in range(5)], "float": r.random(),
       "below": [r.randrange(7) for _ in range(20)]}
r = random.Random(1234)
out["samples"] = [r.sample(range(n), k) for n, k in [(10, 3), (10, 4), (30, 5), (500, 6), (5, 5), (1000, 25), (3, 0)]]
out["seeds"] = [random.Random(s).random() for s in [0, 1, 2**32 + 5]]
print(json.dumps(out))
)");
  PyRandom r(1234);
  for (size_t i = 0; i < 5; ++i) EXPECT_EQ(r.genrand_uint32(), want["words"][i].get<uint32_t>());
  EXPECT_EQ(r.random(), want["float"].get<double>());
  for (size_t i = 0; i < 20; ++i)
    EXPECT_EQ(int64_t(r.randbelow(7)), want["below"][i].get<int64_t>());
  PyRandom s(1234);
  const std::vector<std::pair<int64_t, int64_t>> nk = {{10, 3}, {10, 4},    {30, 5}, {500, 6},
                                                       {5, 5},  {1000, 25}, {3, 0}};
  for (size_t i = 0; i < nk.size(); ++i)
    EXPECT_EQ(s.sample(nk[i].first, nk[i].second), want["samples"][i].get<std::vector<int64_t>>())
        << nk[i].first << " " << nk[i].second;
  EXPECT_EQ(PyRandom(0).random(), want["seeds"][0].get<double>());
  EXPECT_EQ(PyRandom(1).random(), want["seeds"][1].get<double>());
  EXPECT_EQ(PyRandom((uint64_t(1) << 32) + 5).random(), want["seeds"][2].get<double>());
  EXPECT_THROW(PyRandom(1).sample(3, 4), Error);
}

}  // namespace
}  // namespace nk
