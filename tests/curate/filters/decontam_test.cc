// Decontamination: drop and cut modes, the n-gram boundary, case and
// punctuation, short samples, benchmark file errors naming file:line.
#include "curate/filters/decontam.h"

#include <gtest/gtest.h>

#include <string>

#include "curate/stages.h"
#include "test_util.h"

#include "curate/stage_util.h"

namespace nk::curate {
namespace {

using nk::test::contains;
using nk::test::error_of;
using nk::test::TempDir;
using nk::test::write_file;

// 19 words.
const char* kSample =
    "The quick brown fox jumps over the lazy dog while the farmer watches from the old red "
    "barn door";

struct Out {
  Verdict v;
  std::string text;
  Counters counts;
};

Out run(const DocStage& s, const std::string& text) {
  Document d;
  d.text = text;
  Out o;
  o.v = s.apply(d, o.counts);
  o.text = d.text;
  return o;
}

class Decontam : public ::testing::Test {
 protected:
  void SetUp() override {
    bench_ = dir_ / "bench.jsonl";
    write_file(bench_, std::string("{\"text\": \"") + kSample + "\", \"label\": 1}\n" +
                           "\n{\"text\": \"Short five word sample here.\"}\n");
  }
  std::string yaml(const std::string& extra = "") const {
    return "{type: decontaminate, benchmarks: [" + bench_ + "]" + extra + "}";
  }
  TempDir dir_{"nk_decontam"};
  std::string bench_;
};

TEST_F(Decontam, DropsOnA13GramIgnoringCaseAndPunctuation) {
  auto s = test_stage::make_stage(yaml(), 2);
  Out o = run(*s,
              "Intro. THE QUICK, brown fox -- jumps over the \"lazy\" dog; while the farmer "
              "watches. Then something else.");
  EXPECT_FALSE(o.v.keep);
  EXPECT_TRUE(contains(o.v.reason, "13-gram of " + bench_ + ":1:")) << o.v.reason;
  EXPECT_TRUE(contains(o.v.reason, "\"THE QUICK brown fox")) << o.v.reason;
  EXPECT_EQ(o.counts["contaminated"], 1);
  // 12 words of the sample and then another word: no 13-gram in common.
  o = run(*s, "the quick brown fox jumps over the lazy dog while the farmer sings all day");
  EXPECT_TRUE(o.v.keep);
  EXPECT_EQ(o.counts.count("contaminated"), 0u);
  // Exactly 13 words, the last 13 of the sample; then only 12 of them.
  EXPECT_FALSE(run(*s, "the lazy dog while the farmer watches from the old red barn door").v.keep);
  EXPECT_TRUE(run(*s, "lazy dog while the farmer watches from the old red barn door").v.keep);
}

TEST_F(Decontam, ShortSamplesAreOneNgramOfTheirOwnLength) {
  auto s = test_stage::make_stage(yaml(), 2);
  Out o = run(*s, "We read: short five-word sample, here! And more.");
  EXPECT_FALSE(o.v.keep);
  EXPECT_TRUE(contains(o.v.reason, "5-gram of " + bench_ + ":3:")) << o.v.reason;
  EXPECT_TRUE(run(*s, "a short five word sample there").v.keep);
  // n: 5 makes every 5-gram of the long sample count.
  auto five = test_stage::make_stage(yaml(", n: 5"), 2);
  EXPECT_FALSE(run(*five, "see the old red barn door").v.keep);
  EXPECT_TRUE(run(*five, "see the old red barn").v.keep);
}

TEST_F(Decontam, PlainTextBenchmarksAndTextKey) {
  std::string txt = dir_ / "bench.txt";
  write_file(txt, "first sample line with several words in it\n\nsecond one is also here\n");
  auto s = test_stage::make_stage("{type: decontaminate, n: 4, benchmarks: [" + txt + "]}", 2);
  Out o = run(*s, "... SECOND one is also ...");
  EXPECT_FALSE(o.v.keep);
  EXPECT_TRUE(contains(o.v.reason, txt + ":3:")) << o.v.reason;
  std::string q = dir_ / "q.jsonl";
  write_file(q, "{\"question\": \"what is the capital city of france\"}\n");
  auto k = test_stage::make_stage(
      "{type: decontaminate, n: 4, text_key: question, benchmarks: [" + q + "]}", 2);
  EXPECT_FALSE(run(*k, "So, what is the capital?").v.keep);
}

std::string sentences(const std::string& tag, int n) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += "This is " + tag + " sentence number " + std::to_string(i) + ". ";
  return s;
}

TEST_F(Decontam, CutRemovesTheMatchWithContextToSentenceEnds) {
  auto s = test_stage::make_stage(yaml(", mode: cut"), 2);
  std::string before = sentences("opening", 20), after = sentences("closing", 20);
  std::string doc = before + "Here " + kSample + " stands. " + after;
  Out o = run(*s, doc);
  ASSERT_TRUE(o.v.keep) << o.v.reason;
  EXPECT_EQ(o.counts["contaminated"], 1);
  EXPECT_FALSE(contains(o.text, "quick brown"));
  EXPECT_FALSE(contains(o.text, "barn door"));
  // Two pieces: the start and the end of the document, whole sentences.
  size_t gap = o.text.find("\n\n");
  ASSERT_NE(gap, std::string::npos);
  std::string first = o.text.substr(0, gap), last = o.text.substr(gap + 2);
  EXPECT_TRUE(before.starts_with(first)) << first;
  EXPECT_TRUE(after.ends_with(last + " ")) << last;
  EXPECT_EQ(first.back(), '.');
  // At least cut_context (200) characters went on each side of the match.
  EXPECT_LE(first.size() + 200, before.size() + 5);  // "Here " precedes the match
  EXPECT_LE(last.size() + 200, after.size() + 9);    // " stands. " follows it
  EXPECT_GE(first.size(), 200u);
  EXPECT_GE(last.size(), 200u);

  // A match at the very start leaves one piece.
  Out head = run(*s, std::string(kSample) + ". " + after);
  ASSERT_TRUE(head.v.keep) << head.v.reason;
  EXPECT_EQ(head.text.find("\n\n"), std::string::npos);
  EXPECT_TRUE(after.ends_with(head.text + " "));

  // Pieces shorter than min_document_length go; none left removes the document.
  auto strict = test_stage::make_stage(yaml(", mode: cut, min_document_length: 2000"), 2);
  Out gone = run(*strict, doc);
  EXPECT_FALSE(gone.v.keep);
  EXPECT_TRUE(contains(gone.v.reason, "nothing long enough left")) << gone.v.reason;
  EXPECT_EQ(gone.text, doc);
  auto one = test_stage::make_stage(yaml(", mode: cut, max_splits: 1"), 2);
  Out split = run(*one, doc);
  EXPECT_FALSE(split.v.keep);
  EXPECT_TRUE(contains(split.v.reason, "2 pieces > max_splits 1")) << split.v.reason;
}

TEST_F(Decontam, CutMergesNearbyMatches) {
  auto s = test_stage::make_stage(yaml(", mode: cut"), 2);
  std::string before = sentences("opening", 20), after = sentences("closing", 20);
  std::string doc = before + kSample + ". Between. " + kSample + ". " + after;
  Out o = run(*s, doc);
  ASSERT_TRUE(o.v.keep) << o.v.reason;
  EXPECT_FALSE(contains(o.text, "Between"));
  EXPECT_EQ(o.text.find("\n\n"), o.text.rfind("\n\n"));  // two pieces, one gap
}

TEST_F(Decontam, BadBenchmarkFilesNameFileAndLine) {
  std::string missing = dir_ / "nope.jsonl";
  std::string e = error_of(
      [&] { test_stage::make_stage("{type: decontaminate, benchmarks: [" + missing + "]}", 2); });
  EXPECT_TRUE(contains(e, "key 'benchmarks'") && contains(e, missing) &&
              contains(e, "does not exist"))
      << e;
  std::string bad = dir_ / "bad.jsonl";
  write_file(bad, "{\"text\": \"fine\"}\n{\"text\": \"fine too\"}\n{\"text\": broken\n");
  e = error_of(
      [&] { test_stage::make_stage("{type: decontaminate, benchmarks: [" + bad + "]}", 2); });
  EXPECT_TRUE(contains(e, bad + ":3: malformed JSON")) << e;
  write_file(bad, "{\"question\": \"no text here\"}\n");
  e = error_of(
      [&] { test_stage::make_stage("{type: decontaminate, benchmarks: [" + bad + "]}", 2); });
  EXPECT_TRUE(contains(e, bad + ":1: no string field 'text'")) << e;
  write_file(bad, "\n\n");
  e = error_of(
      [&] { test_stage::make_stage("{type: decontaminate, benchmarks: [" + bad + "]}", 2); });
  EXPECT_TRUE(contains(e, "has no samples")) << e;
  e = error_of([&] {
    test_stage::make_stage("{type: decontaminate, benchmarks: [" + dir_.path().string() + "]}", 2);
  });
  EXPECT_TRUE(contains(e, "is not a file")) << e;
  e = error_of([&] {
    test_stage::make_stage("type: decontaminate\nbenchmarks: [" + bench_ + "]\nmode: erase\n", 2);
  });
  EXPECT_TRUE(contains(e, "pipeline.yaml:3: stage 2 (decontaminate): key 'mode'") &&
              contains(e, "'erase'"))
      << e;
  e = error_of([&] { test_stage::make_stage("{type: decontaminate}", 2); });
  EXPECT_TRUE(contains(e, "key 'benchmarks'")) << e;
}

}  // namespace
}  // namespace nk::curate
