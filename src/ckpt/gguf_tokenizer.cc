#include "ckpt/gguf_tokenizer.h"

#include <nlohmann/json.hpp>

#include <cstring>

#include "ckpt/gguf_vocab.h"
#include "core/error.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "data/tokenizer/hf_tokenizer_json.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"

namespace nk {

namespace {

// ---- protobuf wire format, for sentencepiece's ModelProto ----
void varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char(0x80 | (v & 0x7f)));
    v >>= 7;
  }
  out.push_back(char(v));
}
void tag(std::string& out, int field, int wire) {
  varint(out, uint64_t(field) << 3 | uint64_t(wire));
}
void int_field(std::string& out, int field, int64_t v) {
  tag(out, field, 0);
  varint(out, uint64_t(v));  // negative int32s take ten bytes, as protobuf writes them
}
void bytes_field(std::string& out, int field, const std::string& v) {
  tag(out, field, 2);
  varint(out, v.size());
  out += v;
}
void float_field(std::string& out, int field, float v) {
  tag(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

// llama_token_type -> sentencepiece's ModelProto.SentencePiece.Type.
int piece_type(const GgufFile& f, int64_t id, int64_t type) {
  switch (type) {
    case kTokNormal:
      return 1;
    case kTokUnknown:
      return 2;
    case kTokControl:
      return 3;
    case kTokUserDefined:
      return 4;
    case kTokUnused:
      return 5;
    case kTokByte:
      return 6;
    default:
      fail("GGUF '{}': tokenizer.ggml.token_type[{}] = {} is not a llama.cpp token type", f.path(),
           id, type);
  }
}

std::unique_ptr<Tokenizer> sentencepiece_from(const GgufFile& f,
                                              const std::vector<std::string>& tokens) {
  const std::vector<double> scores = f.get_floats("tokenizer.ggml.scores");
  const std::vector<int64_t> types = f.get_ints("tokenizer.ggml.token_type");
  if (scores.size() != tokens.size() || types.size() != tokens.size())
    fail("GGUF '{}': {} tokens, {} scores and {} token types", f.path(), tokens.size(),
         scores.size(), types.size());
  std::string proto;
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::string piece;
    bytes_field(piece, 1, tokens[i]);
    float_field(piece, 2, float(scores[i]));
    int_field(piece, 3, piece_type(f, int64_t(i), types[i]));
    bytes_field(proto, 1, piece);
  }
  auto id = [&](const char* key) { return f.get_int(std::string("tokenizer.ggml.") + key, -1); };
  std::string trainer;
  int_field(trainer, 3, 2);  // model_type BPE: merges by score, as llama.cpp's SPM tokenizer
  int_field(trainer, 4, int64_t(tokens.size()));
  int_field(trainer, 35, 1);  // byte_fallback
  int_field(trainer, 40, id("unknown_token_id") >= 0 ? id("unknown_token_id") : 0);
  int_field(trainer, 41, id("bos_token_id"));
  int_field(trainer, 42, id("eos_token_id"));
  int_field(trainer, 43, id("padding_token_id"));
  bytes_field(proto, 2, trainer);
  std::string norm;
  bytes_field(norm, 1, "identity");
  int_field(norm, 3, f.get_bool("tokenizer.ggml.add_space_prefix", true) ? 1 : 0);
  int_field(norm, 4, 0);  // remove_extra_whitespaces
  int_field(norm, 5, 1);  // escape_whitespaces
  bytes_field(proto, 3, norm);
  return SentencePieceTokenizer::from_bytes(proto, f.path() + " (tokenizer.ggml.*)");
}

std::string pre_tokenizer_regex(const GgufFile& f, const std::string& pre) {
  if (pre == "gpt-2" || pre == "default") return openai_pattern("gpt2");
  if (pre == "llama-bpe" || pre == "llama3") return openai_pattern("cl100k_base");
  if (pre == "gpt-4o") return openai_pattern("o200k_base");
  fail(
      "GGUF '{}': tokenizer.ggml.pre '{}' is a pre-tokenizer Nekton does not implement "
      "(gpt-2, llama-bpe, gpt-4o, default)",
      f.path(), pre);
}

std::unique_ptr<Tokenizer> bpe_from(const GgufFile& f, const std::vector<std::string>& tokens) {
  const std::vector<int64_t> types = f.has("tokenizer.ggml.token_type")
                                         ? f.get_ints("tokenizer.ggml.token_type")
                                         : std::vector<int64_t>(tokens.size(), kTokNormal);
  if (types.size() != tokens.size())
    fail("GGUF '{}': {} tokens and {} token types", f.path(), tokens.size(), types.size());
  // The same document a Hugging Face tokenizer.json of this vocabulary is.
  nlohmann::json model = {{"type", "BPE"}, {"merges", nlohmann::json::array()}};
  nlohmann::json vocab = nlohmann::json::object(), added = nlohmann::json::array();
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] == kTokUnused) continue;  // padding rows of the embedding
    if (types[i] == kTokControl || types[i] == kTokUserDefined)
      added.push_back({{"id", i}, {"content", tokens[i]}, {"special", types[i] == kTokControl}});
    else
      vocab[tokens[i]] = i;
  }
  model["vocab"] = vocab;
  if (f.has("tokenizer.ggml.merges")) model["merges"] = f.get_strings("tokenizer.ggml.merges");
  const std::string pre = f.get_string("tokenizer.ggml.pre", "default");
  nlohmann::json pretok;
  if (pre == "gpt-2" || pre == "default") {
    pretok = {{"type", "ByteLevel"}, {"use_regex", true}, {"add_prefix_space", false}};
  } else {
    pretok = {{"type", "Sequence"},
              {"pretokenizers",
               {{{"type", "Split"},
                 {"pattern", {{"Regex", pre_tokenizer_regex(f, pre)}}},
                 {"behavior", "Isolated"}},
                {{"type", "ByteLevel"}, {"use_regex", false}, {"add_prefix_space", false}}}}};
  }
  nlohmann::json doc = {{"model", model},
                        {"pre_tokenizer", pretok},
                        {"added_tokens", added},
                        {"decoder", {{"type", "ByteLevel"}}}};
  nlohmann::json config = nullptr;
  const int64_t eos = f.get_int("tokenizer.ggml.eos_token_id", -1);
  if (eos >= 0 && size_t(eos) < tokens.size() && types[size_t(eos)] == kTokControl)
    config = {{"eos_token", tokens[size_t(eos)]}};
  const std::string where = f.path() + " (tokenizer.ggml.*)";
  BpeVocab v = hf_bpe_vocab(doc, where, config, where);
  v.name = f.path();
  return std::make_unique<BpeTokenizer>(std::move(v));
}

}  // namespace

std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f) {
  if (!f.has("tokenizer.ggml.model")) return nullptr;
  const std::string model = f.get_string("tokenizer.ggml.model");
  const std::vector<std::string> tokens = f.get_strings("tokenizer.ggml.tokens");
  // The special ids must name tokens of the file's own vocabulary (llama.cpp
  // falls back to a default id with a warning; a wrong id is a broken file).
  for (const char* key : {"bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id",
                          "sep_token_id", "eot_token_id", "eom_token_id"}) {
    const std::string name = std::string("tokenizer.ggml.") + key;
    if (!f.has(name)) continue;
    const int64_t id = f.get_int(name, -1);
    if (id < 0 || id >= int64_t(tokens.size()))
      fail("GGUF '{}': {} = {} is outside the vocabulary (tokenizer.ggml.tokens has {} tokens)",
           f.path(), name, id, tokens.size());
  }
  if (model == "llama") return sentencepiece_from(f, tokens);
  if (model == "gpt2") return bpe_from(f, tokens);
  fail("GGUF '{}': tokenizer.ggml.model '{}' is not supported (llama, gpt2)", f.path(), model);
}

}  // namespace nk
