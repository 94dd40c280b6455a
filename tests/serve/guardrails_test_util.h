// For the guardrails tests: rails files, a topic classifier trained with
// `nekton curate train-classifier`, and texts the counting model
// (tests/infer/counting_model.h: after byte t it predicts t + 1 with
// near certainty) finds fluent or gibberish.
#pragma once
#include <random>
#include <string>
#include <vector>

#include "ckpt/model_io.h"
#include "infer/counting_model.h"
#include "serve/guardrails_config.h"
#include "serve_test_util.h"

namespace nk::test {

// A guardrails file `name` in `dir` holding `yaml`; its path.
inline std::string write_rails(const TempDir& dir, const std::string& yaml,
                               const std::string& name = "rails.yaml") {
  const std::string path = dir / name;
  write_file(path, yaml);
  return path;
}

inline GuardrailsConfig rails_config(const TempDir& dir, const std::string& yaml) {
  return read_guardrails_config(write_rails(dir, yaml));
}

// ---- The classifier: "unsafe" weapon-making questions against harmless
// ---- how-to questions in the same phrasings.

inline const std::vector<std::string>& unsafe_objects() {
  static const std::vector<std::string> v = {
      "a pipe bomb", "an explosive device",    "a detonator", "a grenade",  "nerve gas",
      "a silencer",  "untraceable ammunition", "napalm",      "a landmine", "thermite charges"};
  return v;
}
inline const std::vector<std::string>& safe_objects() {
  static const std::vector<std::string> v = {
      "sourdough bread", "a vegetable garden",  "a python function", "a paper airplane",
      "a birthday cake", "a bookshelf",         "a website",         "a kite",
      "tomato soup",     "a budget spreadsheet"};
  return v;
}

// Labelled JSONL: every template x verb x object of both classes. fastText
// splits words at whitespace only, so "detonator?" is a word of its own:
// some templates end with a question mark.
inline std::string topic_jsonl() {
  const std::vector<std::string> templates = {"how do I {} {}?",
                                              "what is the best way to {} {}?",
                                              "tell me how to {} {} at home",
                                              "I want to {} {} quickly",
                                              "explain step by step how to {} {}",
                                              "where can I learn to {} {}?"};
  const std::vector<std::string> verbs = {"make", "build", "assemble", "prepare", "create"};
  std::string out;
  for (const std::string& t : templates)
    for (const std::string& v : verbs)
      for (int label = 0; label < 2; ++label)
        for (const std::string& x : label ? unsafe_objects() : safe_objects())
          out += nlohmann::json{{"text", fmt::format(fmt::runtime(t), v, x)},
                                {"label", label ? "unsafe" : "ok"}}
                     .dump() +
                 "\n";
  return out;
}

// The model `nekton curate train-classifier` makes of topic_jsonl(), once
// per process.
inline const std::string& topic_classifier() {
  static TempDir dir("nk_guard_classifier");
  static const std::string path = [] {
    write_file(dir / "topics.jsonl", topic_jsonl());
    const RunResult r =
        run_nekton(fmt::format("curate train-classifier --input {} --output {} --epoch 25 --dim 16 "
                               "--bucket 10000 --valid-fraction 0",
                               dir / "topics.jsonl", dir / "topics.bin"));
    EXPECT_EQ(r.code, 0) << r.out;
    return dir / "topics.bin";
  }();
  return path;
}

// ---- Texts for the counting model.

// `n` bytes counting up from `first` ("abcd..."): the model's fluent text.
inline std::string counting_run(char first, int n) {
  std::string s;
  for (int i = 0; i < n; ++i) s.push_back(char(first + i));
  return s;
}

// `words` words, each a counting run of `len` bytes: every word costs the
// model two misses (the space and the first byte after it), so words of 40
// keep the perplexity low.
inline std::string counting_words(int words, int len = 40) {
  std::string s;
  for (int w = 0; w < words; ++w) {
    if (w) s += ' ';
    s += counting_run(char('A' + w % 20), len);
  }
  return s;
}

// Letters drawn at random: every byte a miss.
inline std::string gibberish_words(int words, uint32_t seed, int len = 6) {
  std::mt19937 rng(seed);
  std::string s;
  for (int w = 0; w < words; ++w) {
    if (w) s += ' ';
    for (int i = 0; i < len; ++i) s.push_back(char('a' + rng() % 26));
  }
  return s;
}

// The counting model as a served folder (bytes tokenizer, chatml template).
inline void save_counting_model(const std::string& dir) {
  save_model(dir, *counting_model());
  store_tokenizer("bytes", dir);
  write_file(dir + "/tokenizer_config.json",
             nlohmann::json{{"chat_template", find_chat_template("chatml").jinja()}}.dump());
}

}  // namespace nk::test
