#include "data/tokenizer/hf_tokenizer_json.h"

#include <algorithm>
#include <array>
#include <unordered_map>

#include "core/error.h"
#include "core/json.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_merge.h"
#include "data/tokenizer/hf_json_fields.h"
#include "data/tokenizer/pretokenizer.h"
#include "data/tokenizer/text_normalizer.h"

namespace nk {

namespace {

using nlohmann::json;

// The normalizer's JSON text for BpeVocab ("" when none), checked here so
// that an error names this file and the JSON path of the step.
std::string normalizer_text(const json& n, const std::string& file) {
  return TextNormalizer::from_json(n, file, "normalizer") ? n.dump() : "";
}

// ByteLevel's options; whether it splits with GPT-2's pattern itself (use_regex).
bool byte_level_splits(const json& b, const std::string& where, const std::string& file) {
  if (hf_flag(b, "add_prefix_space", false, where, file))
    fail("{}: {}.add_prefix_space is true: not supported (a space put before the text)", file,
         where);
  return hf_flag(b, "use_regex", true, where, file);
}

// The pattern of a Split step, as PreTokenizer runs it.
std::string split_pattern(const json& s, const std::string& where, const std::string& file) {
  const json& regex = json_member(json_member(s, "pattern"), "Regex");
  if (!regex.is_string())
    fail("{}: {}.pattern must be {{\"Regex\": ...}}, got {}: only a regex Split is supported", file,
         where, json_member(s, "pattern").dump());
  const json& behavior = json_member(s, "behavior");
  if (behavior != "Isolated")
    fail("{}: {}.behavior is {}: only \"Isolated\" (each match a piece) is supported", file, where,
         behavior.dump());
  if (hf_flag(s, "invert", false, where, file))
    fail("{}: {}.invert is true: not supported", file, where);
  const std::string p = regex.get<std::string>();
  const std::string key = fmt::format("{}: {}.pattern.Regex", file, where);
  try {
    PreTokenizer check(p);
  } catch (const Error& e) {
    throw e.with_context(key);
  }
  for (const char* name : {"gpt2", "cl100k_base", "o200k_base"})
    if (p == openai_pattern(name)) return p;  // they match every character: no gaps
  // Split keeps the text between two matches as a piece of its own, where a
  // tiktoken pattern (PreTokenizer) skips it: the second branch takes such a
  // run, up to where the pattern matches again.
  const std::string keeps_gaps = "(?:" + p + ")|(?:(?!(?:" + p + "))(?s:.))+";
  // An empty match, though, makes PreTokenizer skip a character that Hugging
  // Face keeps: such a pattern is refused where a probe text shows it.
  const std::string probe = "Hi, y'all!  123 4567\n\t\u00c0\u00e9 \u4e16\u754c \U0001F600 x\r\n";
  std::string pieces;
  try {
    for (std::string_view piece : PreTokenizer(keeps_gaps).split(probe)) pieces += piece;
  } catch (const Error& e) {
    throw e.with_context(key);  // a named group, say, given twice
  }
  if (pieces != probe) fail("{} can match the empty string: not supported", key);
  return keeps_gaps;
}

// The pre-tokenizer regex of a byte-level BPE's pre_tokenizer.
std::string pre_tokenizer_pattern(const json& pt, const std::string& file) {
  if (pt.is_null())
    fail("{}: pre_tokenizer is null: a byte-level BPE has a ByteLevel pre-tokenizer", file);
  const std::string type = hf_type_of(pt, "pre_tokenizer", file);
  const std::string gpt2 = openai_pattern("gpt2");
  auto no_split = [&](const std::string& where) {
    fail(
        "{}: {} is ByteLevel with use_regex false and no Split before it: the whole text would be "
        "one piece; not supported",
        file, where);
  };
  if (type == "ByteLevel") {
    if (!byte_level_splits(pt, "pre_tokenizer", file)) no_split("pre_tokenizer");
    return gpt2;
  }
  if (type != "Sequence")
    fail(
        "{}: pre_tokenizer.type '{}' is not supported: a byte-level BPE has ByteLevel, or a "
        "Sequence of a Split then ByteLevel",
        file, type);
  const json& steps = json_member(pt, "pretokenizers");
  if (!steps.is_array()) fail("{}: pre_tokenizer.pretokenizers must be an array", file);
  std::string pattern;
  bool byte_level = false;
  for (size_t i = 0; i < steps.size(); ++i) {
    const std::string where = fmt::format("pre_tokenizer.pretokenizers[{}]", i);
    const std::string t = hf_type_of(steps[i], where, file);
    if (byte_level) fail("{}: {}: a step after ByteLevel is not supported", file, where);
    if (t == "Split") {
      if (!pattern.empty()) fail("{}: {}: a second Split is not supported", file, where);
      pattern = split_pattern(steps[i], where, file);
    } else if (t == "ByteLevel") {
      byte_level = true;
      const bool splits = byte_level_splits(steps[i], where, file);
      if (splits && !pattern.empty())
        fail("{}: {}.use_regex is true after a Split: splitting twice is not supported", file,
             where);
      if (splits) pattern = gpt2;
      if (pattern.empty()) no_split(where);
    } else {
      fail("{}: {}.type '{}' is not supported: a byte-level BPE has a Split, then ByteLevel", file,
           where, t);
    }
  }
  if (!byte_level) fail("{}: pre_tokenizer has no ByteLevel step: not a byte-level BPE", file);
  return pattern;
}

struct AddedToken {
  std::string content;
  int32_t id;
  bool normalized;  // matched in the normalized text, after the others
};

std::vector<AddedToken> added_tokens(const json& list, int64_t entries, const std::string& file) {
  std::vector<AddedToken> out;
  if (list.is_null()) return out;
  if (!list.is_array()) fail("{}: added_tokens must be an array", file);
  for (size_t i = 0; i < list.size(); ++i) {
    const std::string where = fmt::format("added_tokens[{}]", i);
    const json& a = list[i];
    const json& content = json_member(a, "content");
    if (!content.is_string() || content.get<std::string>().empty())
      fail("{}: {}.content must be a non-empty string", file, where);
    const int64_t id = json_int(json_member(a, "id"), file, where + ".id", 0, limits::kVocab - 1);
    check_vocab_id(id, entries, file + ": " + where);
    for (const char* key : {"lstrip", "rstrip", "single_word"})
      if (hf_flag(a, key, false, where, file))
        fail("{}: {}.{} is true ('{}'): not supported; Nekton matches an added token as written",
             file, where, key, content.get<std::string>());
    for (size_t j = 0; j < out.size(); ++j)
      if (out[j].id == id) fail("{}: {}: id {} is also added_tokens[{}]'s", file, where, id, j);
    // Hugging Face's default: special tokens are matched as written.
    const bool special = hf_flag(a, "special", false, where, file);
    out.push_back(
        {content.get<std::string>(), int32_t(id), hf_flag(a, "normalized", !special, where, file)});
  }
  return out;
}

bool is_added(const std::vector<AddedToken>& added, const std::string& s) {
  return std::any_of(added.begin(), added.end(),
                     [&](const AddedToken& a) { return a.content == s; });
}

// tokenizer_config.json's `key` (eos_token, bos_token): a string, or an
// AddedToken object with "content", which must be an added token; "" when
// the config has none.
std::string config_token(const json& config, const char* key, const std::string& config_path,
                         const std::vector<AddedToken>& added, const std::string& file) {
  const json& tok = json_member(config, key);
  const json& text = tok.is_object() ? json_member(tok, "content") : tok;
  if (text.is_string() && !text.get<std::string>().empty()) {
    const std::string s = text.get<std::string>();
    if (!is_added(added, s))
      fail("{}: {} '{}' is not one of {}'s added_tokens", config_path, key, s, file);
    return s;
  }
  if (!text.is_null()) fail("{}: {} must be a string or {{\"content\": ...}}", config_path, key);
  return "";
}

// The end-of-document token: tokenizer_config.json's eos_token, else
// <|endoftext|> (BpeTokenizer's default, left empty) or Llama 3's
// <|end_of_text|>.
std::string eod_token(const json& config, const std::string& config_path,
                      const std::vector<AddedToken>& added, const std::string& file) {
  const std::string eos = config_token(config, "eos_token", config_path, added, file);
  if (!eos.empty()) return eos;
  return !is_added(added, "<|endoftext|>") && is_added(added, "<|end_of_text|>") ? "<|end_of_text|>"
                                                                                 : "";
}

// The beginning-of-document token: tokenizer_config.json's bos_token, else
// Llama 3's <|begin_of_text|> when it is an added token, else none.
std::string bos_token(const json& config, const std::string& config_path,
                      const std::vector<AddedToken>& added, const std::string& file) {
  const std::string bos = config_token(config, "bos_token", config_path, added, file);
  if (!bos.empty()) return bos;
  return is_added(added, "<|begin_of_text|>") ? "<|begin_of_text|>" : "";
}

void check_model_options(const json& m, const std::string& file) {
  const json& t = json_member(m, "type");
  // Old files may leave "type" out; a "merges" list then says BPE.
  const std::string type = t.is_string()                         ? t.get<std::string>()
                           : json_member(m, "merges").is_array() ? "BPE"
                                                                 : "?";
  if (type != "BPE")
    fail(
        "{}: model.type is '{}': Nekton reads the tokenizer.json of a byte-level BPE only (a "
        "SentencePiece model is read from the tokenizer.model beside it)",
        file, type);
  if (!json_member(m, "dropout").is_null())
    fail("{}: model.dropout is {}: BPE dropout is not supported (null is)", file,
         json_member(m, "dropout").dump());
  if (hf_flag(m, "byte_fallback", false, "model", file))
    fail(
        "{}: model.byte_fallback is true: a SentencePiece-style BPE (Llama 2, Mistral, Gemma: "
        "pieces spelled with '\u2581', byte fallback), not a byte-level one; load_tokenizer "
        "reads it as such (hf_spm_json.h)",
        file);
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& v = json_member(m, key);
    if (!v.is_null() && v != "") fail("{}: model.{} is {}: not supported", file, key, v.dump());
  }
}

}  // namespace

BpeVocab hf_bpe_vocab(const json& j, const std::string& file, const json& config,
                      const std::string& config_path) {
  if (!j.is_object()) fail("{}: expected a JSON object", file);
  const json& m = json_member(j, "model");
  if (!m.is_object()) fail("{}: model must be an object", file);
  check_model_options(m, file);
  const std::string normalizer = normalizer_text(json_member(j, "normalizer"), file);
  const json& decoder = json_member(j, "decoder");
  if (!decoder.is_null() && hf_type_of(decoder, "decoder", file) != "ByteLevel")
    fail("{}: decoder.type '{}' is not supported: a byte-level BPE decodes with ByteLevel", file,
         hf_type_of(decoder, "decoder", file));
  BpeVocab v;
  v.pattern = pre_tokenizer_pattern(json_member(j, "pre_tokenizer"), file);
  v.normalizer = normalizer;
  v.name = file;

  const json& vocab = json_member(m, "vocab");
  if (!vocab.is_object()) fail("{}: model.vocab must be an object of token -> id", file);
  const json& added_list = json_member(j, "added_tokens");
  const int64_t entries = int64_t(vocab.size() + (added_list.is_array() ? added_list.size() : 0));
  const std::vector<AddedToken> added = added_tokens(added_list, entries, file);
  std::unordered_map<int32_t, const AddedToken*> added_by_id;
  for (const AddedToken& a : added) added_by_id.emplace(a.id, &a);

  // The vocabulary by id. An added token listed in it too (GPT-2's
  // <|endoftext|>) is a special only: its id is left a hole.
  std::unordered_map<std::string, int32_t> id_of;  // as spelled in the file
  id_of.reserve(vocab.size());
  std::vector<const std::string*> spelling;  // by id, for messages
  std::string bytes;
  for (auto it = vocab.begin(); it != vocab.end(); ++it) {
    const std::string where = fmt::format("model.vocab['{}']", it.key());
    const int64_t id = json_int(it.value(), file, where, 0, limits::kVocab - 1);
    check_vocab_id(id, entries, file + ": " + where);
    const bool byte_level = gpt2_spelling_to_bytes(it.key(), bytes) && !bytes.empty();
    id_of.emplace(it.key(), int32_t(id));
    if (auto a = added_by_id.find(int32_t(id)); a != added_by_id.end()) {
      if (it.key() != a->second->content && !(byte_level && bytes == a->second->content))
        fail("{}: {} is id {}, which added_tokens gives to '{}'", file, where, id,
             a->second->content);
      continue;
    }
    if (!byte_level)
      fail("{}: {}: a character outside GPT-2's byte alphabet: not a byte-level BPE token", file,
           where);
    if (size_t(id) >= v.tokens.size())
      v.tokens.resize(size_t(id) + 1), spelling.resize(size_t(id) + 1);
    if (spelling[size_t(id)])
      fail("{}: {}: id {} is also '{}'s", file, where, id, *spelling[size_t(id)]);
    v.tokens[size_t(id)] = bytes;
    spelling[size_t(id)] = &it.key();
  }
  std::array<bool, 256> has_byte{};
  for (const std::string& t : v.tokens)
    if (t.size() == 1) has_byte[static_cast<unsigned char>(t[0])] = true;
  for (int b = 0; b < 256; ++b)
    if (!has_byte[size_t(b)])
      fail(
          "{}: model.vocab has no token for the byte 0x{:02X} (U+{:04X}): a byte-level BPE needs "
          "all 256",
          file, b, gpt2_byte_to_codepoint(static_cast<unsigned char>(b)));

  // BpeTokenizer merges by the id of the token made; the file's merges, by
  // their order. Those agree when the ids follow the order.
  const json& merges = json_member(m, "merges");
  if (!merges.is_array()) fail("{}: model.merges must be an array", file);
  int32_t last = -1;
  size_t last_at = 0;
  for (size_t i = 0; i < merges.size(); ++i) {
    const std::array<int32_t, 3> ids = hf_merge_ids(merges, i, id_of, file);
    // Merges through an added token never apply: its text is split off first.
    if (std::any_of(ids.begin(), ids.end(), [&](int32_t id) { return added_by_id.count(id) > 0; }))
      continue;
    if (ids[2] < last)
      fail(
          "{}: model.merges[{}] ('{}') makes id {}, after model.merges[{}] made id {}: Nekton's "
          "BPE applies merges in the order of the ids of the tokens they make (tiktoken's rule), "
          "and these merges are not in that order",
          file, i,
          merges[i].is_string()
              ? merges[i].get<std::string>()
              : merges[i][0].get<std::string>() + " " + merges[i][1].get<std::string>(),
          ids[2], last_at, last);
    last = ids[2], last_at = i;
  }

  // Without ignore_merges Hugging Face merges even a piece that is a token;
  // BpeTokenizer emits it whole. The same when merging a token's bytes gives it.
  if (!hf_flag(m, "ignore_merges", false, "model", file)) {
    RankMap ranks(v.tokens);
    std::vector<int32_t> out;
    for (size_t r = 0; r < v.tokens.size(); ++r) {
      if (v.tokens[r].size() < 2) continue;
      out.clear();
      bpe_merge_piece(v.tokens[r], ranks, out);
      if (out.size() != 1)
        fail(
            "{}: model.ignore_merges is false, but merging the bytes of '{}' (id {}) gives {} "
            "tokens: Nekton's BPE emits a piece that is a whole token as that token (as "
            "ignore_merges: true does)",
            file, *spelling[r], r, out.size());
    }
  }

  for (const AddedToken& a : added) {
    v.specials.emplace_back(a.content, a.id);
    if (a.normalized) v.normalized_specials.push_back(a.id);
  }
  v.eod = eod_token(config, config_path, added, file);
  v.bos = bos_token(config, config_path, added, file);
  return v;
}

}  // namespace nk
