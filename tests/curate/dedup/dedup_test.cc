#include "curate/dedup/dedup.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/parallel.h"
#include "curate/dedup/union_find.h"
#include "curate/stages.h"
#include "test_util.h"

#include "curate/dedup/gcide_docs.h"

#include "curate/stage_util.h"

namespace nk::curate {
namespace {

using nk::test::contains;
using nk::test::error_of;
using nk::test::TempDir;

using test_docs::edit_words;
using test_docs::gcide_docs;

std::vector<Document> as_docs(const std::vector<std::string>& texts) {
  std::vector<Document> docs;
  for (size_t i = 0; i < texts.size(); ++i) docs.push_back({fmt::format("d{}", i), texts[i]});
  return docs;
}

std::vector<Removal> run_stage(const std::string& yaml, const std::vector<Document>& docs,
                               Counters* counts = nullptr, size_t batch = 97) {
  TempDir tmp("nk_dedup");
  auto stage = test_stage::make_global_stage(yaml);
  stage->begin(tmp.path().string());
  for (size_t at = 0; at < docs.size(); at += batch) {
    std::vector<Document> b(docs.begin() + long(at),
                            docs.begin() + long(std::min(docs.size(), at + batch)));
    stage->add_batch(at, b);
  }
  Counters local;
  return stage->finish(counts ? *counts : local);
}

bool same(const std::vector<Removal>& a, const std::vector<Removal>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].index != b[i].index || a[i].reason != b[i].reason) return false;
  return true;
}

// Clusters (root -> members, root included) from fuzzy_dedup's reasons; docs
// are named "d<index>".
std::map<uint64_t, std::vector<uint64_t>> clusters_of(const std::vector<Removal>& rm) {
  std::map<uint64_t, std::vector<uint64_t>> c;
  for (const Removal& r : rm) {
    size_t q = r.reason.find("'d");
    uint64_t root = std::stoull(r.reason.substr(q + 2));
    if (c[root].empty()) c[root].push_back(root);
    c[root].push_back(r.index);
  }
  return c;
}

using Pair = std::pair<uint32_t, uint32_t>;

// Every pair with Jaccard >= t, exactly: a similarity self-join with prefix
// filtering (tokens ordered rarest first; two sets with J >= t must share a
// token among the first |s| - ceil(t|s|) + 1 of each).
std::map<Pair, double> similar_pairs(const std::vector<std::vector<uint32_t>>& sets, double t) {
  std::unordered_map<uint32_t, uint32_t> df;
  for (auto& s : sets)
    for (uint32_t x : s) ++df[x];
  std::unordered_map<uint32_t, std::vector<uint32_t>> index;
  std::map<Pair, double> out;
  for (uint32_t i = 0; i < sets.size(); ++i) {
    std::vector<std::pair<uint32_t, uint32_t>> order;  // (document frequency, token)
    for (uint32_t x : sets[i]) order.push_back({df[x], x});
    std::sort(order.begin(), order.end());
    size_t prefix = order.size() - size_t(std::ceil(t * double(order.size()))) + 1;
    prefix = std::min(prefix, order.size());
    std::vector<uint32_t> cand;
    for (size_t k = 0; k < prefix; ++k) {
      std::vector<uint32_t>& posting = index[order[k].second];
      cand.insert(cand.end(), posting.begin(), posting.end());
      posting.push_back(i);
    }
    std::sort(cand.begin(), cand.end());
    cand.erase(std::unique(cand.begin(), cand.end()), cand.end());
    for (uint32_t j : cand) {
      double jac = jaccard(sets[j].data(), sets[j].size(), sets[i].data(), sets[i].size());
      if (jac >= t) out[{j, i}] = jac;
    }
  }
  return out;
}

struct Quality {
  double recall, precision, expected_recall, expected_precision, slack_r, slack_p;
  size_t truth, detected;
};

// Pair-level recall and precision of the clusters against exact Jaccard >= t,
// and what the LSH S-curve P(J) = 1 - (1 - J^r)^b predicts for them.
Quality measure(const std::vector<Removal>& rm, const std::map<Pair, double>& sim, double t,
                const MinHashParams& p) {
  std::set<Pair> detected;
  for (auto& [root, m] : clusters_of(rm))
    for (size_t a = 0; a < m.size(); ++a)
      for (size_t b = 0; b < m.size(); ++b)
        if (m[a] < m[b]) detected.insert({uint32_t(m[a]), uint32_t(m[b])});
  auto s_curve = [&](double j) {
    return 1 - std::pow(1 - std::pow(j, p.rows_per_band), p.num_bands);
  };
  double tp_exp = 0, fp_exp = 0, var_r = 0;
  size_t truth = 0, hit = 0;
  for (auto& [pair, j] : sim) {
    double pr = s_curve(j);
    if (j >= t) {
      ++truth, tp_exp += pr, var_r += pr * (1 - pr);
      hit += detected.count(pair);
    } else {
      fp_exp += pr;
    }
  }
  Quality q;
  q.truth = truth;
  q.detected = detected.size();
  q.recall = truth ? double(hit) / double(truth) : 1;
  q.precision = detected.empty() ? 1 : double(hit) / double(detected.size());
  q.expected_recall = truth ? tp_exp / double(truth) : 1;
  q.expected_precision = tp_exp / (tp_exp + fp_exp);
  q.slack_r = 4 * std::sqrt(var_r) / double(std::max<size_t>(truth, 1)) + 0.02;
  q.slack_p = 4 * std::sqrt(fp_exp) / std::max(1.0, tp_exp + fp_exp) + 0.03;
  return q;
}

// ~2000 documents: 1400 distinct GCIDE texts of >= 400 characters, 560 of them
// with one near-copy at a known word-edit rate, in a shuffled order.
std::vector<std::string> planted_corpus() {
  auto base = gcide_docs(1400, 400);
  EXPECT_EQ(base.size(), 1400u);
  const double rates[] = {0.005, 0.01, 0.02, 0.03, 0.05, 0.10, 0.20, 0.30};
  std::mt19937_64 rng(2024);
  std::vector<std::string> all = base;
  for (size_t i = 0; i < 560 && i < base.size(); ++i)
    all.push_back(edit_words(base[i], rates[i % 8], rng));
  std::shuffle(all.begin(), all.end(), rng);
  return all;
}

void check_planted(const std::string& preset, double jaccard_threshold) {
  auto texts = planted_corpus();
  auto docs = as_docs(texts);
  MinHashParams p;
  ASSERT_TRUE(minhash_preset(preset, p));
  MinHasher h(p);
  std::vector<std::vector<uint32_t>> sets(texts.size());
  for (size_t i = 0; i < texts.size(); ++i) {
    h.shingles(texts[i], sets[i]);
    sort_unique(sets[i]);
  }
  // Pairs below 0.3 have P(candidate) < 1e-5 under either preset.
  auto sim = similar_pairs(sets, 0.3);
  const double t = 0.8;
  Counters counts;
  auto rm = run_stage(fmt::format("type: fuzzy_dedup\npreset: {}\njaccard_threshold: {}\n", preset,
                                  jaccard_threshold),
                      docs, &counts);
  Quality q = measure(rm, sim, t, p);
  std::printf(
      "[ fuzzy %s jaccard_threshold=%.1f ] %zu docs, %zu true pairs (J>=%.1f), %zu detected: "
      "recall %.3f (S-curve %.3f), precision %.3f (S-curve %.3f); clusters %lld, candidate "
      "pairs %lld, rejected %lld\n",
      preset.c_str(), jaccard_threshold, texts.size(), q.truth, t, q.detected, q.recall,
      q.expected_recall, q.precision, q.expected_precision, (long long)counts["clusters"],
      (long long)counts["candidate_pairs"], (long long)counts["pairs_rejected_by_jaccard"]);
  // Recall at J>=0.8 by bands of J, to show the S-curve.
  for (double lo : {0.3, 0.5, 0.7, 0.8, 0.9}) {
    double hi = lo == 0.3 ? 0.5 : lo == 0.5 ? 0.7 : lo == 0.7 ? 0.8 : lo == 0.8 ? 0.9 : 1.01;
    size_t n = 0, got = 0;
    std::set<Pair> det;
    for (auto& [root, m] : clusters_of(rm))
      for (uint64_t a : m)
        for (uint64_t b : m)
          if (a < b) det.insert({uint32_t(a), uint32_t(b)});
    for (auto& [pair, j] : sim)
      if (j >= lo && j < hi) ++n, got += det.count(pair);
    std::printf("    J in [%.1f, %.1f): %zu pairs, %zu detected\n", lo, std::min(hi, 1.0), n, got);
  }
  ASSERT_GE(q.truth, 100u);  // the corpus must plant enough high-J pairs to judge
  EXPECT_GE(q.recall, q.expected_recall - q.slack_r);
  if (jaccard_threshold > 0) {
    // Every union was checked at 0.8 against the bucket's first member; the
    // clusters here are pairs, so almost nothing below 0.8 can be detected.
    EXPECT_GE(q.precision, 0.97);
  } else {
    EXPECT_GE(q.precision, q.expected_precision - q.slack_p);
  }
}

TEST(DedupFuzzy, PlantedNearDuplicatesNemo) {
  check_planted("nemo", 0);
}

TEST(DedupFuzzy, PlantedNearDuplicatesNemoWithJaccardCheck) {
  check_planted("nemo", 0.8);
}

TEST(DedupFuzzy, PlantedNearDuplicatesFineweb) {
  check_planted("fineweb", 0);
}

TEST(DedupFuzzy, SameResultWhateverSpillBudgetAndThreads) {
  auto base = gcide_docs(500, 300);
  std::mt19937_64 rng(5);
  std::vector<std::string> texts = base;
  for (size_t i = 0; i < 300; ++i) texts.push_back(edit_words(base[i % 150], 0.01, rng));
  std::shuffle(texts.begin(), texts.end(), rng);
  auto docs = as_docs(texts);
  const int saved = num_threads();
  Counters c_mem, c_spill, c_one;
  auto in_memory = run_stage("type: fuzzy_dedup\njaccard_threshold: 0.7\n", docs, &c_mem);
  // 20 KB: 800 docs x 20 bands x 16 bytes = 256 KB spill many times over and
  // every partition is split again when read back.
  auto spilled =
      run_stage("type: fuzzy_dedup\njaccard_threshold: 0.7\nmemory_mb: 0.02\npartitions: 5\n", docs,
                &c_spill, 31);
  set_num_threads(1);
  auto one_thread =
      run_stage("type: fuzzy_dedup\njaccard_threshold: 0.7\nmemory_mb: 0.05\n", docs, &c_one, 200);
  set_num_threads(saved);
  EXPECT_GT(in_memory.size(), 200u);
  EXPECT_TRUE(same(in_memory, spilled));
  EXPECT_TRUE(same(in_memory, one_thread));
  EXPECT_EQ(c_mem["candidate_pairs"], c_spill["candidate_pairs"]);
  EXPECT_EQ(c_mem["pairs_rejected_by_jaccard"], c_one["pairs_rejected_by_jaccard"]);
  EXPECT_GT(c_spill["bytes_spilled"], 256000);
  // Three or more copies of one base make clusters larger than two.
  bool big = false;
  for (const Removal& r : in_memory) big |= contains(r.reason, "(cluster of 3)");
  EXPECT_TRUE(big);
}

TEST(DedupFuzzy, EmptyAndMegabyteDocuments) {
  std::string big;
  for (const std::string& d : gcide_docs(6000, 500)) big += d;
  big.resize(std::min<size_t>(big.size(), size_t(3) << 20));
  ASSERT_GT(big.size(), size_t(2) << 20);
  std::mt19937_64 rng(9);
  std::string big_edit = edit_words(big, 0.002, rng);
  auto docs = as_docs({"", big, "short text", "", big_edit, "another short text"});
  for (const char* yaml : {"type: fuzzy_dedup\n", "type: fuzzy_dedup\npreset: fineweb\n",
                           "type: fuzzy_dedup\njaccard_threshold: 0.8\nmemory_mb: 0.01\n"}) {
    auto rm = run_stage(yaml, docs);
    ASSERT_EQ(rm.size(), 2u) << yaml;
    EXPECT_EQ(rm[0].index, 3u);
    EXPECT_EQ(rm[0].reason, "near-duplicate of 'd0' (cluster of 2)");
    EXPECT_EQ(rm[1].index, 4u);
    EXPECT_EQ(rm[1].reason, "near-duplicate of 'd1' (cluster of 2)");
  }
  Counters c;
  EXPECT_TRUE(run_stage("type: fuzzy_dedup\n", {}, &c).empty());
}

TEST(DedupExact, NormalizedDuplicatesKeepTheFirst) {
  auto docs = as_docs({"Hello  World", "hello world", " HELLO\tworld\n", "Hello World!",
                       "Grüße AUS Köln", "grüße aus köln", "", "", "Hello\u00a0world"});
  auto rm = run_stage("type: exact_dedup\n", docs);
  ASSERT_EQ(rm.size(), 5u);
  EXPECT_EQ(rm[0].index, 1u);
  EXPECT_EQ(rm[0].reason, "exact duplicate of 'd0'");
  EXPECT_EQ(rm[1].index, 2u);
  EXPECT_EQ(rm[1].reason, "exact duplicate of 'd0'");
  EXPECT_EQ(rm[2].index, 5u);
  EXPECT_EQ(rm[2].reason, "exact duplicate of 'd4'");
  EXPECT_EQ(rm[3].index, 7u);
  EXPECT_EQ(rm[3].reason, "exact duplicate of 'd6'");
  EXPECT_EQ(rm[4].index, 8u);  // a no-break space is white space
  EXPECT_EQ(rm[4].reason, "exact duplicate of 'd0'");

  auto raw = run_stage("type: exact_dedup\nnormalize: false\n", docs);
  ASSERT_EQ(raw.size(), 1u);
  EXPECT_EQ(raw[0].index, 7u);
}

TEST(DedupExact, SpillingAndThreadsGiveTheSameResult) {
  auto pool = gcide_docs(400, 100);
  std::mt19937_64 rng(3);
  std::vector<std::string> texts;
  for (int i = 0; i < 3000; ++i) texts.push_back(pool[rng() % pool.size()]);
  texts.push_back(std::string(3 << 20, 'x'));  // a 3 MB document, twice
  texts.push_back(std::string(3 << 20, 'x'));
  auto docs = as_docs(texts);
  Counters c_mem, c_spill;
  auto in_memory = run_stage("type: exact_dedup\n", docs, &c_mem);
  const int saved = num_threads();
  set_num_threads(1);
  auto one = run_stage("type: exact_dedup\n", docs);
  set_num_threads(2);
  // 2 KB of 24-byte records: spills every ~85 documents; partitions split.
  auto spilled =
      run_stage("type: exact_dedup\nmemory_mb: 0.002\npartitions: 3\n", docs, &c_spill, 50);
  set_num_threads(saved);
  ASSERT_EQ(in_memory.size(),
            3000u - std::set<std::string>(texts.begin(), texts.end() - 2).size() + 1);
  EXPECT_TRUE(same(in_memory, one));
  EXPECT_TRUE(same(in_memory, spilled));
  EXPECT_GT(c_spill["bytes_spilled"], 3000 * 24);
  EXPECT_EQ(c_mem["duplicate_groups"], c_spill["duplicate_groups"]);
  EXPECT_EQ(in_memory.back().index, 3001u);
  EXPECT_EQ(in_memory.back().reason, "exact duplicate of 'd3000'");
  // Each removed text equals the kept one's, which comes first.
  for (const Removal& r : in_memory) {
    uint64_t kept = std::stoull(r.reason.substr(r.reason.find("'d") + 2));
    EXPECT_LT(kept, r.index);
    EXPECT_EQ(texts[kept], texts[r.index]);
  }
}

TEST(DedupConfig, BadValuesNameTheKey) {
  auto err = [](const std::string& yaml) {
    return error_of([&] { test_stage::make_global_stage(yaml); });
  };
  std::string e = err("type: fuzzy_dedup\nnum_bands: 0\n");
  EXPECT_TRUE(contains(e, "pipeline.yaml:2") && contains(e, "num_bands") && contains(e, "1.."))
      << e;
  e = err("type: fuzzy_dedup\npreset: nemotron\n");
  EXPECT_TRUE(contains(e, "preset") && contains(e, "nemotron") && contains(e, "fineweb")) << e;
  e = err("type: fuzzy_dedup\njaccard_threshold: 1.5\n");
  EXPECT_TRUE(contains(e, "jaccard_threshold")) << e;
  e = err("type: fuzzy_dedup\nchar_ngrams: 5\nword_ngrams: 3\n");
  EXPECT_TRUE(contains(e, "word_ngrams")) << e;
  e = err("type: exact_dedup\nmemory_mb: lots\n");
  EXPECT_TRUE(contains(e, "memory_mb") && contains(e, "lots")) << e;
  e = err("type: exact_dedup\nmemory_mb: -1\n");
  EXPECT_TRUE(contains(e, "memory_mb")) << e;
  e = err("type: exact_dedup\nnormalise: true\n");
  EXPECT_TRUE(contains(e, "normalise")) << e;
  // Overrides on top of a preset.
  StageConfig c(YAML::Load("type: fuzzy_dedup\npreset: fineweb\nnum_bands: 9\nchar_ngrams: 10\n"),
                "p.yaml", 1);
  FuzzyDedupOptions o = fuzzy_dedup_options(c);
  EXPECT_EQ(o.minhash.num_bands, 9);
  EXPECT_EQ(o.minhash.rows_per_band, 8);
  EXPECT_EQ(o.minhash.kind, ShingleKind::kChars);
  EXPECT_EQ(o.minhash.ngram, 10);
}

TEST(UnionFind, ConcurrentUnionsLeaveTheSmallestIndexAsRoot) {
  const uint32_t n = 200000;
  std::mt19937_64 rng(1);
  std::vector<Pair> edges;
  for (int i = 0; i < 150000; ++i) {
    uint32_t a = uint32_t(rng() % n), b = uint32_t((a + rng() % 50) % n);
    edges.push_back({a, b});
  }
  // Reference: sequential, then the smallest member of each component.
  std::vector<uint32_t> ref(n);
  for (uint32_t i = 0; i < n; ++i) ref[i] = i;
  auto find = [&](uint32_t x) {
    while (ref[x] != x) x = ref[x] = ref[ref[x]];
    return x;
  };
  for (auto [a, b] : edges) {
    uint32_t ra = find(a), rb = find(b);
    if (ra != rb) ref[std::max(ra, rb)] = std::min(ra, rb);
  }
  const int saved = num_threads();
  set_num_threads(4);
  ParallelUnionFind uf(n);
  parallel_for(int64_t(edges.size()), 1000, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) uf.unite(edges[size_t(i)].first, edges[size_t(i)].second);
  });
  set_num_threads(saved);
  size_t roots = 0;
  for (uint32_t i = 0; i < n; ++i) {
    ASSERT_EQ(uf.find(i), find(i)) << i;
    ASSERT_LE(uf.find(i), i);
    roots += uf.find(i) == i;
  }
  EXPECT_GT(roots, 100u);
  EXPECT_LT(roots, n / 2);
  EXPECT_FALSE(uf.unite(5, 5));
  EXPECT_TRUE(contains(error_of([] { ParallelUnionFind big(uint64_t(1) << 33); }), "4294967295"));
}

}  // namespace
}  // namespace nk::curate
