// A Nekton tokenizer as llama.cpp's GGUF tokenizer metadata (tokenizer.ggml.*):
//   SentencePiece (BPE models)  model "llama": pieces as stored, scores, types
//   SentencePiece-style BPE     model "llama" from Hugging Face's tokenizer.json
//     (spm_bpe_tokenizer.h)     (Llama 2, Mistral, Gemma, Phi-3): the pieces; a
//                               piece's score minus the rank of the first merge
//                               that makes it (llama.cpp merges the best-scoring
//                               pair, which is then Hugging Face's order);
//                               added tokens control (special) or user-defined;
//                               add_space_prefix from Prepend "▁" or Metaspace
//   byte-level BPE              model "gpt2": tokens spelled in GPT-2's
//                               byte-to-unicode alphabet, merges "a b" in rank
//                               order, pre-tokenizer name from the regex
//   bytes                       model "gpt2" with the 256 byte tokens, no merges
// The token list is padded to the model's vocab_size with "[PAD<id>]" tokens
// of type unused, as llama.cpp's converter does (the embedding has that many rows).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "ckpt/gguf_writer.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

// llama.cpp's token types (llama_token_type).
enum GgufTokenType : int32_t {
  kTokNormal = 1,
  kTokUnknown = 2,
  kTokControl = 3,
  kTokUserDefined = 4,
  kTokUnused = 5,
  kTokByte = 6,
};

struct GgufVocab {
  std::string model;  // tokenizer.ggml.model: "llama" or "gpt2"
  std::string pre;    // tokenizer.ggml.pre ("gpt2" only): "gpt-2", "llama-bpe", ...
  std::vector<std::string> tokens;
  std::vector<float> scores;  // "llama" only
  std::vector<int32_t> types;
  std::vector<std::string> merges;  // "gpt2" only
  int32_t bos = -1, eos = -1, unk = -1, pad = -1;
  bool add_bos = false, add_space_prefix = false;
};

// nk::Error when the tokenizer has more ids than the model's vocabulary, or
// has no llama.cpp equivalent (a SentencePiece unigram model, a BPE regex
// llama.cpp does not know).
GgufVocab gguf_vocab(const Tokenizer& tok, int64_t model_vocab_size);

// Adds the tokenizer.ggml.* keys.
void add_gguf_vocab(GgufWriter& w, const GgufVocab& v);

// The merges that rebuild a byte-level BPE vocabulary (tokens[r] = bytes of
// rank r, "" for a hole): for each multi-byte token, the two tokens that
// tiktoken's merge loop, limited to lower ranks, leaves; in rank order, each
// written as "A B" in GPT-2's byte-to-unicode spelling.
std::vector<std::string> bpe_merges(const std::vector<std::string>& tokens);

// Bytes -> GPT-2's byte-to-unicode spelling (UTF-8).
std::string gpt2_spelling(const std::string& bytes);

}  // namespace nk
