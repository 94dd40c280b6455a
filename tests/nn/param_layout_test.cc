// ParamLayout's fused parts and tensor-parallel shards: "rank r of n of part k
// of tensor t", as tensor parallelism and resharding checkpoints use them.
#include "nn/param_layout.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "model/arch.h"
#include "model/tiny_config.h"
#include "test_util.h"

namespace nk {
namespace {

ParamLayout small_layout() {
  ParamLayout l;
  l.add("qkv", {4 + 2 + 2, 6}, Init::Normal, 0.02f, {Split::Rows, {{"q", 4}, {"k", 2}, {"v", 2}}});
  l.add("proj", {6, 4}, Init::Normal, 0.02f, {Split::Cols, {}});
  l.add("norm", {6}, Init::Ones);
  l.finalize();
  return l;
}

TEST(ParamLayout, FusedPartsAreRowRangesOfTheTensor) {
  ParamLayout l = small_layout();
  const ParamInfo& qkv = l.find("qkv");
  ASSERT_EQ(qkv.parts.size(), 3u);
  EXPECT_EQ(qkv.part("k").row0, 4);
  EXPECT_EQ(qkv.part("v").row0, 6);
  EXPECT_EQ(qkv.part("v").rows, 2);
  Tensor flat = Tensor::zeros({l.total()}, DType::F32);
  Tensor k = ParamLayout::part_view(flat, qkv, "k");
  EXPECT_EQ(k.shape(), (Shape{2, 6}));
  EXPECT_EQ(static_cast<float*>(k.raw()) - flat.data<float>(), qkv.offset + 4 * 6);
  EXPECT_TRUE(test::contains(test::error_of([&] { qkv.part("gate"); }), "no part 'gate'"));
}

TEST(ParamLayout, PartsMustCoverTheRows) {
  ParamLayout l;
  EXPECT_THROW(l.add("w", {5, 2}, Init::Zeros, 0.f, {Split::Rows, {{"a", 2}, {"b", 2}}}),
               std::exception);
}

TEST(ParamLayout, ShardRangesSplitEachPartSeparately) {
  ParamLayout l = small_layout();
  const ParamInfo& qkv = l.find("qkv");
  // Rank 1 of 2 holds the second half of q, of k and of v, packed [q1 | k1 | v1].
  auto r = shard_ranges(qkv, 1, 2);
  ASSERT_EQ(r.size(), 3u);
  EXPECT_EQ(r[0].start, 2);
  EXPECT_EQ(r[0].len, 2);
  EXPECT_EQ(r[0].local_start, 0);
  EXPECT_EQ(r[1].start, 5);
  EXPECT_EQ(r[1].local_start, 2);
  EXPECT_EQ(r[2].start, 7);
  EXPECT_EQ(r[2].local_start, 3);
  EXPECT_EQ(shard_shape(qkv, 2), (Shape{4, 6}));
  // One part of one rank.
  auto k = shard_ranges(qkv, 0, 2, "k");
  ASSERT_EQ(k.size(), 1u);
  EXPECT_EQ(k[0].start, 4);
  EXPECT_EQ(k[0].len, 1);
  EXPECT_EQ(shard_shape(qkv, 2, "k"), (Shape{1, 6}));
  // Row-parallel weights split columns; replicated tensors are whole on every rank.
  auto p = shard_ranges(l.find("proj"), 1, 2);
  ASSERT_EQ(p.size(), 1u);
  EXPECT_EQ(p[0].dim, 1);
  EXPECT_EQ(p[0].start, 2);
  EXPECT_EQ(shard_shape(l.find("proj"), 2), (Shape{6, 2}));
  EXPECT_EQ(shard_shape(l.find("norm"), 4), (Shape{6}));
  // n = 1: the whole tensor as one range... or as its parts in order.
  EXPECT_EQ(shard_shape(qkv, 1), qkv.shape);
}

TEST(ParamLayout, UnevenSplitsAreErrorsNamingTheTensor) {
  ParamLayout l = small_layout();
  std::string e = test::error_of([&] { shard_ranges(l.find("qkv"), 0, 4); });
  EXPECT_TRUE(test::contains(e, "'qkv'")) << e;
  EXPECT_TRUE(test::contains(e, "part 'k'")) << e;
  e = test::error_of([&] { shard_ranges(l.find("proj"), 0, 3); });
  EXPECT_TRUE(test::contains(e, "columns")) << e;
}

// Every rank's shards of every parameter of a real model, put back together,
// cover each element exactly once (n times for a replicated one).
TEST(ParamLayout, ShardsOfEveryModelParameterTileIt) {
  for (bool llama : {false, true}) {
    ModelConfig c = test::tiny_config(llama, 64, 16);
    ParamLayout l = model_layout(c);
    for (const ParamInfo& p : l.params())
      for (int64_t n : {1, 2}) {
        const int64_t rows = p.shape[0], cols = p.shape.size() > 1 ? p.shape[1] : 1;
        std::vector<int> seen(size_t(rows * cols), 0);
        for (int64_t r = 0; r < n; ++r)
          for (const SliceRange& s : shard_ranges(p, r, n))
            for (int64_t i = 0; i < rows; ++i)
              for (int64_t j = 0; j < cols; ++j) {
                const int64_t x = s.dim == 0 ? i : j;
                if (x >= s.start && x < s.start + s.len) ++seen[size_t(i * cols + j)];
              }
        const int want = p.split == Split::Replicated ? int(n) : 1;
        EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [&](int v) { return v == want; }))
            << p.name << " over " << n;
      }
  }
}

// A tensor-parallel rank's layout: each parameter at its shard shape, each
// fused part at its share, the same order; extract and insert move a whole
// value to a rank's shard and back (every rank's shard together rebuild it).
TEST(ParamLayout, ShardLayoutAndCopiesRoundTrip) {
  const ParamLayout whole = small_layout();
  const ParamLayout half = whole.shard(2);
  ASSERT_EQ(half.params().size(), whole.params().size());
  EXPECT_EQ(half.find("qkv").shape, (Shape{4, 6}));
  EXPECT_EQ(half.find("qkv").part("q").rows, 2);
  EXPECT_EQ(half.find("qkv").part("k").row0, 2);
  EXPECT_EQ(half.find("proj").shape, (Shape{6, 2}));
  EXPECT_EQ(half.find("norm").shape, (Shape{6}));
  for (const ParamInfo& p : whole.params()) {
    std::vector<float> value(size_t(p.numel())), rebuilt(value.size(), -1.f);
    for (size_t i = 0; i < value.size(); ++i) value[i] = float(i);
    for (int64_t r = 0; r < 2; ++r) {
      std::vector<float> shard(size_t(shape_numel(shard_shape(p, 2))));
      extract_shard(p, r, 2, sizeof(float), value.data(), shard.data());
      if (p.name == "qkv" && r == 1) {  // q rows 2-3, k row 5, v row 7 of the whole
        EXPECT_EQ(shard[0], float(2 * 6));
        EXPECT_EQ(shard[2 * 6], float(5 * 6));
        EXPECT_EQ(shard[3 * 6], float(7 * 6));
      }
      if (p.name == "proj" && r == 1) {
        EXPECT_EQ(shard[1], value[3]);  // columns 2-3 of row 0
      }
      insert_shard(p, r, 2, sizeof(float), shard.data(), rebuilt.data());
    }
    EXPECT_EQ(rebuilt, value) << p.name;
  }
  std::string e = test::error_of([&] { whole.shard(4); });
  EXPECT_NE(e.find("qkv"), std::string::npos) << e;
}

// Expert parallelism (ParamLayout::shard_experts): a MoE tensor of 4 experts
// of 2 fused parts (gate, up) each split 2 ways holds experts 0-1 on rank 0
// and 2-3 on rank 1, each as whole contiguous rows; the other parameters,
// tensor-parallel splits included, stay whole.
TEST(ParamLayout, ShardExpertsSplitsWholeExpertsOnly) {
  ParamLayout l;
  ParamOptions up{Split::Experts, {}};
  for (int e = 0; e < 4; ++e) {
    up.parts.push_back({"e" + std::to_string(e) + ".gate", 3});
    up.parts.push_back({"e" + std::to_string(e) + ".up", 3});
  }
  l.add("up", {4 * 6, 5}, Init::Normal, 0.02f, up);
  l.add("down", {4 * 5, 3}, Init::Normal, 0.02f, {Split::Experts, {}});
  l.add("qkv", {8, 5}, Init::Normal, 0.02f, {Split::Rows, {{"q", 4}, {"k", 2}, {"v", 2}}});
  l.add("norm", {5}, Init::Ones);
  l.finalize();
  const ParamLayout half = l.shard_experts(2);
  EXPECT_EQ(half.find("up").shape, (Shape{12, 5}));
  EXPECT_TRUE(half.find("up").parts.empty());
  EXPECT_EQ(half.find("down").shape, (Shape{10, 3}));
  EXPECT_EQ(half.find("qkv").shape, (Shape{8, 5}));
  EXPECT_EQ(half.find("norm").shape, (Shape{5}));
  const ParamInfo& p = l.find("up");
  auto r = shard_ranges(p, 1, 2);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].start, 12);
  EXPECT_EQ(r[0].len, 12);
  EXPECT_TRUE(shard_ranges(p, 0, 2, "e2.up").empty());  // rank 1's expert
  auto e3 = shard_ranges(p, 1, 2, "e3.gate");
  ASSERT_EQ(e3.size(), 1u);
  EXPECT_EQ(e3[0].start, 18);
  EXPECT_EQ(e3[0].local_start, 6);
  std::vector<float> value(size_t(p.numel())), rebuilt(value.size(), -1.f);
  for (size_t i = 0; i < value.size(); ++i) value[i] = float(i);
  for (int64_t k = 0; k < 2; ++k) {
    std::vector<float> shard(size_t(shape_numel(shard_shape(p, 2))));
    extract_shard(p, k, 2, sizeof(float), value.data(), shard.data());
    EXPECT_EQ(shard[0], value[size_t(k * 12 * 5)]);
    insert_shard(p, k, 2, sizeof(float), shard.data(), rebuilt.data());
  }
  EXPECT_EQ(rebuilt, value);
  std::string e = test::error_of([&] { l.shard_experts(3); });
  EXPECT_NE(e.find("'up'"), std::string::npos) << e;
}

// Expert tensor parallelism (ParamInfo::expert_split): under 2-way tensor
// parallelism every expert of a MoE tensor is kept, its gate and up parts
// halved (Rows) or its down columns halved (Cols); the tensor-parallel shards
// then split over 2 expert-parallel ranks by whole experts, and extract /
// insert over both groups give back the whole value.
TEST(ParamLayout, ExpertTensorsSplitEachExpertOverTensorParallelRanks) {
  ParamLayout l;
  ParamOptions up{Split::Experts, {}}, down{Split::Experts, {}};
  up.expert_split = Split::Rows;
  down.expert_split = Split::Cols;
  for (int e = 0; e < 4; ++e) {
    up.parts.push_back({"e" + std::to_string(e) + ".gate", 4});
    up.parts.push_back({"e" + std::to_string(e) + ".up", 4});
    down.parts.push_back({"e" + std::to_string(e), 5});
  }
  l.add("up", {4 * 8, 5}, Init::Normal, 0.02f, up);
  l.add("down", {4 * 5, 4}, Init::Normal, 0.02f, down);
  l.finalize();
  const ParamLayout tp = l.shard(2);
  const ParamInfo &tu = tp.find("up"), &td = tp.find("down");
  EXPECT_EQ(tu.shape, (Shape{16, 5}));
  EXPECT_EQ(td.shape, (Shape{20, 2}));
  EXPECT_EQ(tu.split, Split::Experts);
  EXPECT_EQ(tu.expert_split, Split::Rows);
  ASSERT_EQ(tu.parts.size(), 8u);
  EXPECT_EQ(tu.parts[3].name, "e1.up");
  EXPECT_EQ(tu.parts[3].row0, 6);
  EXPECT_EQ(tu.parts[3].rows, 2);
  ASSERT_EQ(td.parts.size(), 4u);
  EXPECT_EQ(td.parts[1].rows, 5);
  // Each tp rank's shares of experts 2 and 3 on ep rank 1.
  const ParamLayout both = tp.shard_experts(2);
  EXPECT_EQ(both.find("up").shape, (Shape{8, 5}));
  EXPECT_EQ(both.find("down").shape, (Shape{10, 2}));
  for (const char* name : {"up", "down"}) {
    const ParamInfo& p = l.find(name);
    const ParamInfo& q = tp.find(name);
    std::vector<float> value(size_t(p.numel())), rebuilt(value.size(), -1.f);
    for (size_t i = 0; i < value.size(); ++i) value[i] = float(i);
    for (int64_t t = 0; t < 2; ++t) {
      std::vector<float> shard(size_t(q.numel())), mid(shard.size(), -1.f);
      extract_shard(tensor_split(p), t, 2, sizeof(float), value.data(), shard.data());
      for (int64_t e = 0; e < 2; ++e) {
        std::vector<float> mine(size_t(shape_numel(shard_shape(q, 2))));
        extract_shard(q, e, 2, sizeof(float), shard.data(), mine.data());
        insert_shard(q, e, 2, sizeof(float), mine.data(), mid.data());
      }
      EXPECT_EQ(mid, shard) << name;
      insert_shard(tensor_split(p), t, 2, sizeof(float), shard.data(), rebuilt.data());
    }
    EXPECT_EQ(rebuilt, value) << name;
  }
  // tp rank 1's up: rows 2-3 of e0.gate first (whole rows 2, 3).
  std::vector<float> value(size_t(l.find("up").numel())), shard(size_t(tu.numel()));
  for (size_t i = 0; i < value.size(); ++i) value[i] = float(i);
  extract_shard(tensor_split(l.find("up")), 1, 2, sizeof(float), value.data(), shard.data());
  EXPECT_EQ(shard[0], value[2 * 5]);
  EXPECT_EQ(shard[2 * 5], value[6 * 5]);  // then rows 2-3 of e0.up (whole rows 6, 7)
}

// Vocabulary padding (Megatron's make_vocab_size_divisible_by): 257 rows
// split 2 ways are 512 (256 a rank), 4 ways 512 (128 a rank: rank 2 holds
// row 256 alone, rank 3 padding only); the ranges name real rows only,
// extract zeroes the padding and insert drops it; one process never pads.
// Whole experts under tensor parallelism (parallel.etp = 1,
// ParamLayout::replicated): the chosen parameters keep their offsets and
// shapes, whole on every tp rank (experts still split over ep), the others
// split as before.
TEST(ParamLayout, ReplicatedKeepsChosenParametersWholeOverTensorParallelRanks) {
  ParamLayout l;
  ParamOptions up{Split::Experts, {}};
  up.expert_split = Split::Rows;
  for (int e = 0; e < 4; ++e) {
    std::string expert = "e";  // (not "e" + a temporary: GCC 12's -Wrestrict false positive)
    expert += std::to_string(e);
    up.parts.push_back({expert + ".gate", 4});
    up.parts.push_back({expert + ".up", 4});
  }
  l.add("h.0.moe.up.weight", {4 * 8, 5}, Init::Normal, 0.02f, up);
  l.add("h.0.moe.shared_down.weight", {5, 4}, Init::Normal, 0.02f, {Split::Cols, {}});
  l.add("h.0.attn.proj.weight", {5, 4}, Init::Normal, 0.02f, {Split::Cols, {}});
  l.finalize();
  const ParamLayout r =
      l.replicated([](const ParamInfo& p) { return p.name.find(".moe.") != std::string::npos; });
  EXPECT_EQ(r.total(), l.total());
  EXPECT_EQ(r.find("h.0.moe.up.weight").offset, l.find("h.0.moe.up.weight").offset);
  EXPECT_EQ(r.find("h.0.moe.up.weight").split, Split::Experts);
  EXPECT_EQ(tensor_split(r.find("h.0.moe.up.weight")).split, Split::Replicated);
  EXPECT_EQ(r.find("h.0.moe.shared_down.weight").split, Split::Replicated);
  EXPECT_EQ(r.find("h.0.attn.proj.weight").split, Split::Cols);
  const ParamLayout tp = r.shard(2);
  EXPECT_EQ(tp.find("h.0.moe.up.weight").shape, (Shape{32, 5}));
  EXPECT_EQ(tp.find("h.0.moe.shared_down.weight").shape, (Shape{5, 4}));
  EXPECT_EQ(tp.find("h.0.attn.proj.weight").shape, (Shape{5, 2}));
  // Still split over expert-parallel ranks: 2 of the 4 experts, whole.
  EXPECT_EQ(tp.shard_experts(2).find("h.0.moe.up.weight").shape, (Shape{16, 5}));
}

// Experts split over etp of the tp ranks (1 < parallel.etp < tp,
// ParamLayout::split_over): the chosen parameters split 2 ways under 4-way
// tensor parallelism, tp rank r holding share r mod 2 (each expert's gate
// and up rows, the shared expert's columns); the expert-parallel split is
// unchanged; the others split 4 ways.
TEST(ParamLayout, SplitOverFewerRanksThanTensorParallel) {
  ParamLayout l;
  ParamOptions up{Split::Experts, {}};
  up.expert_split = Split::Rows;
  for (int e = 0; e < 4; ++e) {
    std::string expert = "e";  // (not "e" + a temporary: GCC 12's -Wrestrict false positive)
    expert += std::to_string(e);
    up.parts.push_back({expert + ".gate", 4});
    up.parts.push_back({expert + ".up", 4});
  }
  l.add("h.0.moe.up.weight", {4 * 8, 5}, Init::Normal, 0.02f, up);
  l.add("h.0.moe.shared_down.weight", {5, 4}, Init::Normal, 0.02f, {Split::Cols, {}});
  l.add("h.0.attn.proj.weight", {5, 4}, Init::Normal, 0.02f, {Split::Cols, {}});
  l.finalize();
  const ParamLayout s =
      l.split_over([](const ParamInfo& p) { return p.name.find(".moe.") != std::string::npos; }, 2);
  EXPECT_EQ(s.total(), l.total());
  EXPECT_EQ(s.find("h.0.moe.up.weight").tp_ways, 2);
  EXPECT_EQ(s.find("h.0.attn.proj.weight").tp_ways, 0);
  const ParamLayout tp = s.shard(4);
  EXPECT_EQ(tp.find("h.0.moe.up.weight").shape, (Shape{16, 5}));  // 2 of each part's 4 rows
  EXPECT_EQ(tp.find("h.0.moe.up.weight").tp_ways, 2);
  EXPECT_EQ(tp.find("h.0.moe.shared_down.weight").shape, (Shape{5, 2}));
  EXPECT_EQ(tp.find("h.0.attn.proj.weight").shape, (Shape{5, 1}));
  const ParamInfo up_split = tensor_split(s.find("h.0.moe.up.weight"));
  for (int r = 0; r < 4; ++r) {
    const auto ranges = shard_ranges(up_split, r, 4, "e1.up");
    ASSERT_EQ(ranges.size(), 1u);
    EXPECT_EQ(ranges[0].start, 12 + (r % 2) * 2) << "rank " << r;  // e1.up: rows 12-15
    EXPECT_EQ(ranges[0].len, 2);
    EXPECT_EQ(shard_ranges(s.find("h.0.moe.shared_down.weight"), r, 4)[0].start, (r % 2) * 2);
  }
  // Round trip: every rank's shard, inserted, rebuilds the whole (the
  // shares of ranks 2, 3 equal those of 0, 1).
  std::vector<float> whole(20), back(20, -1.f), shard(10);
  for (int i = 0; i < 20; ++i) whole[size_t(i)] = float(i);
  const ParamInfo& sd = s.find("h.0.moe.shared_down.weight");
  for (int r = 0; r < 4; ++r) {
    extract_shard(sd, r, 4, sizeof(float), whole.data(), shard.data());
    insert_shard(sd, r, 4, sizeof(float), shard.data(), back.data());
  }
  EXPECT_EQ(back, whole);
  // The experts still split over expert-parallel ranks: 2 of 4, each at its share.
  EXPECT_EQ(tp.shard_experts(2).find("h.0.moe.up.weight").shape, (Shape{8, 5}));
  EXPECT_EQ(shard_shape(s.find("h.0.moe.up.weight"), 2), (Shape{16, 5}));  // ep: whole experts
}

TEST(ParamLayout, VocabularyPaddingUnderTensorParallelism) {
  EXPECT_EQ(padded_rows(257, 128, 1), 257);
  EXPECT_EQ(padded_rows(257, 128, 2), 512);
  EXPECT_EQ(padded_rows(257, 128, 4), 512);
  EXPECT_EQ(padded_rows(256, 128, 2), 256);
  EXPECT_EQ(padded_rows(257, 1, 2), 258);
  EXPECT_EQ(padded_rows(257, 0, 2), 257);
  ParamLayout l;
  l.add("wte", {257, 3}, Init::Normal, 0.02f, {Split::Rows, {}, false, 128});
  l.finalize();
  const ParamInfo& p = l.find("wte");
  EXPECT_EQ(shard_shape(p, 1), (Shape{257, 3}));
  EXPECT_EQ(shard_shape(p, 2), (Shape{256, 3}));
  EXPECT_EQ(shard_shape(p, 4), (Shape{128, 3}));
  ASSERT_EQ(shard_ranges(p, 1, 2).size(), 1u);
  EXPECT_EQ(shard_ranges(p, 1, 2)[0].start, 256);
  EXPECT_EQ(shard_ranges(p, 1, 2)[0].len, 1);
  EXPECT_EQ(shard_ranges(p, 2, 4)[0].len, 1);
  EXPECT_TRUE(shard_ranges(p, 3, 4).empty());
  EXPECT_EQ(shard_ranges(p, 0, 1)[0].len, 257);
  std::vector<float> value(257 * 3);
  for (size_t i = 0; i < value.size(); ++i) value[i] = float(i + 1);
  for (int64_t n : {2, 4}) {
    const int64_t share = shard_shape(p, n)[0];
    std::vector<float> rebuilt(value.size(), 0.f);
    for (int64_t r = 0; r < n; ++r) {
      std::vector<float> shard(size_t(share * 3), -7.f);  // stale contents
      extract_shard(p, r, n, sizeof(float), value.data(), shard.data());
      for (int64_t row = 0; row < share; ++row)
        for (int64_t j = 0; j < 3; ++j) {
          const int64_t id = r * share + row;
          EXPECT_EQ(shard[size_t(row * 3 + j)], id < 257 ? value[size_t(id * 3 + j)] : 0.f)
              << "rank " << r << " of " << n << " row " << row;
        }
      insert_shard(p, r, n, sizeof(float), shard.data(), rebuilt.data());
    }
    EXPECT_EQ(rebuilt, value) << n;
    const ParamLayout sharded = l.shard(n);
    EXPECT_EQ(sharded.find("wte").shape, (Shape{share, 3}));
    EXPECT_EQ(sharded.find("wte").pad_multiple, 0);  // a shard is not split again
  }
  // Models pad their token table and untied head.
  const ParamLayout m = model_layout(test::tiny_config(true, 257, 16));
  EXPECT_EQ(m.find("wte").pad_multiple, 128);
  EXPECT_EQ(m.find("lm_head.weight").pad_multiple, 128);
  EXPECT_EQ(m.shard(2).find("lm_head.weight").shape[0], 256);
  EXPECT_EQ(m.find("h.0.attn.qkv.weight").pad_multiple, 0);
  ParamLayout fused;
  EXPECT_THROW(
      fused.add("x", {4, 2}, Init::Zeros, 0.f, {Split::Rows, {{"a", 2}, {"b", 2}}, false, 8}),
      std::exception);
}

}  // namespace
}  // namespace nk
