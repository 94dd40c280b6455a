// Quality classifiers: training from labelled JSONL (train_quality_classifier
// and `nekton curate train-classifier`), and the classifier stage's threshold
// and Pareto modes. The data: English fortunes as "hq", the same words
// shuffled and garbled as "lq".
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "apps/commands.h"
#include "curate/classify/classifier_train.h"
#include "curate/classify/fasttext_model.h"
#include "curate/classify/fasttext_stages.h"
#include "curate/stages.h"
#include "data/utf8.h"
#include "test_util.h"

#include "curate/stage_util.h"

namespace nk::curate {
namespace {

using namespace nk::test;
namespace fs = std::filesystem;

const char* kFortunes = "/usr/share/games/fortunes";

// English fortunes of at least 40 bytes, one line each, in file order.
std::vector<std::string> english_fortunes(size_t max_n) {
  std::vector<std::string> out;
  for (const char* name :
       {"fortunes",   "literature",    "wisdom",    "people",    "science",   "politics",
        "work",       "love",          "education", "humorists", "computers", "law",
        "medicine",   "pets",          "sports",    "food",      "art",       "news",
        "platitudes", "miscellaneous", "men-women"}) {
    std::string raw = read_file(std::string(kFortunes) + "/" + name);
    if (find_invalid_utf8(raw) >= 0) continue;
    std::string cur;
    std::istringstream in(raw);
    std::string line;
    while (std::getline(in, line)) {
      if (line != "%") {
        for (char c : line)
          if ((unsigned char)c >= 0x20) cur.push_back(c);
        cur.push_back(' ');
        continue;
      }
      if (cur.size() >= 40) out.push_back(cur);
      cur.clear();
      if (out.size() == max_n) return out;
    }
  }
  return out;
}

// Low-quality text: the words of `text` shuffled, and half of them spelled
// backwards (garbling that recurs across documents, as OCR noise or
// mojibake does, so that a bag of words can learn it).
std::string garble(const std::string& text, std::mt19937& rng) {
  std::vector<std::string> words;
  std::istringstream in(text);
  for (std::string w; in >> w;) words.push_back(w);
  std::shuffle(words.begin(), words.end(), rng);
  std::string out;
  for (std::string& w : words) {
    bool ascii = std::all_of(w.begin(), w.end(), [](char c) { return (c & 0x80) == 0; });
    if (rng() % 2 && ascii) std::reverse(w.begin(), w.end());
    out += w + " ";
  }
  return out;
}

struct Corpus {
  std::vector<std::string> hq, lq;
};

// Documents of two consecutive fortunes each.
const Corpus& corpus() {
  static const Corpus c = [] {
    Corpus c;
    std::vector<std::string> f = english_fortunes(6000);
    for (size_t i = 0; i + 1 < f.size(); i += 2) c.hq.push_back(f[i] + f[i + 1]);
    std::mt19937 rng(11);
    for (size_t i = 0; i < c.hq.size(); ++i)
      c.lq.push_back(garble(c.hq[(i + 1) % c.hq.size()], rng));
    return c;
  }();
  return c;
}

std::string jsonl(const Corpus& c, const nlohmann::json& hq_label, const nlohmann::json& lq_label) {
  std::string out;
  for (size_t i = 0; i < c.hq.size(); ++i) {
    out += nlohmann::json{{"id", i}, {"text", c.hq[i]}, {"label", hq_label}}.dump() + "\n";
    out += nlohmann::json{{"text", c.lq[i]}, {"label", lq_label}}.dump() + "\n";
  }
  return out;
}

ClassifierTrainOptions small_options(const std::string& in, const std::string& out) {
  ClassifierTrainOptions o;
  o.input = in;
  o.output = out;
  o.epoch = 10;  // a few thousand short documents: more passes than fastText's 5
  o.dim = 32;
  o.bucket = 100000;
  return o;
}

// One model for the stage tests, trained once.
const std::string& trained_model() {
  static TempDir dir("nk_classifier_model");
  static const std::string path = [] {
    write_file(dir / "train.jsonl", jsonl(corpus(), "hq", "lq"));
    train_quality_classifier(small_options(dir / "train.jsonl", dir / "quality.bin"));
    return dir / "quality.bin";
  }();
  return path;
}

// Documents across the score range: clean, garbled and half-garbled.
std::vector<Document> mixed_docs(size_t n) {
  std::vector<Document> docs;
  std::mt19937 rng(3);
  const Corpus& c = corpus();
  for (size_t i = 0; i < n; ++i) {
    const std::string& hq = c.hq[(i * 7) % c.hq.size()];
    std::string text = i % 3 == 0   ? hq
                       : i % 3 == 1 ? c.lq[(i * 5) % c.lq.size()]
                                    : hq.substr(0, hq.size() / 2) + " " + garble(hq, rng);
    docs.push_back({fmt::format("doc-{}", i), text});
  }
  return docs;
}

TEST(Classifier, TrainsAndSeparatesHeldOutDocuments) {
  NK_REQUIRE_ASSET(corpus().hq.size() >= 2500, "English fortunes (package fortunes)");
  TempDir dir("nk_classifier");
  write_file(dir / "train.jsonl", jsonl(corpus(), "hq", "lq"));
  ClassifierTrainOptions o = small_options(dir / "train.jsonl", dir / "model.bin");
  ClassifierTrainReport r = train_quality_classifier(o);
  std::printf("%s", format_train_report(o, r).c_str());
  int64_t total = int64_t(2 * corpus().hq.size());
  EXPECT_EQ(r.train_docs + r.valid_docs, total);
  EXPECT_NEAR(double(r.valid_docs) / double(total), 0.1, 0.02);
  EXPECT_GE(r.accuracy, 0.95);
  ASSERT_EQ(r.metrics.size(), 2u);
  for (const LabelMetrics& m : r.metrics) {
    EXPECT_GE(m.f1, 0.95) << m.label;
    EXPECT_GT(m.support, 0) << m.label;
  }
  EXPECT_EQ(dir.files(), (std::vector<std::string>{"model.bin", "train.jsonl"}));
  FastTextModel model(dir / "model.bin");
  EXPECT_EQ(model.labels().size(), 2u);
  EXPECT_GE(model.label_index("__label__hq"), 0);

  // One thread: the same model bit for bit.
  o.output = dir / "again.bin";
  train_quality_classifier(o);
  EXPECT_TRUE(read_file(dir / "model.bin") == read_file(dir / "again.bin"));
}

TEST(Classifier, ThresholdModeKeepsScoresAtOrAboveTheThreshold) {
  NK_REQUIRE_ASSET(corpus().hq.size() >= 2500, "English fortunes (package fortunes)");
  FastTextModel model(trained_model());
  int hq = model.label_index("__label__hq");
  std::vector<Document> docs = mixed_docs(300);
  std::vector<double> scores;
  for (auto& d : docs) scores.push_back(model.label_prob(d.text, hq));
  // A threshold equal to a measured score (rounded as the meta is): that
  // document and every higher one stay.
  std::vector<double> sorted = scores;
  std::sort(sorted.begin(), sorted.end());
  double t = std::round(sorted[sorted.size() / 2] * 1e4) / 1e4;
  auto stage = test_stage::make_stage(fmt::format(
      "type: classifier\nmodel: {}\nlabel: hq\nthreshold: {}\nscore_key: q", trained_model(), t));
  int kept = 0, removed = 0;
  Counters counts;
  auto t0 = std::chrono::steady_clock::now();
  int64_t bytes = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    Document d = docs[i];
    bytes += int64_t(d.text.size());
    stage->apply(d, counts);
  }
  double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("classifier stage on one thread: %.0f docs/s, %.2f MB/s (%zu docs, %.0f kB)\n",
              double(docs.size()) / sec, double(bytes) / sec / 1e6, docs.size(),
              double(bytes) / 1e3);
  for (size_t i = 0; i < docs.size(); ++i) {
    Verdict v = stage->apply(docs[i], counts);
    EXPECT_NEAR(docs[i].meta["q"].get<double>(), scores[i], 1e-4);
    EXPECT_EQ(v.keep, scores[i] >= t) << scores[i] << " vs " << t;
    if (!v.keep) {
      EXPECT_TRUE(contains(v.reason, fmt::format("q {:.4f} < {}", scores[i], t))) << v.reason;
      ++removed;
    } else {
      ++kept;
    }
  }
  EXPECT_GT(kept, 100);
  EXPECT_GT(removed, 100);
  // Clean fortunes score high, garbled ones low (mixed_docs alternates them).
  double clean = 0, garbled = 0;
  for (size_t i = 0; i + 2 < scores.size(); i += 3) {
    clean += scores[i] / double(scores.size() / 3);
    garbled += scores[i + 1] / double(scores.size() / 3);
  }
  EXPECT_GT(clean, 0.8);
  EXPECT_LT(garbled, 0.2);
}

TEST(Classifier, ParetoDrawFollowsTheLomaxDistribution) {
  // P(draw > x) = (1 + x)^-alpha, as numpy.random.pareto, which NeMo uses.
  for (double alpha : {1.0, 3.0}) {
    const int n = 200000;
    std::vector<double> xs = {0.05, 0.3, 1.0, 3.0};
    std::vector<int> above(xs.size(), 0);
    for (int i = 0; i < n; ++i) {
      double d = pareto_draw(fmt::format("id-{}", i), 9, alpha);
      ASSERT_GE(d, 0);
      for (size_t j = 0; j < xs.size(); ++j) above[j] += d > xs[j];
    }
    for (size_t j = 0; j < xs.size(); ++j) {
      double p = std::pow(1 + xs[j], -alpha);
      EXPECT_NEAR(double(above[j]) / n, p, 4 * std::sqrt(p * (1 - p) / n) + 1e-4)
          << "alpha " << alpha << " x " << xs[j];
    }
  }
  EXPECT_EQ(pareto_draw("a", 1, 3), pareto_draw("a", 1, 3));
  EXPECT_NE(pareto_draw("a", 1, 3), pareto_draw("a", 2, 3));
  EXPECT_NE(pareto_draw("a", 1, 3), pareto_draw("b", 1, 3));
}

TEST(Classifier, ParetoModeIsDeterministicAndKeepsTheExpectedFraction) {
  NK_REQUIRE_ASSET(corpus().hq.size() >= 2500, "English fortunes (package fortunes)");
  std::string yaml =
      fmt::format("type: classifier\nmodel: {}\nmode: pareto\nseed: 7\n", trained_model());
  auto stage = test_stage::make_stage(yaml);
  std::vector<Document> docs = mixed_docs(3000);
  Counters counts;
  std::vector<char> serial(docs.size());
  double expected = 0, var = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    Document d = docs[i];
    Verdict v = stage->apply(d, counts);
    serial[i] = v.keep;
    double s = d.meta["quality_score"].get<double>();
    double p = std::pow(2 - s, -3.0);  // P(pareto(3) > 1 - s)
    expected += p;
    var += p * (1 - p);
    if (!v.keep) {
      EXPECT_TRUE(contains(v.reason, "pareto(alpha 3) draw")) << v.reason;
    }
  }
  int64_t kept = std::count(serial.begin(), serial.end(), 1);
  std::printf("pareto alpha 3: kept %lld of %zu, expected %.1f +- %.1f\n", (long long)kept,
              docs.size(), expected, std::sqrt(var));
  EXPECT_NEAR(double(kept), expected, 4 * std::sqrt(var));
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, int64_t(docs.size()));

  // A new stage, four threads, each document visited in a different order:
  // the same decisions.
  auto again = test_stage::make_stage(yaml);
  std::vector<char> parallel(docs.size(), 2);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      Counters c;
      for (size_t k = 0; k < docs.size(); ++k) {
        size_t i = docs.size() - 1 - k;
        if (i % 4 != size_t(t)) continue;
        Document d = docs[i];
        parallel[i] = again->apply(d, c).keep;
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_TRUE(parallel == serial);

  // Another seed gives other draws.
  auto other = test_stage::make_stage(
      fmt::format("type: classifier\nmodel: {}\nmode: pareto\nseed: 8\n", trained_model()));
  int differ = 0;
  for (size_t i = 0; i < docs.size(); ++i) {
    Document d = docs[i];
    differ += other->apply(d, counts).keep != serial[i];
  }
  EXPECT_GT(differ, 0);
}

TEST(Classifier, StageConfigErrorsNameTheKey) {
  NK_REQUIRE_ASSET(corpus().hq.size() >= 2500, "English fortunes (package fortunes)");
  const std::string& m = trained_model();
  std::string e = error_of([] { test_stage::make_stage("type: classifier\nthreshold: 0.5\n"); });
  EXPECT_TRUE(contains(e, "stage 1 (classifier): missing key 'model'")) << e;
  e = error_of([&] {
    test_stage::make_stage(fmt::format("type: classifier\nmodel: {}\nlabel: good\n", m));
  });
  EXPECT_TRUE(contains(e, "key 'label'")) << e;
  EXPECT_TRUE(contains(e, "no label 'good' (its labels: hq, lq)")) << e;
  e = error_of(
      [&] { test_stage::make_stage(fmt::format("type: classifier\nmodel: {}\nmode: top\n", m)); });
  EXPECT_TRUE(contains(e, "key 'mode': expected threshold or pareto, got 'top'")) << e;
  e = error_of(
      [&] { test_stage::make_stage(fmt::format("type: classifier\nmodel: {}\nalpha: 2\n", m)); });
  EXPECT_TRUE(contains(e, "key 'alpha': applies only to mode: pareto")) << e;
  e = error_of([&] {
    test_stage::make_stage(fmt::format("type: classifier\nmodel: {}\nmode: pareto\nalpha: 0\n", m));
  });
  EXPECT_TRUE(contains(e, "key 'alpha': must be a positive number")) << e;
  e = error_of([&] {
    test_stage::make_stage(fmt::format("type: classifier\nmodel: {}\nthreshold: 2\n", m));
  });
  EXPECT_TRUE(contains(e, "key 'threshold': must be in [0, 1]")) << e;

  TempDir dir("nk_classifier");
  std::string bytes = read_file(m);
  write_file(dir / "cut.bin", bytes.substr(0, bytes.size() / 2));
  e = error_of([&] {
    test_stage::make_stage(fmt::format("type: classifier\nmodel: {}\n", dir / "cut.bin"));
  });
  EXPECT_TRUE(contains(e, "pipeline.yaml:2: stage 1 (classifier): key 'model': fastText model"))
      << e;
  EXPECT_TRUE(contains(e, "cut.bin': truncated")) << e;
}

TEST(Classifier, BadTrainingInputIsAClearErrorAndLeavesNothing) {
  TempDir dir("nk_classifier");
  std::string good =
      "{\"text\": \"a fine sentence\", \"label\": \"hq\"}\n"
      "{\"text\": \"sentence fine a\", \"label\": \"lq\"}\n";
  struct Case {
    std::string name, content, want;
  };
  std::vector<Case> cases = {
      {"json", good + "{\"text\": \"oops\", \"label\": \n", "json.jsonl:3: invalid JSON"},
      {"notobj", good + "[1, 2]\n", "notobj.jsonl:3: expected a JSON object, got array"},
      {"notext", "{\"label\": \"hq\"}\n" + good, "notext.jsonl:1: missing field 'text'"},
      {"nolabel", good + "\n{\"text\": \"x\"}\n", "nolabel.jsonl:4: missing field 'label'"},
      {"textnum", good + "{\"text\": 5, \"label\": \"hq\"}\n",
       "textnum.jsonl:3: field 'text' must be a string, got number"},
      {"labelobj", good + "{\"text\": \"x\", \"label\": {}}\n",
       "labelobj.jsonl:3: field 'label' must be a string or a number, got object"},
      {"space", good + "{\"text\": \"x\", \"label\": \"high q\"}\n",
       "space.jsonl:3: label 'high q' (field 'label') contains whitespace"},
      {"single", "{\"text\": \"a b\", \"label\": \"hq\"}\n{\"text\": \"c d\", \"label\": \"hq\"}\n",
       "single.jsonl:1-2: every record has label 'hq'; a classifier needs at least two labels"},
      {"empty", "\n\n", "empty.jsonl: no records to train on"},
      {"utf8", good + "{\"text\": \"bad \xff byte\", \"label\": \"hq\"}\n",
       "utf8.jsonl:3: invalid JSON"},
  };
  for (const Case& c : cases) {
    std::string in = dir / (c.name + ".jsonl");
    write_file(in, c.content);
    std::string e = error_of([&] { train_quality_classifier(small_options(in, dir / "out.bin")); });
    EXPECT_TRUE(contains(e, c.want)) << c.name << ": " << e;
  }
  std::string e =
      error_of([&] { train_quality_classifier(small_options(dir / "nope.jsonl", dir / "o.bin")); });
  EXPECT_TRUE(contains(e, "nope.jsonl")) << e;
  e = error_of([&] {
    write_file(dir / "ok.jsonl", good);
    train_quality_classifier(small_options(dir / "ok.jsonl", dir / "no/such/dir/m.bin"));
  });
  EXPECT_TRUE(contains(e, "does not exist")) << e;
  // Only the inputs are left: no model, no temporary files.
  for (const std::string& f : dir.files()) EXPECT_TRUE(f.ends_with(".jsonl")) << f;
}

TEST(Classifier, CommandLineTrainsFromZstdWithNumericLabels) {
  NK_REQUIRE_ASSET(corpus().hq.size() >= 2500, "English fortunes (package fortunes)");
  TempDir dir("nk_classifier");
  write_file(dir / "train.jsonl", jsonl(corpus(), 1, 0));
  ASSERT_EQ(run_command(fmt::format("zstd -q -f '{}' -o '{}'", dir / "train.jsonl",
                                    dir / "train.jsonl.zst"))
                .code,
            0);
  EXPECT_EQ(cmd_curate_train_classifier({"train-classifier", "--help"}), 0);
  std::vector<std::string> args = {"train-classifier",
                                   "--input",
                                   dir / "train.jsonl.zst",
                                   "--output",
                                   dir / "num.bin",
                                   "--dim",
                                   "16",
                                   "--bucket",
                                   "50000",
                                   "--epoch",
                                   "5",
                                   "--valid-fraction",
                                   "0.2",
                                   "--seed",
                                   "3"};
  EXPECT_EQ(cmd_curate_train_classifier(args), 0);
  FastTextModel model(dir / "num.bin");
  EXPECT_GE(model.label_index("__label__1"), 0);
  EXPECT_GE(model.label_index("__label__0"), 0);
  auto stage = test_stage::make_stage(
      fmt::format("type: classifier\nmodel: {}\nlabel: 1\n", dir / "num.bin"));
  Document d{"x", corpus().hq[5]};
  Counters c;
  EXPECT_TRUE(stage->apply(d, c).keep);

  std::string e = error_of([&] {
    cmd_curate_train_classifier({"train-classifier", "--inptu", "x"});
  });
  EXPECT_TRUE(contains(e, "--inptu")) << e;
  e = error_of([&] { cmd_curate_train_classifier({"train-classifier", "--input", "x.jsonl"}); });
  EXPECT_TRUE(contains(e, "--input and --output are required")) << e;
  e = error_of([&] {
    cmd_curate_train_classifier(
        {"--input", dir / "train.jsonl", "--output", dir / "e.bin", "--epoch", "five"});
  });
  EXPECT_TRUE(contains(e, "--epoch")) << e;
  e = error_of([&] {
    cmd_curate_train_classifier(
        {"--input", dir / "train.jsonl", "--output", dir / "e.bin", "--valid-fraction", "1"});
  });
  EXPECT_TRUE(contains(e, "--valid-fraction: must be in [0, 1)")) << e;
  EXPECT_FALSE(fs::exists(dir / "e.bin"));
}

}  // namespace
}  // namespace nk::curate
