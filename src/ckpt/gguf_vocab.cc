#include "ckpt/gguf_vocab.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "core/error.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_merge.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/byte_tokenizer.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"
#include "data/tokenizer/spm_bpe_tokenizer.h"

namespace nk {

namespace {

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(char(cp));
  } else if (cp < 0x800) {
    out.push_back(char(0xc0 | (cp >> 6)));
    out.push_back(char(0x80 | (cp & 0x3f)));
  } else {
    out.push_back(char(0xe0 | (cp >> 12)));
    out.push_back(char(0x80 | ((cp >> 6) & 0x3f)));
    out.push_back(char(0x80 | (cp & 0x3f)));
  }
}

// llama.cpp's pre-tokenizer names for the regexes it implements.
std::string pre_tokenizer_name(const std::string& pattern) {
  if (pattern == openai_pattern("gpt2")) return "gpt-2";
  if (pattern == openai_pattern("cl100k_base")) return "llama-bpe";  // Llama 3's regex
  if (pattern == openai_pattern("o200k_base")) return "gpt-4o";
  fail(
      "the BPE tokenizer's pre-tokenizer regex is none that llama.cpp implements (GPT-2's, "
      "cl100k_base's = Llama 3's, o200k_base's): {}; pass --tokenizer SPEC with one that has a "
      "GGUF form",
      pattern);
}

void pad_to(GgufVocab& v, int64_t n) {
  for (int64_t id = int64_t(v.tokens.size()); id < n; ++id) {
    v.tokens.push_back(fmt::format("[PAD{}]", id));
    v.types.push_back(kTokUnused);
    if (v.model == "llama") v.scores.push_back(-1000.f);
  }
}

GgufVocab from_sentencepiece(const SentencePieceTokenizer& sp) {
  if (sp.model_type() != "bpe")
    fail(
        "SentencePiece model '{}' is of type {}; llama.cpp's SentencePiece tokenizer (\"llama\") "
        "implements BPE models only; pass --tokenizer SPEC with one that has a GGUF form",
        sp.path(), sp.model_type());
  GgufVocab v;
  v.model = "llama";
  for (int32_t id = 0; id < int32_t(sp.vocab_size()); ++id) {
    v.tokens.push_back(sp.piece(id));
    v.scores.push_back(sp.score(id));
    using T = SentencePieceTokenizer::PieceType;
    switch (sp.piece_type(id)) {
      case T::kNormal:
        v.types.push_back(kTokNormal);
        break;
      case T::kUnknown:
        v.types.push_back(kTokUnknown);
        break;
      case T::kControl:
        v.types.push_back(kTokControl);
        break;
      case T::kUnused:
        v.types.push_back(kTokUnused);
        break;
      case T::kByte:
        v.types.push_back(kTokByte);
        break;
    }
  }
  v.bos = sp.bos_id();
  v.eos = sp.eod_id();
  v.unk = sp.unk_id();
  v.pad = sp.pad_id();
  v.add_bos = true;  // a Llama prompt starts with <s>
  v.add_space_prefix = sp.add_dummy_prefix();
  return v;
}

GgufVocab from_bpe(const BpeTokenizer& bpe) {
  const BpeVocab& bv = bpe.vocab();
  // llama.cpp's gpt2 tokenizer applies no normalizer: the file would encode
  // other ids than the model was trained on.
  if (!bv.normalizer.empty())
    fail(
        "the BPE tokenizer '{}' has a normalizer ({}) that llama.cpp's GGUF tokenizer does not "
        "apply; pass --tokenizer SPEC with one that has a GGUF form",
        bv.name, bv.normalizer);
  GgufVocab v;
  v.model = "gpt2";
  v.pre = pre_tokenizer_name(bv.pattern);
  for (size_t r = 0; r < bv.tokens.size(); ++r) {
    bool hole = bv.tokens[r].empty();
    v.tokens.push_back(hole ? fmt::format("[PAD{}]", r) : gpt2_spelling(bv.tokens[r]));
    v.types.push_back(hole ? kTokUnused : kTokNormal);
  }
  for (auto& [text, id] : bpe.special_tokens()) {
    pad_to(v, int64_t(id) + 1);
    v.tokens[id] = text;
    v.types[id] = kTokControl;
  }
  v.merges = bpe_merges(bv.tokens);
  // The vocabulary's own BOS (Llama 3's <|begin_of_text|>), else GPT-2's
  // convention: <|endoftext|> begins and ends a document.
  v.eos = bpe.eod_id();
  v.bos = bpe.bos_id() >= 0 ? bpe.bos_id() : v.eos;
  return v;
}

[[noreturn]] void refuse_spm(const SpmBpeSpec& spec, const std::string& what) {
  fail(
      "the SentencePiece-style tokenizer '{}' has {}, which llama.cpp's SentencePiece "
      "tokenizer (spaces as \"\u2581\", one \"\u2581\" first or none) does not do; pass "
      "--tokenizer SPEC with one that has a GGUF form",
      spec.name, what);
}

// Whether the normalizer and pre-tokenizer of `spec` are what SentencePiece's
// own normalization does (spaces as "▁", maybe one "▁" first), and whether a
// "▁" goes first (add_space_prefix); nk::Error naming what is not.
bool spm_space_prefix(const SpmBpeSpec& spec) {
  using nlohmann::json;
  const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}};
  const json prepend = {{"type", "Prepend"}, {"prepend", "\u2581"}};
  const json n = spec.normalizer.empty() ? json() : json::parse(spec.normalizer);
  auto refuse = [&](const std::string& what) { refuse_spm(spec, what); };
  auto same = [](const json& a, const json& b) {
    for (const auto& [k, v] : b.items())
      if (!a.contains(k) || a[k] != v) return false;
    return true;
  };

  using Pre = SpmBpeSpec::Pre;
  if (spec.pre == Pre::kMetaspace) {
    if (!n.is_null()) refuse("a normalizer (" + spec.normalizer + ") before Metaspace");
    if (spec.replacement != "\u2581") refuse("Metaspace's replacement '" + spec.replacement + "'");
    if (spec.split) refuse("Metaspace with split true");
    return spec.prepend != SpmBpeSpec::Prepend::kNever;
  }
  if (spec.pre == Pre::kSplit && spec.split_literal != " ")
    refuse("a Split on '" + spec.split_literal + "'");
  if (n.is_object() && same(n, replace)) return false;  // Gemma
  const json steps = n.is_object() ? n.value("normalizers", json()) : json();
  if (n.is_object() && n.value("type", "") == "Sequence" && steps.is_array() && steps.size() == 2 &&
      same(steps[0], prepend) && same(steps[1], replace))
    return true;  // Llama 2, Mistral
  refuse_spm(spec,
             n.is_null()
                 ? std::string("neither a normalizer nor Metaspace putting spaces as \"\u2581\"")
                 : "the normalizer " + spec.normalizer);
}

GgufVocab from_spm_bpe(const SpmBpeTokenizer& t) {
  const SpmBpeSpec& spec = t.spec();
  GgufVocab v;
  v.model = "llama";
  v.add_space_prefix = spm_space_prefix(spec);
  const size_t n = spec.pieces.size();
  // llama.cpp merges the adjacent pair whose joined piece scores highest;
  // Hugging Face the pair of lowest rank. A piece scores minus the rank of
  // the first merge that makes it, so both take the same order; pieces no
  // merge makes (single characters) score lower than all of them.
  std::unordered_map<std::string, int32_t> id_of;
  for (size_t id = 0; id < n; ++id)
    if (!spec.pieces[id].empty()) id_of.emplace(spec.pieces[id], int32_t(id));
  v.scores.assign(n, -float(spec.merges.size() + 1));
  std::vector<bool> scored(n, false);
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto [a, b] = spec.merges[r];
    auto it = id_of.find(spec.pieces[size_t(a)] + spec.pieces[size_t(b)]);
    if (it == id_of.end() || scored[size_t(it->second)]) continue;
    scored[size_t(it->second)] = true;
    v.scores[size_t(it->second)] = -float(r);
  }
  auto has = [](const std::vector<int32_t>& ids, int32_t id) {
    return std::find(ids.begin(), ids.end(), id) != ids.end();
  };
  std::vector<bool> added(n, false);
  for (const auto& [text, id] : spec.added) added[size_t(id)] = true;
  for (size_t id = 0; id < n; ++id) {
    const std::string& p = spec.pieces[id];
    v.tokens.push_back(p.empty() ? fmt::format("[PAD{}]", id) : p);
    const int32_t i = int32_t(id);
    v.types.push_back(p.empty()                                 ? kTokUnused
                      : i == spec.unk                           ? kTokUnknown
                      : added[id] && has(spec.special_added, i) ? kTokControl
                      : added[id]                               ? kTokUserDefined
                      : SpmBpeTokenizer::byte_of_piece(p) >= 0  ? kTokByte
                                                                : kTokNormal);
  }
  // SentencePiece (and llama.cpp) need all 256 byte pieces. Gemma's
  // converter renames <0x09> to "\t"; such a single-byte piece standing in
  // for its missing byte piece is that byte piece again (the same ids).
  std::vector<bool> has_byte(256, false);
  for (size_t id = 0; id < n; ++id)
    if (const int b = SpmBpeTokenizer::byte_of_piece(spec.pieces[id]); b >= 0)
      has_byte[size_t(b)] = true;
  for (int b = 0; b < 256; ++b) {
    if (has_byte[size_t(b)]) continue;
    auto it = b < 0x80 ? id_of.find(std::string(1, char(b))) : id_of.end();
    if (it == id_of.end() || added[size_t(it->second)])
      fail(
          "the SentencePiece-style tokenizer '{}' has no byte piece <0x{:02X}>, which llama.cpp's "
          "SentencePiece tokenizer needs for all 256 bytes; pass --tokenizer SPEC with one that "
          "has a GGUF form",
          spec.name, b);
    v.tokens[size_t(it->second)] = fmt::format("<0x{:02X}>", b);
    v.types[size_t(it->second)] = kTokByte;
  }
  v.bos = t.bos_id();
  v.eos = t.eod_id();
  v.unk = spec.unk;
  v.add_bos = v.bos >= 0;  // a Llama or Gemma prompt starts with its bos
  return v;
}

GgufVocab from_bytes() {
  GgufVocab v;
  v.model = "gpt2";
  v.pre = "default";  // no merges: any pre-tokenization gives one token per byte
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(gpt2_spelling(std::string(1, char(b))));
    v.types.push_back(kTokNormal);
  }
  v.tokens.push_back("<|endoftext|>");
  v.types.push_back(kTokControl);
  v.bos = v.eos = ByteTokenizer::kEot;
  return v;
}

}  // namespace

std::string gpt2_spelling(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char b : bytes) append_utf8(out, gpt2_byte_to_codepoint(b));
  return out;
}

std::vector<std::string> bpe_merges(const std::vector<std::string>& tokens) {
  RankMap ranks(tokens);
  std::vector<std::string> merges;
  std::vector<int32_t> parts;
  for (size_t r = 0; r < tokens.size(); ++r) {
    const std::string& t = tokens[r];
    if (t.size() < 2) continue;  // a single byte or a hole
    parts.clear();
    bpe_merge_piece(t, ranks, parts, int32_t(r));
    // Anything else cannot be produced by merging and is unreachable anyway.
    if (parts.size() != 2) continue;
    merges.push_back(gpt2_spelling(tokens[parts[0]]) + " " + gpt2_spelling(tokens[parts[1]]));
  }
  return merges;
}

GgufVocab gguf_vocab(const Tokenizer& tok, int64_t model_vocab_size) {
  GgufVocab v;
  if (auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&tok))
    v = from_sentencepiece(*sp);
  else if (auto* bpe = dynamic_cast<const BpeTokenizer*>(&tok))
    v = from_bpe(*bpe);
  else if (auto* spm = dynamic_cast<const SpmBpeTokenizer*>(&tok))
    v = from_spm_bpe(*spm);
  else if (tok.kind() == "bytes")
    v = from_bytes();
  else
    fail(
        "tokenizer of kind '{}' has no GGUF equivalent; pass --tokenizer SPEC with one that has "
        "(SentencePiece BPE, byte-level BPE, bytes)",
        tok.kind());
  if (int64_t(v.tokens.size()) > model_vocab_size)
    fail(
        "the tokenizer has {} ids, more than the model's vocab_size {} (not the tokenizer the "
        "model was trained with?)",
        v.tokens.size(), model_vocab_size);
  pad_to(v, model_vocab_size);
  return v;
}

void add_gguf_vocab(GgufWriter& w, const GgufVocab& v) {
  w.add_string("tokenizer.ggml.model", v.model);
  if (!v.pre.empty()) w.add_string("tokenizer.ggml.pre", v.pre);
  w.add_strings("tokenizer.ggml.tokens", v.tokens);
  if (!v.scores.empty()) w.add_f32s("tokenizer.ggml.scores", v.scores);
  w.add_i32s("tokenizer.ggml.token_type", v.types);
  if (v.model == "gpt2") w.add_strings("tokenizer.ggml.merges", v.merges);
  if (v.bos >= 0) w.add_u32("tokenizer.ggml.bos_token_id", uint32_t(v.bos));
  if (v.eos >= 0) w.add_u32("tokenizer.ggml.eos_token_id", uint32_t(v.eos));
  if (v.unk >= 0) w.add_u32("tokenizer.ggml.unknown_token_id", uint32_t(v.unk));
  if (v.pad >= 0) w.add_u32("tokenizer.ggml.padding_token_id", uint32_t(v.pad));
  w.add_bool("tokenizer.ggml.add_bos_token", v.add_bos);
  w.add_bool("tokenizer.ggml.add_eos_token", false);
  if (v.model == "llama") w.add_bool("tokenizer.ggml.add_space_prefix", v.add_space_prefix);
}

}  // namespace nk
