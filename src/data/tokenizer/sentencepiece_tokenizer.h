// SentencePiece models (.model files, as shipped with Llama 1/2, Mistral, T5...)
// behind the Tokenizer interface, and training of new ones. Both wrap Debian's
// libsentencepiece, so ids are exactly those of the reference implementation:
// encode(text) equals `spm_encode --model M --output_format=id` on the same bytes.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "data/tokenizer/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace nk {

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Opens PATH (a serialized ModelProto). nk::Error naming the file when it is
  // missing, unreadable or does not parse as a SentencePiece model.
  static std::unique_ptr<SentencePieceTokenizer> open(const std::string& path);
  // From the bytes of a .model file; `name` is used in error messages.
  static std::unique_ptr<SentencePieceTokenizer> from_bytes(std::string_view model_bytes,
                                                            const std::string& name);
  ~SentencePieceTokenizer() override;

  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override;
  using Tokenizer::encode;
  // The model's own normalization and segmentation, as SentencePiece's Encode:
  // no <s>/</s> added (preprocess appends eod_id() = </s> after each document;
  // a Llama prompt starts with <s> = bos_id(), which callers prepend). With
  // add_dummy_prefix (Llama) a leading "▁" is implied. Invalid UTF-8 follows
  // SentencePiece's normalizer, which differs from the interface default: each
  // invalid byte becomes one U+FFFD, which then byte-falls-back to <0xEF>
  // <0xBF> <0xBD> unless U+FFFD is in the vocabulary. Newlines are ordinary
  // characters here (Llama: <0x0A>); spm_encode, which reads line by line, never
  // sees them. Control-symbol strings such as "<s>" in the text are plain text.
  void encode(std::string_view text, std::vector<int32_t>& out) const override;
  // Control symbols and <unk> written in the text become their ids; the text
  // between them is encoded as by encode() (each span with its dummy prefix,
  // as SentencePiece does for every call).
  void encode_with_specials(std::string_view text, std::vector<int32_t>& out) const override;
  // SentencePiece's DecodeIds: "▁" becomes a space, the dummy-prefix space of
  // the first piece is dropped, control symbols decode to nothing, <unk> to
  // " ⁇ ", and byte pieces that do not form valid UTF-8 become U+FFFD per byte.
  // nk::Error naming the id and its position for an id outside the vocabulary.
  std::string decode(std::span<const int32_t> ids) const override;
  // The piece with "▁" as a space and a byte piece <0xAB> as its byte; control
  // symbols and <unk> give their piece text ("<s>", "<unk>").
  std::string token_bytes(int32_t id) const override;
  // The piece exactly as stored in the model ("▁the", "<0x0A>", "<s>").
  std::string piece(int32_t id) const;
  int32_t eod_id() const override;  // </s> (eos_id), -1 if the model has none
  int32_t bos_id() const override;  // <s>, -1 if none
  int32_t unk_id() const;
  int32_t pad_id() const;  // -1 if none
  // The piece's score (log probability for unigram, minus the merge order for BPE).
  float score(int32_t id) const;
  enum class PieceType { kNormal, kUnknown, kControl, kUnused, kByte };
  PieceType piece_type(int32_t id) const;
  // <unk> and control symbols (<s>, </s>, ...) as (piece, id), in id order.
  std::vector<std::pair<std::string, int32_t>> special_tokens() const override { return specials_; }
  // The model's algorithm: "bpe", "unigram", "word" or "char".
  std::string model_type() const;
  // The normalizer's add_dummy_prefix (a "▁" implied before the text).
  bool add_dummy_prefix() const;
  // What the .vocab file next to a trained model holds: "piece\tscore" lines.
  std::string vocab_text() const;
  const std::string& path() const { return path_; }

 private:
  SentencePieceTokenizer() = default;
  void check_id(int32_t id, int64_t position) const;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
  std::string path_;
  std::vector<std::pair<std::string, int32_t>> specials_;
};

// Training options; the defaults are Llama 1/2's tokenizer settings.
struct SentencePieceTrainOptions {
  // Text files, one sentence per line (gzip/dictzip .gz/.dz read transparently).
  std::vector<std::string> inputs;
  int64_t vocab_size = 32000;
  std::string model_type = "bpe";  // bpe | unigram | char | word
  double character_coverage = 0.99995;
  bool byte_fallback = true;
  bool split_digits = true;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = false;
  std::string normalization_rule_name = "identity";
  // Sentences sampled from the input (0 = all of them); lines longer than
  // max_sentence_length bytes are skipped, as spm_train does.
  int64_t input_sentence_size = 0;
  int64_t max_sentence_length = 4192;
  std::vector<std::string> user_defined_symbols;
  int num_threads = 0;   // 0 = all cores
  bool verbose = false;  // SentencePiece's progress log on stderr
};

// Trains a model with SentencePieceTrainer and returns the serialized .model
// bytes (nothing is written; callers save them atomically, with vocab_text()
// of the loaded model as the .vocab). <unk>=0, <s>=1, </s>=2, no <pad>.
// nk::Error naming the input file for a missing or unreadable input, and
// SentencePiece's message for an impossible setting (e.g. a vocabulary larger
// than the text supports).
std::string train_sentencepiece(const SentencePieceTrainOptions& opts);

}  // namespace nk
