#include "parallel/grad_buckets.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>

#include "core/error.h"

namespace nk::parallel {

namespace {
// The block index of "h.<l>.<rest>", or -1 for any other name.
int64_t block_of(const std::string& name) {
  if (name.rfind("h.", 0) != 0) return -1;
  char* end = nullptr;
  long l = std::strtol(name.c_str() + 2, &end, 10);
  if (end == name.c_str() + 2 || *end != '.') return -1;
  return l;
}
}  // namespace

std::vector<int64_t> grad_ready_stages(const ParamLayout& layout, int64_t n_layer) {
  const auto& ps = layout.params();
  std::vector<int64_t> stage(ps.size());
  bool seen_block = false;
  for (size_t i = 0; i < ps.size(); ++i) {
    int64_t l = block_of(ps[i].name);
    if (l >= n_layer) fail("parameter '{}' names block {} of {}", ps[i].name, l, n_layer);
    if (l >= 0) {
      seen_block = true;
      stage[i] = block_stage(n_layer, l);
    } else if (ps[i].name.starts_with("prompt.")) {
      // p-tuning's prompt (its table and encoder) is laid out after the blocks,
      // but embed_backward writes its gradient.
      stage[i] = embed_stage(n_layer);
    } else {
      stage[i] = seen_block ? kHeadStage : embed_stage(n_layer);  // after the blocks: the head
    }
  }
  return stage;
}

std::vector<GradBucket> plan_grad_buckets(const ParamLayout& layout, int64_t n_layer,
                                          int64_t bucket_elems, bool stage_aligned) {
  NK_CHECK(bucket_elems >= 1, "bucket_elems must be positive, got {}", bucket_elems);
  const auto& ps = layout.params();
  const std::vector<int64_t> stage = grad_ready_stages(layout, n_layer);
  // Trainable parameters by descending offset.
  std::vector<size_t> order;
  for (size_t i = 0; i < ps.size(); ++i)
    if (ps[i].trainable) order.push_back(i);
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return ps[a].offset > ps[b].offset; });

  std::vector<GradBucket> buckets;
  const int64_t regions[] = {layout.decay_end(), layout.trainable_end()};
  auto region_end = [&](int64_t offset) { return offset < regions[0] ? regions[0] : regions[1]; };
  GradBucket cur;
  int64_t used = 0;  // parameter elements in `cur`
  auto close = [&] {
    if (cur.params.empty()) return;
    cur.begin = ps[cur.params.back()].offset;
    buckets.push_back(std::move(cur));
    cur = GradBucket();
    used = 0;
  };
  for (size_t i : order) {
    const int64_t off = ps[i].offset;
    // Crossing from the vectors' region into the matrices' starts a new bucket.
    if (!cur.params.empty() && region_end(off) != region_end(ps[cur.params.back()].offset)) close();
    if (stage_aligned && !cur.params.empty() && stage[i] != cur.ready_stage) close();
    // Experts' gradients reduce over another group than the rest (expert parallelism).
    const bool expert = ps[i].split == Split::Experts;
    if (!cur.params.empty() && expert != cur.experts) close();
    cur.experts = expert;
    if (cur.params.empty()) {
      // The bucket runs to the next bucket's start, or its region's end.
      cur.end = buckets.empty() || region_end(off) != region_end(buckets.back().begin)
                    ? region_end(off)
                    : buckets.back().begin;
    }
    cur.params.push_back(i);
    cur.ready_stage = std::max(cur.ready_stage, stage[i]);
    used += ps[i].numel();
    if (used >= bucket_elems) close();
  }
  close();
  std::stable_sort(buckets.begin(), buckets.end(), [](const GradBucket& a, const GradBucket& b) {
    return a.ready_stage < b.ready_stage;
  });
  return buckets;
}

std::vector<std::vector<size_t>> stage_buckets(const ParamLayout& layout, int64_t n_layer,
                                               bool tied_embeddings,
                                               const std::vector<GradBucket>& buckets) {
  const std::vector<int64_t> stage = grad_ready_stages(layout, n_layer);
  std::vector<std::vector<size_t>> out(size_t(num_backward_stages(n_layer)));
  auto add = [&](int64_t s, size_t k) {
    auto& list = out[size_t(s)];
    if (list.empty() || list.back() != k) list.push_back(k);
  };
  for (size_t k = 0; k < buckets.size(); ++k)
    for (size_t i : buckets[k].params) {
      add(stage[i], k);
      if (tied_embeddings && stage[i] == embed_stage(n_layer)) add(kHeadStage, k);
    }
  return out;
}

namespace {
// Where block j of n starts within a bucket of `len` elements.
int64_t block_start(int64_t len, int64_t n, int64_t j) {
  return j * len / n;
}
}  // namespace

std::vector<int64_t> shard_counts(const GradBucket& b, int64_t n) {
  NK_CHECK(n >= 1, "shard_counts: {} shards", n);
  std::vector<int64_t> c(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j)
    c[size_t(j)] = block_start(b.numel(), n, j + 1) - block_start(b.numel(), n, j);
  return c;
}

std::vector<ShardPiece> owned_shards(const std::vector<GradBucket>& buckets, int64_t n,
                                     int64_t rank) {
  NK_CHECK(0 <= rank && rank < n, "owned_shards: rank {} of {}", rank, n);
  std::vector<ShardPiece> out;
  for (const GradBucket& b : buckets)
    out.push_back({b.begin, b.end, b.begin + block_start(b.numel(), n, rank),
                   b.begin + block_start(b.numel(), n, rank + 1)});
  return out;
}

std::string describe_buckets(const std::vector<GradBucket>& buckets) {
  int64_t total = 0, largest = 0;
  for (const GradBucket& b : buckets) {
    total += b.numel();
    largest = std::max(largest, b.numel());
  }
  return fmt::format("{} buckets over {:.2f}M gradients ({:.1f} MiB), largest {:.2f} MiB",
                     buckets.size(), double(total) / 1e6, double(total) * 4 / 1048576.0,
                     double(largest) * 4 / 1048576.0);
}

}  // namespace nk::parallel
