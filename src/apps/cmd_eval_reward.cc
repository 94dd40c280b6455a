// `nekton eval reward`: a reward model's scores of preference pairs, and its
// accuracy on them (the chosen sequence scored above the rejected one), as
// TRL's RewardTrainer evaluates and NeMo-Aligner reports; or its scores (an
// attribute model's, one per attribute) of (prompt, response) records.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "align/preference_data.h"
#include "align/reward_model.h"
#include "apps/commands.h"
#include "ckpt/model_io.h"
#include "core/atomic_file.h"
#include "core/config_bind.h"
#include "core/log.h"
#include "data/chat/chat_config.h"
#include "data/json_records.h"
#include "infer/model_source.h"

namespace nk {

namespace {

struct RewardEvalKeys {
  std::string model, data, tokenizer, chat_template, dtype = "f32", output;
  std::string response_key = "response";
  int64_t batch = 8, max_prompt_length = 0;
  PreferenceDataOptions opt;

  void bind(ConfigBinder& b) {
    b.bind("eval.model", model,
           "the reward model folder (nekton align align.method=rm's model/, or a Hugging Face "
           "*ForSequenceClassification imported with nekton import hf)");
    b.bind("eval.data", data,
           "preference JSONL (plain or zstd) as nekton align reads it: prompt/chosen/rejected as "
           "strings or chat message lists; or prompt/response records, each scored");
    b.bind("eval.tokenizer", tokenizer, "tokenizer (default: the one saved with the model)");
    b.bind("eval.chat_template", chat_template,
           "template for chat records (default: the model folder's own)");
    b.bind("eval.max_prompt_length", opt.max_prompt_length,
           "a pair longer than the model's max_seq_len keeps the last N tokens of its prompt "
           "(0: never cut; a prompt leaving no room is an error)");
    b.bind("eval.prompt_key", opt.prompt_key, "the prompt's key in a record");
    b.bind("eval.chosen_key", opt.chosen_key, "the chosen completion's key");
    b.bind("eval.rejected_key", opt.rejected_key, "the rejected completion's key");
    b.bind("eval.response_key", response_key,
           "the response's key in records without a chosen completion (scored one by one)");
    b.bind("eval.batch", batch, "sequences per forward");
    b.bind("eval.dtype", dtype, "compute precision: f32 or bf16");
    b.bind("eval.output", output,
           "also write the scores as JSONL: {\"line\", \"chosen\", \"rejected\"} per pair, "
           "{\"line\", \"score\"} per response (an attribute model: \"scores\" by name)");
  }
};

// Each (prompt, response) record scored: the count, each output's mean, and
// with eval.output each record's scores.
int score_responses(const RewardEvalKeys& k, const JsonRecords& f, const ModelConfig& mc,
                    const Tokenizer& tok, const ChatTemplate& tmpl, DType dtype,
                    bool allow_nonfinite) {
  const ChatSpecials specials = chat_specials(tok, k.model);
  const PreferenceRenderer r{tok, tmpl, specials};
  std::vector<std::vector<int32_t>> seqs;
  for (const JsonRecord& rec : f.records) {
    const nlohmann::json& prompt = record_field(f, rec, k.opt.prompt_key);
    const nlohmann::json& response = record_field(f, rec, k.response_key);
    seqs.push_back(render_sequence(prompt, response, r, f.where(rec, k.opt.prompt_key)));
    if (int64_t(seqs.back().size()) > mc.max_seq_len)
      fail("{}: {} tokens, more than the model's max_seq_len = {}", f.where(rec),
           seqs.back().size(), mc.max_seq_len);
  }
  std::unique_ptr<Transformer> model = load_model(k.model, dtype, allow_nonfinite);
  const std::vector<std::vector<float>> s = score_sequences(*model, seqs, k.batch);
  const int64_t n = int64_t(seqs.size()), L = mc.num_labels;
  auto name = [&](int64_t j) {
    return mc.labels.empty() ? fmt::format("LABEL_{}", j) : mc.labels[size_t(j)];
  };
  std::vector<double> mean(static_cast<size_t>(L), 0.0);
  std::string jsonl;
  for (int64_t i = 0; i < n; ++i) {
    nlohmann::ordered_json j = {{"line", f.records[size_t(i)].line}};
    if (L == 1) {
      j["score"] = s[size_t(i)][0];
    } else {
      nlohmann::ordered_json by = nlohmann::ordered_json::object();
      for (int64_t l = 0; l < L; ++l) by[name(l)] = s[size_t(i)][size_t(l)];
      j["scores"] = by;
    }
    for (int64_t l = 0; l < L; ++l) mean[size_t(l)] += s[size_t(i)][size_t(l)] / double(n);
    jsonl += j.dump() + "\n";
  }
  fmt::print("responses {}\n", n);
  for (int64_t l = 0; l < L; ++l)
    fmt::print("mean {} {:.6f}\n", L == 1 ? std::string("score") : name(l), mean[size_t(l)]);
  if (!k.output.empty()) write_file_atomic(k.output, jsonl);
  return 0;
}

}  // namespace

int eval_reward(const CommandArgs& a) {
  ConfigSchema schema = schema_of([](ConfigBinder& b) { RewardEvalKeys().bind(b); });
  if (a.help) {
    fmt::print(
        "usage: nekton eval reward eval.model=DIR eval.data=PAIRS.jsonl [key=value ...]\n\n"
        "Scores each pair's chosen and rejected sequences with a reward model (a sequence\n"
        "classifier: its score at each sequence's last token) and prints the accuracy (the\n"
        "fraction of pairs whose chosen sequence scores higher) and the mean margin. Records\n"
        "with a response instead of chosen/rejected are each scored (an attribute model:\n"
        "one score per attribute) and the mean printed.\n\n{}",
        schema.help());
    return 0;
  }
  Config c = Config::load(schema, a.config_path, a.overrides);
  RewardEvalKeys k;
  {
    ConfigReader r(c);
    k.bind(r);
  }
  if (k.model.empty()) fail("eval.model: no reward model folder given (eval.model=DIR)");
  if (k.data.empty()) fail("eval.data: no preference or response JSONL given (eval.data=FILE)");
  if (k.batch <= 0) fail("eval.batch: must be positive, got {}", k.batch);
  if (k.opt.max_prompt_length < 0)
    fail("eval.max_prompt_length: must be >= 0, got {}", k.opt.max_prompt_length);
  const DType dtype = parse_dtype(k.dtype);
  // Everything is read and checked before the weights.
  ModelConfig mc;
  try {
    mc = read_model_config(k.model);
  } catch (const Error& e) {
    throw e.with_context("eval.model");
  }
  if (!mc.classifier())
    fail(
        "eval.model: '{}' is a causal LM, not a reward model (a sequence classifier: nekton "
        "align align.method=rm trains one)",
        k.model);
  const std::unique_ptr<Tokenizer> tok =
      load_model_tokenizer(k.tokenizer, k.model, "eval.tokenizer");
  const auto tmpl = chat_template_if_any(k.chat_template, k.model, "eval.chat_template");
  JsonRecords f;
  try {
    f = read_json_records(k.data);
  } catch (const Error& e) {
    throw e.with_context("eval.data");
  }
  if (!f.records[0].value.contains(k.opt.chosen_key)) {
    try {
      return score_responses(k, f, mc, *tok, *tmpl, dtype, a.allow_nonfinite);
    } catch (const Error& e) {
      throw e.with_context("eval.data");
    }
  }
  if (mc.num_labels != 1)
    fail("eval.model: '{}' has {} outputs; pairs are ranked by a reward model's one", k.model,
         mc.num_labels);
  k.opt.max_length = mc.max_seq_len;
  PreferenceData d;
  try {
    d = read_preference_jsonl(k.data, *tok, *tmpl, chat_specials(*tok, k.model), k.opt);
  } catch (const Error& e) {
    throw e.with_context("eval.data");
  }
  if (d.truncated > 0) NK_WARN("{} (longer than the model's max_seq_len)", d.summary());
  std::unique_ptr<Transformer> model = load_model(k.model, dtype, a.allow_nonfinite);
  const std::vector<std::vector<float>> s = score_sequences(*model, d.tokens, k.batch);
  const int64_t n = d.examples();
  double correct = 0, margin = 0, chosen = 0, rejected = 0;
  std::string jsonl;
  for (int64_t i = 0; i < n; ++i) {
    const double c1 = s[size_t(2 * i)][0], r1 = s[size_t(2 * i + 1)][0];
    correct += c1 > r1;
    margin += c1 - r1;
    chosen += c1;
    rejected += r1;
    jsonl +=
        nlohmann::json{{"line", d.line[size_t(i)]}, {"chosen", c1}, {"rejected", r1}}.dump() + "\n";
  }
  fmt::print(
      "pairs {}\naccuracy {:.4f}\nmean margin {:.6f}\nmean chosen reward {:.6f}\nmean rejected "
      "reward {:.6f}\n",
      n, correct / double(n), margin / double(n), chosen / double(n), rejected / double(n));
  if (!k.output.empty()) write_file_atomic(k.output, jsonl);
  return 0;
}

}  // namespace nk
