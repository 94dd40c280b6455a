// Byte-level BPE as in GPT-2 and tiktoken: pre-tokenize with a regex, then
// merge the bytes of each piece by rank. Encodes token for token what
// tiktoken (and, for GPT-2, OpenAI's gpt-3-encoder) give for the same text.
// A vocabulary from Hugging Face's tokenizer.json may carry a normalizer
// (Qwen2's NFC), applied first, as Hugging Face does.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer/bpe_merge.h"
#include "data/tokenizer/bpe_vocab.h"
#include "data/tokenizer/pretokenizer.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

class TextNormalizer;

class BpeTokenizer : public Tokenizer {
 public:
  // nk::Error if the vocabulary is unusable: a byte without a token, a token
  // given twice, a special whose id is a token, a pattern that does not
  // compile, or a normalizer that is not supported (text_normalizer.h).
  explicit BpeTokenizer(BpeVocab vocab);
  ~BpeTokenizer() override;

  std::string kind() const override { return "bpe"; }
  // One past the largest id, tokens and specials together (tiktoken's n_vocab).
  int64_t vocab_size() const override { return vocab_size_; }
  using Tokenizer::encode;
  // With a normalizer, the ids of the normalized text (decode gives that back).
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  // Hugging Face's order: specials not normalized are found in the raw text;
  // the text between them is normalized, and the normalized specials (their
  // text normalized too) are found in that.
  void encode_with_specials(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode(std::span<const int32_t> ids) const override;
  std::string token_bytes(int32_t id) const override;
  // The vocabulary's eod special, else <|endoftext|>; -1 if it has neither.
  int32_t eod_id() const override { return eod_id_; }
  // The vocabulary's bos special; -1 if it names none.
  int32_t bos_id() const override { return bos_id_; }
  std::vector<std::pair<std::string, int32_t>> special_tokens() const override;

  const BpeVocab& vocab() const { return vocab_; }
  const PreTokenizer& pretokenizer() const { return pretok_; }
  // Rank of a byte string that is a token, else -1.
  int32_t rank_of(std::string_view bytes) const { return ranks_.find(bytes); }

 private:
  // `text` is valid UTF-8 (and normalized).
  void encode_valid(std::string_view text, std::vector<int32_t>& out) const;
  // A run of valid UTF-8 between raw-matched specials: normalized, then split
  // on the normalized specials.
  void encode_run(std::string_view text, std::vector<int32_t>& out) const;
  // Nullptr if `id` is neither a token nor a special.
  const std::string* bytes_of(int32_t id) const;

  BpeVocab vocab_;
  RankMap ranks_;
  PreTokenizer pretok_;
  std::vector<std::pair<std::string, int32_t>> specials_;  // sorted by id
  std::unique_ptr<TextNormalizer> normalizer_;             // null: none
  // The specials matched in the raw text, and those matched (as normalized) after.
  std::vector<std::pair<std::string, int32_t>> raw_specials_, normalized_specials_;
  std::vector<const std::string*> special_text_;  // by id - tokens.size(), may be null
  int64_t vocab_size_ = 0;
  int32_t eod_id_ = -1;
  int32_t bos_id_ = -1;
  uint64_t id_;  // unique per instance: keys the per-thread piece cache
};

}  // namespace nk
