// `nekton align align.method=steerlm`: NeMo-Aligner's SteerLM. Records
// {prompt, response, attribute values} (HelpSteer's attribute-named keys, or
// NeMo's label string "helpfulness:4,...") become attribute-conditioned SFT
// data (align/steerlm.h), values a record lacks filled by an attribute model;
// then the SFT pass, and steerlm.json beside the trained model so `nekton
// generate generate.steerlm_attributes=...` conditions as training did.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <optional>

#include "align/prompt_records.h"
#include "align/reward_scoring.h"
#include "apps/cmd_align_sampling.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "data/chat/chat_config.h"
#include "data/chat/sft_data.h"

namespace nk {

namespace {

namespace fs = std::filesystem;

struct SteerRecord {
  nlohmann::json prompt;
  std::string response;
  std::vector<std::optional<int64_t>> values;
};

// A record's values: its label string (under label_key) or attribute-named
// keys; a name in neither is nullopt.
std::vector<std::optional<int64_t>> record_values(const JsonRecords& f, const JsonRecord& r,
                                                  const SteerLmSpec& spec,
                                                  const std::string& label_key) {
  const auto label = r.value.find(label_key);
  if (label != r.value.end() && !label->is_null()) {
    if (!label->is_string())
      fail("{}: must be a label string \"name:value,...\", not {}", f.where(r, label_key),
           label->type_name());
    return parse_attribute_string(spec, label->get<std::string>(), f.where(r, label_key), true);
  }
  std::vector<std::optional<int64_t>> v(spec.names.size());
  for (size_t k = 0; k < spec.names.size(); ++k) {
    const auto it = r.value.find(spec.names[k]);
    if (it == r.value.end() || it->is_null()) continue;
    const std::string at = f.where(r, spec.names[k]);
    if (!it->is_number() || !std::isfinite(it->get<double>()) ||
        it->get<double>() != std::floor(it->get<double>()))
      fail("{}: must be an integer, not {}", at, it->dump());
    const int64_t x = int64_t(it->get<double>());
    if (x < spec.min_value || x > spec.max_value)
      fail("{}: {} is outside [{}, {}] (align.steerlm_min, align.steerlm_max)", at, x,
           spec.min_value, spec.max_value);
    v[k] = x;
  }
  return v;
}

// Fills every missing value from the attribute model's scores.
int64_t fill_values(std::vector<SteerRecord>& recs, const JsonRecords& f, const SteerLmSpec& spec,
                    const RewardScorer& am, const std::string& prompt_key) {
  std::vector<size_t> label_of(spec.names.size());
  const std::vector<std::string>& labels = am.labels();
  for (size_t k = 0; k < spec.names.size(); ++k) {
    if (labels.empty()) {  // unnamed labels: the attributes in order
      if (am.num_labels() != int64_t(spec.names.size()))
        fail(
            "align.attribute_model: its {} labels have no names and are not one per attribute "
            "({}: {})",
            am.num_labels(), spec.names.size(), fmt::join(spec.names, ","));
      label_of[k] = k;
      continue;
    }
    const auto it = std::find(labels.begin(), labels.end(), spec.names[k]);
    if (it == labels.end())
      fail("align.steerlm_attributes: '{}' is not a label of align.attribute_model ({})",
           spec.names[k], fmt::join(labels, ", "));
    label_of[k] = size_t(it - labels.begin());
  }
  std::vector<std::vector<int32_t>> seqs;
  std::vector<size_t> which;
  for (size_t i = 0; i < recs.size(); ++i) {
    if (std::all_of(recs[i].values.begin(), recs[i].values.end(),
                    [](const auto& v) { return v.has_value(); }))
      continue;
    seqs.push_back(render_sequence(recs[i].prompt, recs[i].response, am.renderer(),
                                   f.where(f.records[i], prompt_key)));
    which.push_back(i);
  }
  if (seqs.empty()) return 0;
  NK_INFO("steerlm: scoring {} records with the attribute model", seqs.size());
  const std::vector<std::vector<float>> s = am.score(seqs);
  for (size_t n = 0; n < which.size(); ++n)
    for (size_t k = 0; k < spec.names.size(); ++k) {
      auto& v = recs[which[n]].values[k];
      if (!v) v = attribute_value(spec, s[n].at(label_of[k]));
    }
  return int64_t(which.size());
}

nlohmann::ordered_json sft_record(const SteerLmSpec& spec, const SteerRecord& r,
                                  const std::string& where) {
  std::vector<int64_t> values;
  for (const auto& v : r.values) values.push_back(*v);
  const std::string label = attribute_string(spec, values);
  const nlohmann::json prompt = steerlm_prompt(spec, label, r.prompt, where);
  nlohmann::ordered_json j;
  if (prompt.is_array()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::array();
    for (const auto& x : prompt) m.push_back(nlohmann::ordered_json(x));
    m.push_back({{"role", "assistant"}, {"content", r.response}});
    j["messages"] = std::move(m);
  } else {
    j["input"] = prompt.get<std::string>();
    j["output"] = r.response;
  }
  j["label"] = label;
  return j;
}

}  // namespace

int align_steerlm(const CommandArgs& a, const ConfigSchema& schema, const Config& c,
                  const TrainConfig& cfg, const AlignConfig& ac) {
  align_sampling_checks(a, cfg, ac, "steerlm", "attribute-labelled records");
  AlignSamplingConfig k = align_sampling_keys(c);
  const std::string output = k.output_path.empty()
                                 ? (fs::path(cfg.out_dir) / "steerlm_sft.jsonl").string()
                                 : k.output_path;
  std::optional<RewardScorer> am;
  if (!k.attribute_model.empty())
    am.emplace("align.attribute_model", k.attribute_model, cfg.data.chat_template, cfg.init_from,
               k.scorer_dtype, cfg.device, k.score_batch);
  SteerLmSpec spec = k.steerlm;
  spec.names = split_attribute_names(k.attributes);
  if (spec.names.empty())
    spec.names = am && !am->labels().empty() ? am->labels() : helpsteer_attributes();
  spec.check("align.steerlm_attributes");

  JsonRecords f;
  try {
    f = read_json_records(ac.data_path);
  } catch (const Error& e) {
    throw e.with_context("align.data_path");
  }
  const std::string& pk = ac.data.prompt_key;
  std::vector<SteerRecord> recs;
  bool chat = false;
  for (const JsonRecord& r : f.records) {
    SteerRecord s;
    s.prompt = record_field(f, r, pk);
    const bool is_chat = is_chat_prompt(s.prompt, f.where(r, pk));
    if (recs.empty()) chat = is_chat;
    if (is_chat != chat)
      fail("{}: a {} prompt where {} holds {}: a file holds one kind", f.where(r, pk),
           is_chat ? "chat" : "string", f.where(f.records[0], pk),
           chat ? "chat messages" : "a string");
    const nlohmann::json& resp = record_field(f, r, k.response_key);
    if (!resp.is_string() || resp.get_ref<const std::string&>().empty())
      fail("{}: must be a non-empty string (the response)", f.where(r, k.response_key));
    s.response = resp.get<std::string>();
    s.values = record_values(f, r, spec, ac.data.label_key);
    for (size_t n = 0; n < spec.names.size() && !am; ++n)
      if (!s.values[n])
        fail(
            "{}: attribute '{}' has no value (an attribute-named key or a \"{}\" label string) "
            "and no align.attribute_model fills it",
            f.where(r), spec.names[n], ac.data.label_key);
    recs.push_back(std::move(s));
  }
  const int64_t filled = am ? fill_values(recs, f, spec, *am, pk) : 0;
  std::string out;
  // Each record rendered as the SFT pass will render it (its template
  // refusing a system message, say, is an error here, naming the line).
  std::unique_ptr<Tokenizer> tok;
  try {
    tok = load_tokenizer(cfg.data.tokenizer.empty() ? "bytes" : cfg.data.tokenizer);
  } catch (const Error& e) {
    throw e.with_context("data.tokenizer");
  }
  const std::string tmpl_name =
      !chat && (cfg.data.chat_template.empty() || cfg.data.chat_template == "auto")
          ? "plain"
          : cfg.data.chat_template;
  const auto tmpl = chat_template_or_deferred(tmpl_name, cfg.init_from, "data.chat_template");
  const ChatSpecials specials = chat_specials(*tok, cfg.init_from);
  for (size_t i = 0; i < recs.size(); ++i) {
    const std::string line = sft_record(spec, recs[i], f.where(f.records[i], pk)).dump();
    render_record(line, f.where(f.records[i]), *tmpl, specials, SftOptions{});
    out += line + "\n";
  }
  const fs::path dir = fs::path(output).parent_path();
  if (!dir.empty()) fs::create_directories(dir);
  write_file_atomic(output, out);
  write_file_atomic(output + ".steerlm.json", spec.to_json().dump(2) + "\n");
  NK_INFO("steerlm: {} records ({} with values from the attribute model), attributes {}: wrote {}",
          recs.size(), filled, fmt::join(spec.names, ","), output);
  if (!k.steerlm_sft) return 0;
  align_sft_pass(a, schema, output, chat, cfg.data.chat_template);
  // Beside the trained model (and adapter), for generate.steerlm_attributes.
  for (const char* sub : {"model", "adapter"}) {
    const fs::path d = fs::path(cfg.out_dir) / sub;
    if (fs::is_directory(d))
      write_file_atomic((d / "steerlm.json").string(), spec.to_json().dump(2) + "\n");
  }
  return 0;
}

}  // namespace nk
