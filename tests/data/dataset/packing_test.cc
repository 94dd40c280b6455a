// Sequence packing: every token placed exactly once (split) or the first
// seq_len of each document (truncate); no row over seq_len; targets only
// inside a document; positions restart per piece; cu_seqlens in the layout
// attention takes; loss masks; efficiency of first-fit-decreasing against the
// order-preserving greedy packer on the same documents.
#include "data/dataset/packing.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <map>

#include "core/error.h"
#include "core/rng.h"

namespace nk {
namespace {

constexpr int32_t kIgnore = PackedRows::kIgnoreIndex;

std::vector<std::vector<int32_t>> random_docs(int64_t n, int64_t max_len, uint64_t seed) {
  Rng r(seed);
  std::vector<std::vector<int32_t>> docs(static_cast<size_t>(n));
  for (auto& d : docs) {
    // Mostly short documents, a few long ones, a few empty.
    const uint64_t kind = r.below(10);
    const int64_t len = kind == 0 ? 0
                        : kind == 1
                            ? int64_t(r.below(uint64_t(max_len))) + 1
                            : int64_t(r.below(uint64_t(std::max<int64_t>(1, max_len / 4)))) + 1;
    for (int64_t i = 0; i < len; ++i) d.push_back(int32_t(r.below(1000)));
  }
  return docs;
}

// Every structural invariant of a packing of `docs`.
void check_packing(const std::vector<std::vector<int32_t>>& docs, const PackingOptions& opt,
                   const PackedRows& p, const std::vector<std::vector<uint8_t>>& masks = {}) {
  const int64_t T = opt.seq_len, S1 = p.max_segments + 1;
  ASSERT_EQ(p.seq_len, T);
  ASSERT_EQ(int64_t(p.pieces.size()), p.n_rows);
  ASSERT_EQ(int64_t(p.tokens.size()), p.n_rows * T);
  ASSERT_EQ(int64_t(p.cu_seqlens.size()), p.n_rows * S1);
  std::map<int64_t, std::vector<PackedPiece>> by_doc;
  int64_t real = 0;
  for (int64_t row = 0; row < p.n_rows; ++row) {
    SCOPED_TRACE(::testing::Message() << "row " << row);
    const auto& pieces = p.pieces[size_t(row)];
    ASSERT_FALSE(pieces.empty());
    const int32_t* cu = p.cu_seqlens.data() + row * S1;
    int64_t at = 0, seg = 0;
    for (const PackedPiece& pc : pieces) {
      ASSERT_EQ(pc.start, at) << "pieces are contiguous from 0";
      ASSERT_GE(pc.length, 1);
      EXPECT_EQ(cu[seg++], pc.start);
      const auto& doc = docs[size_t(pc.doc)];
      for (int64_t i = 0; i < pc.length; ++i) {
        const int64_t src = pc.offset + i, dst = row * T + pc.start + i;
        ASSERT_EQ(p.tokens[size_t(dst)], doc[size_t(src)]);
        EXPECT_EQ(p.position_ids[size_t(dst)], i);
        const bool predicted = src + 1 < int64_t(doc.size()) &&
                               (masks.empty() || masks[size_t(pc.doc)][size_t(src + 1)]);
        // The target is the next token of the same document, or ignored.
        EXPECT_EQ(p.targets[size_t(dst)], predicted ? doc[size_t(src + 1)] : kIgnore);
      }
      by_doc[pc.doc].push_back(pc);
      at += pc.length;
      real += pc.length;
    }
    ASSERT_LE(at, T) << "row over seq_len";
    if (at < T) {
      EXPECT_EQ(cu[seg++], at) << "padding is its own segment";
    }
    for (int64_t t = at; t < T; ++t) {
      EXPECT_EQ(p.tokens[size_t(row * T + t)], opt.pad_id);
      EXPECT_EQ(p.targets[size_t(row * T + t)], kIgnore);
      EXPECT_EQ(p.position_ids[size_t(row * T + t)], t - at);
    }
    for (; seg < S1; ++seg) EXPECT_EQ(cu[seg], T);
    EXPECT_EQ(cu[0], 0);
  }
  EXPECT_EQ(real, p.real_tokens);
  EXPECT_DOUBLE_EQ(p.efficiency(), double(real) / double(p.n_rows * T));

  // Coverage: split places every token exactly once; truncate the first seq_len.
  int64_t dropped = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const int64_t len = int64_t(docs[d].size());
    const int64_t kept = opt.overlong == OverlongPolicy::Split ? len : std::min(len, T);
    dropped += len - kept;
    auto pieces = by_doc[int64_t(d)];
    std::sort(pieces.begin(), pieces.end(),
              [](const PackedPiece& a, const PackedPiece& b) { return a.offset < b.offset; });
    int64_t covered = 0;
    for (const PackedPiece& pc : pieces) {
      EXPECT_EQ(pc.offset, covered) << "document " << d;
      covered += pc.length;
    }
    EXPECT_EQ(covered, kept) << "document " << d;
  }
  EXPECT_EQ(dropped, p.dropped_tokens);
}

TEST(Packing, InvariantsHoldForEveryMode) {
  for (uint64_t seed = 0; seed < 3; ++seed)
    for (int64_t T : {1, 16, 100}) {
      const auto docs = random_docs(200, 3 * T, seed);
      for (auto alg :
           {PackAlgorithm::FirstFitDecreasing, PackAlgorithm::Sequential, PackAlgorithm::OnePerRow})
        for (auto ov : {OverlongPolicy::Split, OverlongPolicy::Truncate}) {
          SCOPED_TRACE(::testing::Message() << "seed " << seed << " T " << T << " alg " << int(alg)
                                            << " overlong " << int(ov));
          PackingOptions opt;
          opt.seq_len = T;
          opt.algorithm = alg;
          opt.overlong = ov;
          opt.pad_id = 7;
          check_packing(docs, opt, pack_documents(docs, opt));
        }
    }
}

// Unpacked: one piece per row, in input order.
TEST(Packing, OnePerRowKeepsEachPieceAlone) {
  const auto docs = random_docs(50, 40, 3);
  PackingOptions opt;
  opt.seq_len = 32;
  opt.algorithm = PackAlgorithm::OnePerRow;
  const PackedRows p = pack_documents(docs, opt);
  int64_t pieces = 0;
  for (const auto& row : p.pieces) {
    ASSERT_EQ(row.size(), 1u);
    EXPECT_EQ(row[0].start, 0);
    ++pieces;
  }
  EXPECT_EQ(pieces, p.n_rows);
  for (size_t r = 1; r < p.pieces.size(); ++r)
    EXPECT_LE(p.pieces[r - 1][0].doc, p.pieces[r][0].doc);
}

// First-fit-decreasing against the order-preserving greedy packer; FFD uses
// at most 11/9 OPT + 6/9 rows and OPT >= ceil(tokens / seq_len).
TEST(Packing, FirstFitDecreasingIsEfficient) {
  const auto docs = random_docs(2000, 2048, 42);
  PackingOptions opt;
  opt.seq_len = 2048;
  const PackedRows ffd = pack_documents(docs, opt);
  opt.algorithm = PackAlgorithm::Sequential;
  const PackedRows seq = pack_documents(docs, opt);
  const int64_t lower = (ffd.real_tokens + opt.seq_len - 1) / opt.seq_len;
  std::printf(
      "packing 2000 docs into rows of 2048: first-fit-decreasing %lld rows, %.2f%% "
      "efficiency; sequential %lld rows, %.2f%%; lower bound %lld rows\n",
      (long long)ffd.n_rows, 100 * ffd.efficiency(), (long long)seq.n_rows, 100 * seq.efficiency(),
      (long long)lower);
  RecordProperty("ffd_efficiency", std::to_string(ffd.efficiency()));
  EXPECT_EQ(ffd.real_tokens, seq.real_tokens);
  EXPECT_LE(ffd.n_rows, seq.n_rows);
  EXPECT_LE(double(ffd.n_rows), 11.0 / 9.0 * double(lower) + 1.0);
  EXPECT_GT(ffd.efficiency(), 0.95);
}

TEST(Packing, SmallExampleExactly) {
  // Lengths 3, 5, 2 into rows of 6, FFD: 5 opens row 0; 3 does not fit its
  // last slot and opens row 1; 2 joins row 1. Rows: {5 | pad 1}, {3, 2 | pad 1}.
  const std::vector<std::vector<int32_t>> docs = {{10, 11, 12}, {20, 21, 22, 23, 24}, {30, 31}};
  PackingOptions opt;
  opt.seq_len = 6;
  const PackedRows p = pack_documents(docs, opt);
  ASSERT_EQ(p.n_rows, 2);
  EXPECT_EQ(p.max_segments, 3);
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{20, 21, 22, 23, 24, 0, 10, 11, 12, 30, 31, 0}));
  EXPECT_EQ(p.targets, (std::vector<int32_t>{21, 22, 23, 24, kIgnore, kIgnore, 11, 12, kIgnore, 31,
                                             kIgnore, kIgnore}));
  EXPECT_EQ(p.position_ids, (std::vector<int32_t>{0, 1, 2, 3, 4, 0, 0, 1, 2, 0, 1, 0}));
  EXPECT_EQ(p.cu_seqlens, (std::vector<int32_t>{0, 5, 6, 6, 0, 3, 5, 6}));
  EXPECT_DOUBLE_EQ(p.efficiency(), 10.0 / 12.0);
}

TEST(Packing, SplitKeepsNextTokenTargetsAcrossPieces) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3, 4, 5, 6, 7}};
  PackingOptions opt;
  opt.seq_len = 3;
  const PackedRows p = pack_documents(docs, opt);
  ASSERT_EQ(p.n_rows, 3);  // pieces of 3, 3, 1
  EXPECT_EQ(p.tokens, (std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 0, 0}));
  EXPECT_EQ(p.targets, (std::vector<int32_t>{2, 3, 4, 5, 6, 7, kIgnore, kIgnore, kIgnore}));
  EXPECT_EQ(p.position_ids, (std::vector<int32_t>{0, 1, 2, 0, 1, 2, 0, 0, 1}));
  opt.overlong = OverlongPolicy::Truncate;
  const PackedRows t = pack_documents(docs, opt);
  EXPECT_EQ(t.n_rows, 1);
  EXPECT_EQ(t.targets, (std::vector<int32_t>{2, 3, 4}));
  EXPECT_EQ(t.dropped_tokens, 4);
}

TEST(Packing, LossMaskIgnoresUnpredictedTokens) {
  // SFT: prompt tokens (mask 0) are never targets; answer tokens are.
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3, 4, 5}, {6, 7, 8}};
  const std::vector<std::vector<uint8_t>> masks = {{0, 0, 1, 1, 1}, {0, 1, 1}};
  PackingOptions opt;
  opt.seq_len = 8;
  opt.algorithm = PackAlgorithm::Sequential;
  const PackedRows p = pack_documents(docs, opt, masks);
  EXPECT_EQ(p.targets, (std::vector<int32_t>{kIgnore, 3, 4, 5, kIgnore, 7, 8, kIgnore}));
  check_packing(docs, opt, p, masks);
  const std::vector<std::vector<uint8_t>> short_mask = {{0, 1}, {0, 1, 1}};
  EXPECT_THROW(pack_documents(docs, opt, short_mask), Error);
  EXPECT_THROW(pack_documents(docs, opt, std::span(masks).first(1)), Error);
  opt.seq_len = 0;
  EXPECT_THROW(pack_documents(docs, opt), Error);
}

TEST(Packing, FillBatchPadsBoundaryColumns) {
  const std::vector<std::vector<int32_t>> docs = {{1, 2, 3, 4}, {5, 6}, {7}, {8}};
  PackingOptions opt;
  opt.seq_len = 4;
  opt.algorithm = PackAlgorithm::Sequential;
  const PackedRows p = pack_documents(docs, opt);  // rows {4}, {2, 1, 1}
  ASSERT_EQ(p.n_rows, 2);
  Tensor tok = Tensor::empty({1, 4}, DType::I32), cu = Tensor::empty({1, 5}, DType::I32);
  p.fill_batch(1, tok, Tensor(), Tensor(), cu);
  EXPECT_EQ(std::vector<int32_t>(tok.data<int32_t>(), tok.data<int32_t>() + 4),
            (std::vector<int32_t>{5, 6, 7, 8}));
  EXPECT_EQ(std::vector<int32_t>(cu.data<int32_t>(), cu.data<int32_t>() + 5),
            (std::vector<int32_t>{0, 2, 3, 4, 4}));
  Tensor narrow = Tensor::empty({1, 3}, DType::I32);
  EXPECT_THROW(p.fill_batch(1, Tensor(), Tensor(), Tensor(), narrow), InternalError);
  EXPECT_NO_THROW(p.fill_batch(0, Tensor(), Tensor(), Tensor(), narrow));
}

}  // namespace
}  // namespace nk
