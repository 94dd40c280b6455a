// Incremental deduplication (dedup_state.h): a run given the state an earlier
// run saved removes from its documents exactly what one run over the old and
// the new documents together removes from the new ones, reasons included,
// also over a chain of runs; a state for other settings or a damaged one is
// refused naming the folder, the file or the setting.
#include "curate/dedup/dedup_state.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "core/parallel.h"
#include "curate/dedup/dedup.h"
#include "curate/dedup/gcide_docs.h"
#include "curate/stage_util.h"
#include "test_util.h"

namespace nk::curate {
namespace {

namespace fs = std::filesystem;
using nk::test::contains;
using nk::test::error_of;
using nk::test::TempDir;
using test_docs::edit_words;
using test_docs::gcide_docs;

// One stage run as the pipeline runner drives it: begin, batches, finish,
// save into a work folder, publish. `extra` adds keys (load_state: ...).
std::vector<Removal> run(const std::string& yaml, const std::vector<Document>& docs,
                         size_t batch = 53) {
  TempDir work("nk_dedup_state_work");
  auto stage = test_stage::make_global_stage(yaml);
  stage->begin((work / "spill"));
  for (size_t at = 0; at < docs.size(); at += batch) {
    std::vector<Document> b(docs.begin() + long(at),
                            docs.begin() + long(std::min(docs.size(), at + batch)));
    stage->add_batch(at, b);
  }
  Counters c;
  auto out = stage->finish(c);
  fs::create_directories(work / "keep");
  stage->save((work / "keep"));
  stage->publish((work / "keep"));
  return out;
}

std::vector<Document> named(const std::string& prefix, const std::vector<std::string>& texts) {
  std::vector<Document> docs;
  for (size_t i = 0; i < texts.size(); ++i)
    docs.push_back({fmt::format("{}{}", prefix, i), texts[i]});
  return docs;
}

// What the joint run over crawls[0..] removes from crawl `k`, renumbered
// from 0 within it.
std::vector<Removal> joint_removals_of(const std::string& yaml,
                                       const std::vector<std::vector<Document>>& crawls, size_t k) {
  std::vector<Document> all;
  uint64_t first = 0;
  for (size_t c = 0; c < crawls.size(); ++c) {
    if (c == k) first = all.size();
    all.insert(all.end(), crawls[c].begin(), crawls[c].end());
  }
  std::vector<Removal> out;
  for (Removal& r : run(yaml, all))
    if (r.index >= first && r.index < first + crawls[k].size())
      out.push_back({r.index - first, r.reason});
  return out;
}

void expect_same(const std::vector<Removal>& got, const std::vector<Removal>& want,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].index, want[i].index) << what << " removal " << i;
    EXPECT_EQ(got[i].reason, want[i].reason) << what << " removal " << i;
  }
}

// Three crawls from one pool of GCIDE documents: each has near-duplicates
// (1-3% of words edited) and exact copies of its own and of earlier crawls'
// documents, and documents of its own.
std::vector<std::vector<Document>> crawls() {
  auto pool = gcide_docs(900, 300);
  std::mt19937_64 rng(11);
  std::vector<std::vector<std::string>> texts(3);
  for (size_t c = 0; c < 3; ++c) {
    for (size_t i = 0; i < 200; ++i) texts[c].push_back(pool[c * 300 + i]);
    for (size_t i = 0; i < 120; ++i) {
      // Bases from this crawl's or any earlier crawl's pool part.
      size_t from = rng() % (c + 1), base = from * 300 + rng() % 200;
      double rate = (rng() % 4) * 0.01;  // 0 (exact copy), 1, 2 or 3% edited
      texts[c].push_back(rate == 0 ? pool[base] : edit_words(pool[base], rate, rng));
    }
    std::shuffle(texts[c].begin(), texts[c].end(), rng);
  }
  return {named("a", texts[0]), named("b", texts[1]), named("c", texts[2])};
}

void check_chain(const std::string& stage_yaml, size_t at_least) {
  auto cs = crawls();
  TempDir dir("nk_dedup_state");
  const std::string a = (dir / "after_a"), b = (dir / "after_b");
  run(stage_yaml + "save_state: " + a + "\n", cs[0]);
  auto rm_b = run(stage_yaml + "load_state: " + a + "\nsave_state: " + b + "\n", cs[1]);
  auto rm_c = run(stage_yaml + "load_state: " + b + "\n", cs[2], 71);
  auto want_b = joint_removals_of(stage_yaml, {cs[0], cs[1]}, 1);
  auto want_c = joint_removals_of(stage_yaml, {cs[0], cs[1], cs[2]}, 2);
  // The planted duplicates are found at all: of 120 per crawl, a quarter
  // exact copies.
  EXPECT_GE(want_b.size(), at_least);
  EXPECT_GE(want_c.size(), at_least);
  expect_same(rm_b, want_b, stage_yaml + " crawl b against a");
  expect_same(rm_c, want_c, stage_yaml + " crawl c against a+b");
  // Duplicates of earlier crawls name a document of that crawl.
  bool names_a = false;
  for (const Removal& r : rm_c) names_a |= contains(r.reason, "'a");
  EXPECT_TRUE(names_a);
}

TEST(DedupState, ExactChainEqualsOneJointRun) {
  check_chain("type: exact_dedup\n", 20);
}

TEST(DedupState, FuzzyChainEqualsOneJointRun) {
  check_chain("type: fuzzy_dedup\n", 80);
}

TEST(DedupState, FuzzyWithJaccardCheckChainEqualsOneJointRun) {
  check_chain("type: fuzzy_dedup\njaccard_threshold: 0.8\n", 80);
}

TEST(DedupState, FuzzyFinewebAndSpillingChainEqualsOneJointRun) {
  // Spilled partitions, split again when read back, and one thread.
  const int saved = num_threads();
  set_num_threads(1);
  check_chain("type: fuzzy_dedup\npreset: fineweb\nmemory_mb: 0.02\npartitions: 3\n", 80);
  set_num_threads(saved);
}

// A later copy joins a cluster of an earlier crawl: the reason names the
// cluster's lowest document and counts the old members too.
TEST(DedupState, ClusterSizesCountTheOldDocuments) {
  auto pool = gcide_docs(2, 400);
  ASSERT_EQ(pool.size(), 2u);
  const std::string& x = pool[0];
  std::vector<Document> a = named("a", {pool[1], x, x + " ."});
  std::vector<Document> b = named("b", {"unrelated text of its own", x + " !"});
  TempDir dir("nk_dedup_state");
  const std::string st = (dir / "s");
  const std::string yaml = "type: fuzzy_dedup\n";
  run(yaml + "save_state: " + st + "\n", a);
  auto got = run(yaml + "load_state: " + st + "\n", b);
  expect_same(got, joint_removals_of(yaml, {a, b}, 1), "cluster sizes");
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].index, 1u);
  EXPECT_EQ(got[0].reason, "near-duplicate of 'a1' (cluster of 3)");
}

std::string write_state(const std::string& yaml, const std::string& dir) {
  auto cs = crawls();
  run(yaml + "save_state: " + dir + "\n", cs[0]);
  return dir;
}

TEST(DedupState, StateForOtherSettingsIsRefusedNamingTheSetting) {
  TempDir dir("nk_dedup_state");
  const std::string fz = write_state("type: fuzzy_dedup\n", (dir / "fz"));
  const std::string ex = write_state("type: exact_dedup\n", (dir / "ex"));
  auto load = [&](const std::string& yaml) {
    return error_of([&] { run(yaml, named("n", {"some text"})); });
  };
  std::string e = load("type: exact_dedup\nload_state: " + fz + "\n");
  EXPECT_TRUE(contains(e, "saved by fuzzy_dedup")) << e;
  EXPECT_TRUE(contains(e, fz)) << e;
  e = load("type: fuzzy_dedup\nnum_bands: 10\nload_state: " + fz + "\n");
  EXPECT_TRUE(contains(e, "num_bands 20")) << e;
  e = load("type: fuzzy_dedup\njaccard_threshold: 0.5\nload_state: " + fz + "\n");
  EXPECT_TRUE(contains(e, "jaccard_threshold")) << e;
  e = load("type: exact_dedup\nnormalize: false\nload_state: " + ex + "\n");
  EXPECT_TRUE(contains(e, "normalize true")) << e;
  // A folder that is not there is the stage key's error, before any run.
  e = error_of(
      [&] { test_stage::make_global_stage("type: exact_dedup\nload_state: " + (dir / "none")); });
  EXPECT_TRUE(contains(e, "load_state")) << e;
  EXPECT_TRUE(contains(e, "no such folder")) << e;
}

TEST(DedupState, DamagedStateIsRefusedNamingTheFile) {
  TempDir dir("nk_dedup_state");
  const std::string yaml = "type: fuzzy_dedup\njaccard_threshold: 0.8\n";
  auto fresh = [&](const std::string& name) { return write_state(yaml, dir / name); };
  auto load = [&](const std::string& st) {
    return error_of([&] { run(yaml + "load_state: " + st + "\n", named("n", {"some text"})); });
  };
  // Cut records.bin short.
  std::string st = fresh("cut");
  fs::resize_file(st + "/records.bin", fs::file_size(st + "/records.bin") - 5);
  std::string e = load(st);
  EXPECT_TRUE(contains(e, "records.bin")) << e;
  // No state.json: a save that never finished.
  st = fresh("nohead");
  fs::remove(st + "/state.json");
  e = load(st);
  EXPECT_TRUE(contains(e, "no state.json")) << e;
  // state.json that is not JSON.
  st = fresh("badjson");
  test::write_file(st + "/state.json", "{\"format\": ");
  e = load(st);
  EXPECT_TRUE(contains(e, "state.json")) << e;
  // ids.idx whose offsets run past ids.bin.
  st = fresh("ids");
  fs::resize_file(st + "/ids.bin", 3);
  e = load(st);
  EXPECT_TRUE(contains(e, "ids.idx")) << e;
  // A shingle-set log with one entry too few.
  st = fresh("sets");
  fs::resize_file(st + "/sets.idx", fs::file_size(st + "/sets.idx") - 8);
  e = load(st);
  EXPECT_TRUE(contains(e, "sets.idx")) << e;
  // nodes.bin cut.
  st = fresh("nodes");
  fs::resize_file(st + "/nodes.bin", fs::file_size(st + "/nodes.bin") - 8);
  e = load(st);
  EXPECT_TRUE(contains(e, "nodes.bin")) << e;
}

TEST(DedupState, SaveReplacesAnOlderStateWhole) {
  TempDir dir("nk_dedup_state");
  const std::string st = (dir / "s");
  auto cs = crawls();
  run("type: exact_dedup\nsave_state: " + st + "\n", cs[0]);
  std::string first = test::read_file(st + "/state.json");
  // The same folder loaded and saved: it grows by crawl b.
  run("type: exact_dedup\nload_state: " + st + "\nsave_state: " + st + "\n", cs[1]);
  std::string second = test::read_file(st + "/state.json");
  EXPECT_NE(first, second);
  EXPECT_TRUE(contains(second, "\"documents\": 640")) << second;
  for (auto& e : fs::directory_iterator(dir.path()))
    EXPECT_EQ(e.path().filename(), "s") << "left behind: " << e.path();
}

TEST(NodeSet, RanksKeepDocumentOrder) {
  NodeSet s(200);
  for (uint64_t i : {3, 64, 65, 199, 0, 127}) s.add(i);
  s.rank();
  EXPECT_EQ(s.count(), 6u);
  EXPECT_EQ(s.node(0), 0u);
  EXPECT_EQ(s.node(3), 1u);
  EXPECT_EQ(s.node(64), 2u);
  EXPECT_EQ(s.node(65), 3u);
  EXPECT_EQ(s.node(127), 4u);
  EXPECT_EQ(s.node(199), 5u);
  EXPECT_FALSE(s.has(1));
}

}  // namespace
}  // namespace nk::curate
