// How the CPU's attention_cached (ops/cpu/kv_attention.cc) deals its work
// to the threads. Its natural task is one (tile, kv head) pair, a tile one
// new token or a prefill run's consecutive tokens of one sequence (up to
// 16): the tile's tokens and the group's query heads share each cache row
// as it streams by. A single sequence's decode has as few pairs as kv
// heads, one under multi-query attention and Multi-head Latent Attention's
// latent cache (every head reads the one latent row), so with fewer pairs
// than threads each pair's query heads are cut into runs of consecutive
// heads, one task each: every run streams the pair's rows again (from
// cache: they are shared), and a head's arithmetic is the same whichever
// run holds it, so the output does not depend on the thread count.
#pragma once
#include <algorithm>
#include <cstdint>

namespace nk::ops {

struct KvAttentionSplit {
  int64_t runs = 1;       // runs of query heads per (token, kv head) pair
  int64_t run_heads = 1;  // heads per run; the last run may have fewer
};

// pairs (tile, kv head) of `group` query heads each, over `threads`
// threads: one run of every head when there are at least as many pairs as
// threads, else up to ceil(threads / pairs) runs of equal size.
inline KvAttentionSplit kv_attention_split(int64_t pairs, int64_t group, int64_t threads) {
  KvAttentionSplit s{1, group};
  if (pairs <= 0 || pairs >= threads || group <= 1) return s;
  const int64_t want = std::min(group, (threads + pairs - 1) / pairs);
  s.run_heads = (group + want - 1) / want;
  s.runs = (group + s.run_heads - 1) / s.run_heads;
  return s;
}

}  // namespace nk::ops
