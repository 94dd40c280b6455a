#include "align/attribute_data.h"

#include <cmath>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/json.h"
#include "data/jsonl_reader.h"

namespace nk {

std::string AttributeData::summary() const {
  return fmt::format("{}: {} records, {} of {} truncated", path, records(), truncated, records());
}

AttributeData read_attribute_jsonl(const std::string& path, const PreferenceRenderer& r,
                                   const std::vector<std::string>& attributes, int64_t max_length,
                                   const std::string& prompt_key, const std::string& response_key) {
  NK_CHECK(max_length >= 1 && !attributes.empty(), "read_attribute_jsonl: {} tokens, {} attributes",
           max_length, attributes.size());
  AttributeData d;
  d.path = path;
  d.attributes = attributes;
  JsonlReader reader(path);
  std::string_view text;
  int64_t line = 0;
  while (reader.read_line(text, line)) {
    if (text.find_first_not_of(" \t\r") == std::string_view::npos) continue;
    const std::string where = fmt::format("{}:{}", path, line);
    const nlohmann::json rec = parse_json(std::string(text), where);
    if (!rec.is_object()) fail("{}: a record must be a JSON object", where);
    for (const std::string& k : {prompt_key, response_key})
      if (!rec.contains(k)) fail("{}: no \"{}\"", where, k);
    std::vector<int32_t> t = render_sequence(rec[prompt_key], rec[response_key], r,
                                             fmt::format("{}: {}", where, prompt_key));
    std::vector<float> v(attributes.size(), NAN);
    bool any = false;
    for (size_t a = 0; a < attributes.size(); ++a) {
      const auto it = rec.find(attributes[a]);
      if (it == rec.end() || it->is_null()) continue;
      if (!it->is_number() || !std::isfinite(it->get<double>()))
        fail("{}: {}: an attribute value must be a finite number or null, not {}", where,
             attributes[a], it->dump());
      v[a] = it->get<float>();
      any = true;
    }
    if (!any)
      fail("{}: none of the attributes ({}) is labelled", where, fmt::join(attributes, ", "));
    if (int64_t(t.size()) > max_length) {
      t.erase(t.begin(), t.end() - max_length);
      ++d.truncated;
    }
    d.tokens.push_back(std::move(t));
    d.values.push_back(std::move(v));
    d.line.push_back(line);
  }
  if (d.line.empty()) fail("{}: no attribute record", path);
  return d;
}

AttributeDataset::AttributeDataset(std::shared_ptr<const AttributeData> data, int64_t seq_len,
                                   int32_t pad_id, uint64_t seed, bool shuffle, std::string name)
    : data_(std::move(data)),
      seq_len_(seq_len),
      pad_(pad_id),
      name_(std::move(name)),
      order_(data_->records(), seed, shuffle) {
  NK_CHECK(data_->records() > 0, "{}: no records", name_);
  for (const auto& t : data_->tokens)
    NK_CHECK(int64_t(t.size()) <= seq_len_, "{}: a sequence of {} tokens in rows of {}", name_,
             t.size(), seq_len_);
}

void AttributeDataset::sample(int64_t, int32_t*) const {
  NK_CHECK(false, "{}: a dataset of rows has no windows; read it with row()", name_);
}

int64_t AttributeDataset::record_of(int64_t i) const {
  return order_.at(i);
}

std::string AttributeDataset::describe(int64_t i) const {
  return fmt::format("{}, line {} (sample {})", name_, data_->line[size_t(record_of(i))], i);
}

void AttributeDataset::row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                           int32_t* cu_seqlens) const {
  const std::vector<int32_t>& t = data_->tokens[size_t(record_of(i))];
  const int64_t n = int64_t(t.size());
  for (int64_t k = 0; k < seq_len_; ++k) {
    tokens[k] = k < n ? t[size_t(k)] : pad_;
    targets[k] = -100;
    positions[k] = int32_t(k);
  }
  cu_seqlens[0] = 0;
  cu_seqlens[1] = int32_t(seq_len_);
}

}  // namespace nk
