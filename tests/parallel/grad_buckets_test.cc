#include "parallel/grad_buckets.h"

#include <gtest/gtest.h>

#include <set>

#include "model/model_config.h"
#include "model/transformer.h"

namespace nk::parallel {
namespace {

ParamLayout tiny_layout(const std::string& preset, int64_t n_layer,
                        const std::vector<std::string>& frozen = {}) {
  ModelConfig c = model_preset(preset);
  c.n_layer = n_layer;
  c.d_model = 64;
  c.n_head = 4;
  c.d_ff = 128;
  if (c.n_kv_head != c.n_head) c.n_kv_head = 2;
  return Transformer::layout_for(c, frozen);
}

// The invariants every plan keeps, whatever the bucket size.
void check_plan(const ParamLayout& layout, int64_t n_layer, int64_t bucket_elems) {
  SCOPED_TRACE("bucket_elems " + std::to_string(bucket_elems));
  const auto& ps = layout.params();
  auto buckets = plan_grad_buckets(layout, n_layer, bucket_elems);
  auto stages = grad_ready_stages(layout, n_layer);
  ASSERT_FALSE(buckets.empty());
  // Each trainable parameter in exactly one bucket, inside its range; frozen ones in none.
  std::vector<int> seen(ps.size(), 0);
  for (const GradBucket& b : buckets) {
    int64_t elems = 0, stage = 0;
    for (size_t i : b.params) {
      ++seen[i];
      EXPECT_GE(ps[i].offset, b.begin) << ps[i].name;
      EXPECT_LE(ps[i].offset + ps[i].numel(), b.end) << ps[i].name;
      elems += ps[i].numel();
      stage = std::max(stage, stages[i]);
    }
    EXPECT_EQ(b.ready_stage, stage);
    // Cut as soon as the size is reached: all but the last added parameter
    // stay under it.
    EXPECT_LT(elems - ps[b.params.back()].numel(), bucket_elems);
    // Parameters by descending offset; the bucket starts at its lowest one.
    for (size_t k = 1; k < b.params.size(); ++k)
      EXPECT_GT(ps[b.params[k - 1]].offset, ps[b.params[k]].offset);
    EXPECT_EQ(b.begin, ps[b.params.back()].offset);
    // Never across the matrices / vectors boundary.
    EXPECT_TRUE(b.end <= layout.decay_end() || b.begin >= layout.decay_end());
  }
  for (size_t i = 0; i < ps.size(); ++i) EXPECT_EQ(seen[i], ps[i].trainable ? 1 : 0) << ps[i].name;
  // Launch order by ready stage.
  for (size_t k = 1; k < buckets.size(); ++k)
    EXPECT_LE(buckets[k - 1].ready_stage, buckets[k].ready_stage);
  // The buckets tile the gradient arena [0, trainable_end) without overlap.
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (const GradBucket& b : buckets) ranges.emplace_back(b.begin, b.end);
  std::sort(ranges.begin(), ranges.end());
  EXPECT_EQ(ranges.front().first, 0);
  EXPECT_EQ(ranges.back().second, layout.trainable_end());
  for (size_t k = 1; k < ranges.size(); ++k) EXPECT_EQ(ranges[k - 1].second, ranges[k].first);
}

TEST(GradBuckets, InvariantsForEverySize) {
  for (const char* preset : {"gpt-tiny", "llama-tiny"}) {
    SCOPED_TRACE(preset);
    ParamLayout layout = tiny_layout(preset, 3);
    for (int64_t elems :
         {int64_t(1), int64_t(100), int64_t(5000), int64_t(20000), int64_t(1) << 30})
      check_plan(layout, 3, elems);
  }
}

TEST(GradBuckets, FrozenParametersHaveNoBucket) {
  ParamLayout layout = tiny_layout("gpt-tiny", 2, {"wpe", "h.0.attn.qkv.weight"});
  check_plan(layout, 2, 4096);
}

TEST(GradBuckets, ReadyStagesFollowTheBackward) {
  ParamLayout layout = tiny_layout("gpt-tiny", 2);
  auto stages = grad_ready_stages(layout, 2);
  auto stage_of = [&](const std::string& name) {
    const auto& ps = layout.params();
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i].name == name) return stages[i];
    ADD_FAILURE() << name;
    return int64_t(-1);
  };
  EXPECT_EQ(stage_of("ln_f.weight"), 0);  // head_loss
  EXPECT_EQ(stage_of("h.1.mlp.down.weight"), 1);
  EXPECT_EQ(stage_of("h.1.ln1.bias"), 1);
  EXPECT_EQ(stage_of("h.0.attn.qkv.weight"), 2);
  EXPECT_EQ(stage_of("wte"), 3);  // tied: final only after embed_backward
  EXPECT_EQ(stage_of("wpe"), 3);
  EXPECT_EQ(num_backward_stages(2), 4);
}

// p-tuning's prompt is laid out after the head, but embed_backward writes its
// gradient: a bucket reduced after the head's stage would miss it.
TEST(GradBuckets, PromptIsFinalWithTheEmbeddings) {
  ModelConfig c = model_preset("llama-tiny");
  c.n_layer = 2;
  c.d_model = 64;
  c.n_head = 4;
  c.n_kv_head = 2;
  c.d_ff = 128;
  c.prompt.virtual_tokens = 4;
  c.prompt.encoder_hidden = 16;
  std::vector<std::string> frozen;
  const ParamLayout whole = Transformer::layout_for(c);
  for (const ParamInfo& p : whole.params())
    if (!p.adapter) frozen.push_back(p.name);
  const ParamLayout layout = Transformer::layout_for(c, frozen);
  const auto stages = grad_ready_stages(layout, 2);
  int prompts = 0;
  for (size_t i = 0; i < layout.params().size(); ++i)
    if (layout.params()[i].name.starts_with("prompt.")) {
      EXPECT_EQ(stages[i], embed_stage(2)) << layout.params()[i].name;
      ++prompts;
    }
  EXPECT_EQ(prompts, 7);  // the table and the encoder's three weights and biases
  check_plan(layout, 2, 100);
  for (const GradBucket& b : plan_grad_buckets(layout, 2, 100, true))
    EXPECT_EQ(b.ready_stage, embed_stage(2));  // FSDP's units: only the prompt trains
}

// One parameter per bucket (size 1): the matrices' buckets in reverse layer
// order, each launched at its layer's stage; the tied embedding last.
TEST(GradBuckets, OneParameterPerBucketInReverseLayerOrder) {
  ParamLayout layout = tiny_layout("gpt-tiny", 2);
  auto buckets = plan_grad_buckets(layout, 2, 1);
  int64_t trainable = 0;
  for (const ParamInfo& p : layout.params()) trainable += p.trainable;
  ASSERT_EQ(int64_t(buckets.size()), trainable);
  const auto& ps = layout.params();
  std::vector<std::string> matrices;
  for (const GradBucket& b : buckets) {
    ASSERT_EQ(b.params.size(), 1u);
    if (ps[b.params[0]].offset < layout.decay_end()) matrices.push_back(ps[b.params[0]].name);
  }
  const std::vector<std::string> want = {"h.1.mlp.down.weight",
                                         "h.1.mlp.up.weight",
                                         "h.1.attn.proj.weight",
                                         "h.1.attn.qkv.weight",
                                         "h.0.mlp.down.weight",
                                         "h.0.mlp.up.weight",
                                         "h.0.attn.proj.weight",
                                         "h.0.attn.qkv.weight",
                                         "wpe",
                                         "wte"};
  EXPECT_EQ(matrices, want);
  EXPECT_EQ(ps[buckets.back().params[0]].name, "wte");
}

// A size between parameters: whole parameters, cut once the size is reached.
TEST(GradBuckets, BoundariesAtParameters) {
  ParamLayout layout = tiny_layout("llama-tiny", 2);
  const auto& ps = layout.params();
  const int64_t mlp = layout.find("h.1.mlp.down.weight").numel();
  auto buckets = plan_grad_buckets(layout, 2, mlp + 1);
  // The last layer's down projection (the arena's last matrix, untied head
  // aside) shares its bucket with the next matrix below it.
  bool found = false;
  for (const GradBucket& b : buckets)
    for (size_t k = 0; k < b.params.size(); ++k)
      if (ps[b.params[k]].name == "h.1.mlp.down.weight") {
        found = true;
        EXPECT_GE(b.params.size(), 2u);
      }
  EXPECT_TRUE(found);
  EXPECT_NE(describe_buckets(buckets).find("buckets over"), std::string::npos);
}

// The distributed optimizer's blocks: for every size, the n blocks of a
// bucket tile it in rank order and differ by at most one element, and
// owned_shards gives each rank its own.
TEST(GradBuckets, ShardBlocksTileEveryBucket) {
  const ParamLayout layout = tiny_layout("llama-tiny", 3);
  for (int64_t elems : {int64_t(1), int64_t(3000), int64_t(1) << 30})
    for (int64_t n : {1, 2, 3, 4, 7}) {
      auto buckets = plan_grad_buckets(layout, 3, elems);
      std::vector<std::vector<ShardPiece>> owned;
      for (int64_t r = 0; r < n; ++r) owned.push_back(owned_shards(buckets, n, r));
      for (size_t k = 0; k < buckets.size(); ++k) {
        const GradBucket& b = buckets[k];
        auto counts = shard_counts(b, n);
        ASSERT_EQ(int64_t(counts.size()), n);
        int64_t at = b.begin, lo = b.numel(), hi = 0;
        for (int64_t r = 0; r < n; ++r) {
          const ShardPiece& p = owned[size_t(r)][k];
          EXPECT_EQ(p.begin, b.begin);
          EXPECT_EQ(p.end, b.end);
          EXPECT_EQ(p.own_begin, at) << "bucket " << k << " rank " << r << " of " << n;
          EXPECT_EQ(p.own_end - p.own_begin, counts[size_t(r)]);
          at = p.own_end;
          lo = std::min(lo, counts[size_t(r)]);
          hi = std::max(hi, counts[size_t(r)]);
        }
        EXPECT_EQ(at, b.end);
        EXPECT_LE(hi - lo, 1);
      }
    }
}

// What each stage reads: exactly the buckets holding its parameters, and for
// GPT-2's tied head also the embeddings' (wte); Llama's untied head not.
TEST(GradBuckets, StageBucketsAreWhatEachStageReads) {
  for (const char* preset : {"gpt-tiny", "llama-tiny"})
    for (bool aligned : {false, true}) {
      SCOPED_TRACE(std::string(preset) + (aligned ? " stage-aligned" : ""));
      const ParamLayout layout = tiny_layout(preset, 3);
      const bool tied = std::string(preset) == "gpt-tiny";
      const auto buckets = plan_grad_buckets(layout, 3, 3000, aligned);
      const auto stages = grad_ready_stages(layout, 3);
      const auto reads = stage_buckets(layout, 3, tied, buckets);
      ASSERT_EQ(int64_t(reads.size()), num_backward_stages(3));
      for (int64_t s = 0; s < num_backward_stages(3); ++s) {
        std::set<size_t> want;
        for (size_t k = 0; k < buckets.size(); ++k)
          for (size_t i : buckets[k].params)
            if (stages[i] == s || (tied && s == kHeadStage && stages[i] == embed_stage(3)))
              want.insert(k);
        EXPECT_EQ(std::vector<size_t>(want.begin(), want.end()), reads[size_t(s)]) << "stage " << s;
      }
      EXPECT_EQ(block_stage(3, 0), 3);
      EXPECT_EQ(block_stage(3, 2), 1);
      if (aligned) {  // each bucket belongs to one stage
        for (const GradBucket& b : buckets)
          for (size_t i : b.params) EXPECT_EQ(stages[i], b.ready_stage) << layout.params()[i].name;
      }
    }
}

}  // namespace
}  // namespace nk::parallel
