// The synthetic preference set of the align CLI tests: each prompt
// "say XYZ:" (three random letters) prefers the fixed marker " END" to four
// random letters, so a model that learns the preference scores or
// generates the marker.
#pragma once
#include <string>

#include "core/rng.h"
#include "test_util.h"

namespace nk::test {

inline std::string letters(Rng& rng, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s += char('a' + rng.below(26));
  return s;
}

// n pairs into `path`, drawn from `seed`.
inline void write_marker_pairs(const std::string& path, int n, uint64_t seed) {
  Rng rng(seed);
  std::string out;
  for (int i = 0; i < n; ++i)
    out += fmt::format(R"({{"prompt": "say {}:", "chosen": " END", "rejected": "{}"}})"
                       "\n",
                       letters(rng, 3), letters(rng, 4));
  write_file(path, out);
}

}  // namespace nk::test
