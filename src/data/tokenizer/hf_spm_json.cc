#include "data/tokenizer/hf_spm_json.h"

#include <algorithm>
#include <unordered_map>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer/bpe_vocab.h"
#include "data/tokenizer/hf_json_fields.h"
#include "data/tokenizer/text_normalizer.h"

namespace nk {

namespace {

using nlohmann::json;

// One Unicode character (Metaspace's replacement, Strip's content).
std::string one_char(const json& obj, const char* key, const std::string& absent,
                     const std::string& where, const std::string& file) {
  const std::string s = hf_text(obj, key, absent, where, file);
  const size_t n = s.empty()                 ? 0
                   : (uint8_t(s[0]) < 0x80)  ? 1
                   : (uint8_t(s[0]) >= 0xF0) ? 4
                   : (uint8_t(s[0]) >= 0xE0) ? 3
                                             : 2;
  if (s.empty() || s.size() != n)
    fail("{}: {}.{} must be one character, got {}", file, where, key, json_member(obj, key).dump());
  return s;
}

// Metaspace's prepend_scheme (or the older add_prefix_space).
SpmBpeSpec::Prepend prepend_scheme(const json& m, const std::string& where,
                                   const std::string& file) {
  using P = SpmBpeSpec::Prepend;
  const json& v = json_member(m, "prepend_scheme");
  if (v.is_null())
    return hf_flag(m, "add_prefix_space", true, where, file) ? P::kAlways : P::kNever;
  if (v == "always") return P::kAlways;
  if (v == "first") return P::kFirst;
  if (v == "never") return P::kNever;
  fail("{}: {}.prepend_scheme is {}: expected \"always\", \"first\" or \"never\"", file, where,
       v.dump());
}

void read_metaspace(const json& m, const std::string& where, const std::string& file,
                    SpmBpeSpec& s) {
  s.pre = SpmBpeSpec::Pre::kMetaspace;
  s.replacement = one_char(m, "replacement", "\u2581", where, file);
  s.prepend = prepend_scheme(m, where, file);
  s.split = hf_flag(m, "split", true, where, file);
}

SpmBpeSpec::Behavior behavior(const json& v, const std::string& where, const std::string& file) {
  using B = SpmBpeSpec::Behavior;
  if (v == "MergedWithPrevious") return B::kMergedWithPrevious;
  if (v == "MergedWithNext") return B::kMergedWithNext;
  if (v == "Isolated") return B::kIsolated;
  if (v == "Removed") return B::kRemoved;
  fail(
      "{}: {}.behavior is {}: supported are \"MergedWithPrevious\", \"MergedWithNext\", "
      "\"Isolated\" and \"Removed\"",
      file, where, v.dump());
}

void read_pre_tokenizer(const json& pt, const std::string& file, SpmBpeSpec& s) {
  if (pt.is_null()) return;
  std::string where = "pre_tokenizer";
  const json* step = &pt;
  if (hf_type_of(pt, where, file) == "Sequence") {
    // One step in a Sequence is that step.
    const json& list = json_member(pt, "pretokenizers");
    if (!list.is_array()) fail("{}: pre_tokenizer.pretokenizers must be an array", file);
    if (list.empty()) return;
    if (list.size() > 1)
      fail(
          "{}: pre_tokenizer.pretokenizers has {} steps: a SentencePiece-style BPE has one "
          "(Metaspace or a literal Split)",
          file, list.size());
    where = "pre_tokenizer.pretokenizers[0]";
    step = &list[0];
  }
  const std::string type = hf_type_of(*step, where, file);
  if (type == "Metaspace") return read_metaspace(*step, where, file, s);
  if (type != "Split")
    fail(
        "{}: {}.type '{}' is not supported for a SentencePiece-style BPE: it has Metaspace, a "
        "Split on a literal string, or none",
        file, where, type);
  const json& literal = json_member(json_member(*step, "pattern"), "String");
  if (!literal.is_string() || literal.get<std::string>().empty())
    fail("{}: {}.pattern must be {{\"String\": non-empty text}} here, got {}", file, where,
         json_member(*step, "pattern").dump());
  if (hf_flag(*step, "invert", false, where, file))
    fail("{}: {}.invert is true: not supported", file, where);
  s.pre = SpmBpeSpec::Pre::kSplit;
  s.split_literal = literal.get<std::string>();
  s.behavior = behavior(json_member(*step, "behavior"), where, file);
}

SpmBpeSpec::DecodeStep decode_step(const json& d, const std::string& where,
                                   const std::string& file) {
  using D = SpmBpeSpec::DecodeStep;
  const std::string type = hf_type_of(d, where, file);
  D step;
  if (type == "Fuse") return step;
  if (type == "ByteFallback") return step.kind = D::kByteFallback, step;
  if (type == "Replace") {
    step.kind = D::kReplace;
    const json& literal = json_member(json_member(d, "pattern"), "String");
    if (!literal.is_string() || literal.get<std::string>().empty())
      fail("{}: {}.pattern must be {{\"String\": non-empty text}}, got {}", file, where,
           json_member(d, "pattern").dump());
    step.pattern = literal.get<std::string>();
    const json& content = json_member(d, "content");
    if (!content.is_string())
      fail("{}: {}.content must be a string, got {}", file, where, content.dump());
    step.content = content.get<std::string>();
    return step;
  }
  if (type == "Strip") {
    step.kind = D::kStrip;
    step.content = one_char(d, "content", " ", where, file);
    step.start = size_t(json_int(json_member(d, "start"), file, where + ".start", 0, 1 << 20));
    step.stop = size_t(json_int(json_member(d, "stop"), file, where + ".stop", 0, 1 << 20));
    return step;
  }
  if (type == "Metaspace") {
    step.kind = D::kMetaspace;
    step.pattern = one_char(d, "replacement", "\u2581", where, file);
    step.drop_first = prepend_scheme(d, where, file) != SpmBpeSpec::Prepend::kNever;
    return step;
  }
  fail(
      "{}: {}.type '{}' is not supported for a SentencePiece-style BPE: its decoders are "
      "Replace, ByteFallback, Fuse, Strip and Metaspace",
      file, where, type);
}

void read_decoder(const json& d, const std::string& file, SpmBpeSpec& s) {
  if (d.is_null()) return;
  if (hf_type_of(d, "decoder", file) != "Sequence")
    return s.decoder.push_back(decode_step(d, "decoder", file));
  const json& list = json_member(d, "decoders");
  if (!list.is_array()) fail("{}: decoder.decoders must be an array", file);
  for (size_t i = 0; i < list.size(); ++i)
    s.decoder.push_back(decode_step(list[i], fmt::format("decoder.decoders[{}]", i), file));
}

void check_spm_model_options(const json& m, const std::string& file) {
  const json& t = json_member(m, "type");
  if (!t.is_null() && t != "BPE")
    fail(
        "{}: model.type is {}: Nekton reads a tokenizer.json whose model is a BPE (a Unigram "
        "SentencePiece model is read from the tokenizer.model beside it)",
        file, t.dump());
  if (!json_member(m, "dropout").is_null())
    fail("{}: model.dropout is {}: BPE dropout is not supported (null is)", file,
         json_member(m, "dropout").dump());
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = json_member(m, key);
    if (!v.is_null() && v != "") fail("{}: model.{} is {}: not supported", file, key, v.dump());
  }
}

// A merge "A B" or ["A", "B"] as its two pieces.
// tokenizer_config.json's `key` (a string or {"content": ...}), else the
// first of `defaults` that is a piece; -1 if none.
int32_t config_token(const json& config, const char* key, const std::string& config_path,
                     const std::unordered_map<std::string, int32_t>& id_of,
                     std::initializer_list<const char*> defaults) {
  const json& tok = json_member(config, key);
  const json& t = tok.is_object() ? json_member(tok, "content") : tok;
  if (t.is_string() && !t.get<std::string>().empty()) {
    auto it = id_of.find(t.get<std::string>());
    if (it == id_of.end())
      fail("{}: {} '{}' is not a token of the tokenizer.json", config_path, key,
           t.get<std::string>());
    return it->second;
  }
  if (!t.is_null()) fail("{}: {} must be a string or {{\"content\": ...}}", config_path, key);
  for (const char* d : defaults)
    if (auto it = id_of.find(d); it != id_of.end()) return it->second;
  return -1;
}

}  // namespace

bool is_hf_spm_bpe(const json& j) {
  const json& m = json_member(j, "model");
  if (json_member(m, "byte_fallback") == true) return true;
  const json& pt = json_member(j, "pre_tokenizer");
  if (json_member(pt, "type") == "Metaspace") return true;
  const json& d = json_member(j, "decoder");
  if (json_member(d, "type") == "Metaspace" || json_member(d, "type") == "ByteFallback")
    return true;
  const json& steps = json_member(d, "decoders");
  if (steps.is_array())
    for (const json& s : steps)
      if (json_member(s, "type") == "ByteFallback" || json_member(s, "type") == "Metaspace")
        return true;
  return false;
}

SpmBpeSpec hf_spm_bpe_spec(const json& j, const std::string& file, const json& config,
                           const std::string& config_path) {
  if (!j.is_object()) fail("{}: expected a JSON object", file);
  const json& m = json_member(j, "model");
  if (!m.is_object()) fail("{}: model must be an object", file);
  check_spm_model_options(m, file);
  SpmBpeSpec s;
  s.name = file;
  if (TextNormalizer::from_json(json_member(j, "normalizer"), file, "normalizer"))
    s.normalizer = json_member(j, "normalizer").dump();
  read_pre_tokenizer(json_member(j, "pre_tokenizer"), file, s);
  read_decoder(json_member(j, "decoder"), file, s);
  s.byte_fallback = hf_flag(m, "byte_fallback", false, "model", file);
  s.fuse_unk = hf_flag(m, "fuse_unk", false, "model", file);
  s.ignore_merges = hf_flag(m, "ignore_merges", false, "model", file);

  const json& vocab = json_member(m, "vocab");
  if (!vocab.is_object()) fail("{}: model.vocab must be an object of piece -> id", file);
  const json& added = json_member(j, "added_tokens");
  if (!added.is_null() && !added.is_array()) fail("{}: added_tokens must be an array", file);
  const int64_t entries = int64_t(vocab.size() + (added.is_array() ? added.size() : 0));
  std::unordered_map<std::string, int32_t> id_of;  // model pieces, then added tokens
  id_of.reserve(size_t(entries));
  auto place = [&](const std::string& piece, int64_t id, const std::string& where) {
    check_vocab_id(id, entries, file + ": " + where);
    if (size_t(id) >= s.pieces.size()) s.pieces.resize(size_t(id) + 1);
    std::string& slot = s.pieces[size_t(id)];
    if (!slot.empty() && slot != piece) fail("{}: {}: id {} is also '{}'s", file, where, id, slot);
    slot = piece;
  };
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string where = fmt::format("model.vocab['{}']", it.key());
    if (it.key().empty()) fail("{}: {}: an empty piece", file, where);
    const int64_t id = json_int(it.value(), file, where, 0, limits::kVocab - 1);
    place(it.key(), id, where);
    id_of.emplace(it.key(), int32_t(id));
    if (size_t(id) >= s.in_model.size()) s.in_model.resize(size_t(id) + 1);
    s.in_model[size_t(id)] = true;
  }
  const json& unk = json_member(m, "unk_token");
  if (!unk.is_null()) {
    if (!unk.is_string()) fail("{}: model.unk_token must be a string, got {}", file, unk.dump());
    auto it = id_of.find(unk.get<std::string>());
    if (it == id_of.end())
      fail("{}: model.unk_token '{}' is not in model.vocab", file, unk.get<std::string>());
    s.unk = it->second;
  }
  const json& merges = json_member(m, "merges");
  if (!merges.is_array()) fail("{}: model.merges must be an array", file);
  s.merges.reserve(merges.size());
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::array<int32_t, 3> ids = hf_merge_ids(merges, i, id_of, file);
    s.merges.emplace_back(ids[0], ids[1]);
  }

  if (added.is_array())
    for (size_t i = 0; i < added.size(); ++i) {
      const std::string where = fmt::format("added_tokens[{}]", i);
      const json& a = added[i];
      const json& content = json_member(a, "content");
      if (!content.is_string() || content.get<std::string>().empty())
        fail("{}: {}.content must be a non-empty string", file, where);
      const std::string c = content.get<std::string>();
      for (const char* key : {"lstrip", "rstrip", "single_word"})
        if (hf_flag(a, key, false, where, file))
          fail("{}: {}.{} is true ('{}'): not supported; Nekton matches an added token as written",
               file, where, key, c);
      const int64_t id = json_int(json_member(a, "id"), file, where + ".id", 0, limits::kVocab - 1);
      // Llama's <unk>, <s>, </s> are pieces of the model too, with the same id.
      place(c, id, where);
      if (std::any_of(s.added.begin(), s.added.end(),
                      [&](const auto& x) { return x.second == id; }))
        fail("{}: {}: id {} is added twice", file, where, id);
      id_of.emplace(c, int32_t(id));
      s.added.emplace_back(c, int32_t(id));
      const bool special = hf_flag(a, "special", false, where, file);
      if (special) s.special_added.push_back(int32_t(id));
      if (hf_flag(a, "normalized", !special, where, file))
        s.normalized_added.push_back(int32_t(id));
    }
  s.in_model.resize(s.pieces.size());
  s.eod = config_token(config, "eos_token", config_path, id_of, {"</s>", "<eos>"});
  s.bos = config_token(config, "bos_token", config_path, id_of, {"<s>", "<bos>"});
  return s;
}

}  // namespace nk
