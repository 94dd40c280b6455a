// The one interface every tokenizer sits behind (bytes, byte-level BPE as in
// GPT-2 and tiktoken, SentencePiece), and the factory that opens one by name or
// path. Ids are int32 in [0, vocab_size()).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace nk {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // "bytes", "bpe", "sentencepiece" or "spm_bpe" (spm_bpe_tokenizer.h).
  virtual std::string kind() const = 0;
  virtual int64_t vocab_size() const = 0;
  // Appends the ids of `text` to `out`. Special-token strings in the text are
  // encoded as ordinary text (tiktoken's encode_ordinary). Invalid UTF-8 is
  // first replaced by U+FFFD per maximal subpart, as Node's and Python's UTF-8
  // decoders do when the reference implementations read the same bytes
  // (SentencePiece: one U+FFFD per invalid byte, as spm_encode does).
  // Thread-safe: preprocess encodes from several threads with one tokenizer.
  virtual void encode(std::string_view text, std::vector<int32_t>& out) const = 0;
  // As encode, but special-token strings (special_tokens()) become their ids.
  virtual void encode_with_specials(std::string_view text, std::vector<int32_t>& out) const {
    encode(text, out);
  }
  // The raw bytes of the ids, concatenated (may end inside a UTF-8 character).
  // nk::Error naming the id and its position for an id outside the vocabulary.
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  // The bytes one id stands for (a special token's text for a special).
  virtual std::string token_bytes(int32_t id) const = 0;
  // End-of-document id that preprocess appends after each document; -1 if none.
  virtual int32_t eod_id() const = 0;
  // Beginning-of-document id (Llama's <s>, Llama 3's <|begin_of_text|>) that
  // preprocess.prepend_bos puts first; -1 if the tokenizer has none.
  virtual int32_t bos_id() const { return -1; }
  // Special tokens as (text, id), in id order.
  virtual std::vector<std::pair<std::string, int32_t>> special_tokens() const { return {}; }

  std::vector<int32_t> encode(std::string_view text) const {
    std::vector<int32_t> out;
    encode(text, out);
    return out;
  }
};

// Walks `text` as runs of ordinary text and special-token strings: the
// leftmost special wins, and among specials starting at the same byte the
// longest. on_text gets each run between specials (never empty), on_special
// each special's id.
void split_on_specials(std::string_view text,
                       std::span<const std::pair<std::string, int32_t>> specials,
                       const std::function<void(std::string_view)>& on_text,
                       const std::function<void(int32_t)>& on_special);

// Opens a tokenizer from a spec:
//   "bytes"                                    one id per byte + end-of-text (257)
//   "gpt2" | "r50k_base" | "p50k_base" | "cl100k_base" | "o200k_base"
//                                              OpenAI's vocabularies, from the
//                                              npm-fetched assets (assets_dir())
//   DIR                                        encoder.json + vocab.bpe (GPT-2;
//                                              also under Hugging Face's names
//                                              vocab.json + merges.txt), a
//                                              tokenizer saved by Nekton, Hugging
//                                              Face's tokenizer.json of a
//                                              byte-level BPE (Llama 3; see
//                                              hf_tokenizer_json.h) or of a
//                                              SentencePiece-style BPE (Llama
//                                              2, Gemma; hf_spm_json.h), or a
//                                              folder with tokenizer.model
//                                              (SentencePiece, as HF ships it;
//                                              preferred to its tokenizer.json)
//   DIR/tokenizer.json                         the same as DIR
//   FILE.json                                  a tokenizer.json under another
//                                              name (Hugging Face's, with the
//                                              tokenizer_config.json beside it)
//   FILE.tiktoken                              tiktoken rank file (cl100k pattern
//                                              unless the name says otherwise)
//   FILE.model                                 SentencePiece model
// nk::Error naming the spec, file and line/offset when it cannot be opened.
std::unique_ptr<Tokenizer> load_tokenizer(const std::string& spec);

// Keeps the tokenizer with a saved model so that generation decodes with it:
// files (a .model, a .tiktoken, a saved BPE folder; a tokenizer JSON with its
// tokenizer_config.json) are copied into
// MODEL_DIR/tokenizer/ and MODEL_DIR/tokenizer.txt records the spec to reopen
// (relative to MODEL_DIR when it starts with "./"); names are recorded as is.
void store_tokenizer(const std::string& spec, const std::string& model_dir);
// The spec store_tokenizer recorded, resolved against MODEL_DIR; "" if none.
std::string stored_tokenizer(const std::string& model_dir);

// Folder of fetched third-party assets (npm packages with vocabulary files):
// $NEKTON_ASSETS if set, else <source tree>/assets. scripts/fetch_assets.sh fills it.
std::string assets_dir();

}  // namespace nk
