// A SentencePiece-style BPE as Hugging Face's tokenizer.json describes it
// (Llama 2, Mistral, Gemma 2/3, Phi-3 as transformers converts their
// tokenizer.model; fine-tuned repos often ship only the JSON). Runs the
// pipeline of the Rust `tokenizers` crate (the one transformers runs):
//   added tokens   split off first: those with normalized false in the raw
//                  text, the others in the normalized text between them
//   normalizer     text_normalizer.h (Llama 2: Prepend "▁" then Replace
//                  " " -> "▁"; Gemma: the Replace only)
//   pre-tokenizer  none (the whole run one word); Metaspace (spaces become the
//                  replacement, which prepend_scheme puts first: always, or
//                  first = only for the run at the start of the text, or
//                  never; split cuts before each replacement); or a Split on a
//                  literal string (Gemma's, a no-op after its normalizer)
//   model          BPE over characters: each character its piece, else (byte
//                  fallback) its UTF-8 bytes as the pieces <0xNN>, else the
//                  unk piece (a run of them one unk with fuse_unk); then the
//                  pair of lowest merge rank merges first, the leftmost among
//                  equals; with ignore_merges a word that is a piece is that
//                  piece
//   decoder        a Sequence of Replace (literal), ByteFallback (a run of
//                  <0xNN> pieces as UTF-8, each byte U+FFFD if the run is not
//                  valid), Fuse, Strip (content, start, stop); or Metaspace
//                  (the replacement back to spaces; in the first token every
//                  replacement is dropped unless prepend_scheme is never)
// hf_tokenizer_json.h reads the file into an SpmBpeSpec.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace nk {

class TextNormalizer;

struct SpmBpeSpec {
  std::string name;        // the file, for messages
  std::string normalizer;  // tokenizer.json's "normalizer" as JSON text; "": none

  enum class Pre { kNone, kMetaspace, kSplit } pre = Pre::kNone;
  std::string replacement = "\u2581";  // Metaspace
  enum class Prepend { kAlways, kFirst, kNever } prepend = Prepend::kAlways;
  bool split = true;          // Metaspace: a word starts at each replacement
  std::string split_literal;  // kSplit: the delimiter
  enum class Behavior { kMergedWithPrevious, kMergedWithNext, kIsolated, kRemoved };
  Behavior behavior = Behavior::kMergedWithPrevious;  // kSplit

  std::vector<std::string> pieces;                  // by id; "" is a hole
  std::vector<bool> in_model;                       // by id: a piece of model.vocab
                                                    // (not only an added token)
  std::vector<std::pair<int32_t, int32_t>> merges;  // piece ids, in rank order
  int32_t unk = -1;                                 // -1: no unk piece
  bool byte_fallback = false, fuse_unk = false, ignore_merges = false;

  // Added tokens (content, id), and the ids of those matched in normalized text.
  std::vector<std::pair<std::string, int32_t>> added;
  std::vector<int32_t> normalized_added;
  std::vector<int32_t> special_added;  // the ids of those marked special
  int32_t eod = -1, bos = -1;

  struct DecodeStep {
    enum Kind { kReplace, kByteFallback, kFuse, kStrip, kMetaspace } kind = kFuse;
    std::string pattern, content;  // kReplace: literal -> content; kStrip: content;
                                   // kMetaspace: pattern the replacement
    size_t start = 0, stop = 0;    // kStrip: characters cut at each end at most
    bool drop_first = true;        // kMetaspace: prepend_scheme is not never
  };
  std::vector<DecodeStep> decoder;
};

class SpmBpeTokenizer : public Tokenizer {
 public:
  // nk::Error naming spec.name for an unusable spec (a merge of holes, an
  // unk id that is no piece, an added token on a piece).
  explicit SpmBpeTokenizer(SpmBpeSpec spec);
  ~SpmBpeTokenizer() override;

  std::string kind() const override { return "spm_bpe"; }
  int64_t vocab_size() const override { return int64_t(spec_.pieces.size()); }
  using Tokenizer::encode;
  // As Hugging Face's encode without special tokens added, added-token text
  // encoded as ordinary text.
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  // As Hugging Face's encode(text, add_special_tokens=False).
  void encode_with_specials(std::string_view text, std::vector<int32_t>& out) const override;
  // As Hugging Face's decode(ids, skip_special_tokens=False): the decoder's
  // text (valid UTF-8; an invalid byte run is U+FFFD per byte).
  std::string decode(std::span<const int32_t> ids) const override;
  // The piece (an added token's text too) with the replacement as a space, a
  // byte piece as its byte.
  std::string token_bytes(int32_t id) const override;
  int32_t eod_id() const override { return spec_.eod; }
  int32_t bos_id() const override { return spec_.bos; }
  std::vector<std::pair<std::string, int32_t>> special_tokens() const override;

  const SpmBpeSpec& spec() const { return spec_; }
  // The byte of a piece <0xNN>, or -1.
  static int byte_of_piece(std::string_view piece);

 private:
  // One run of text between added tokens, normalized (valid UTF-8);
  // `at_start`: it begins the text (Metaspace's prepend_scheme first).
  void encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;
  void check_id(int32_t id, size_t position) const;

  SpmBpeSpec spec_;
  std::unique_ptr<TextNormalizer> normalizer_;
  std::unordered_map<std::string, int32_t> id_of_;
  // (left id << 32 | right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merge_of_;
  int32_t byte_id_[256];  // <0xNN>'s id, -1 if absent
  std::vector<std::pair<std::string, int32_t>> raw_added_, normalized_added_;
  std::vector<bool> is_added_;  // by id
};

}  // namespace nk
