// Hugging Face's tokenizer.json for byte-level BPE (GPT-2, Llama 3, Qwen2 and
// the like ship only this file) read into the BpeVocab that BpeTokenizer runs:
//   model      {type: "BPE", vocab: {token: id}, merges: ["a b" | ["a", "b"]],
//               ignore_merges}, tokens spelled in GPT-2's byte-to-unicode alphabet
//   pre_tokenizer  ByteLevel {use_regex: true} (GPT-2's pattern), or a Sequence
//               of Split {pattern: {Regex}, behavior: "Isolated"} then ByteLevel
//               {use_regex: false} (Llama 3's)
//   normalizer     null, or the normalizers of text_normalizer.h (Qwen2's NFC)
//   added_tokens   the special tokens: those with normalized false (special
//               ones, by default) matched in the raw text, the others in the
//               normalized text between them (Hugging Face's AddedVocabulary)
// and tokenizer_config.json's eos_token as the end-of-document token.
//
// BpeTokenizer merges by the id of the merged token (tiktoken's rule) and
// emits a piece that is a whole token as that token; Hugging Face merges by
// the rank of the pair, and with ignore_merges takes the same shortcut. What
// is refused here because the two would differ: merges not in the order of the
// ids of the tokens they make, and, without ignore_merges, a token that
// merging its own bytes does not give. On the tokenizers that pass (those
// converted from tiktoken, as Llama 3's, and GPT-2's) the tests compare the ids
// with Hugging Face's own implementation. Every option this cannot honour is
// an nk::Error naming the file and the JSON key. A SentencePiece-style BPE
// (byte_fallback, Metaspace) is hf_spm_json.h's to read.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer/bpe_vocab.h"

namespace nk {

// The vocabulary of `tokenizer_json`, read from `path` (named in errors).
// `tokenizer_config` is the parsed tokenizer_config.json beside it, or null:
// its eos_token, which must be one of the added tokens, becomes the eod;
// without one, <|endoftext|> or else <|end_of_text|> (Llama 3's). Its
// bos_token likewise becomes the bos; without one, <|begin_of_text|> if
// added, else none. The name is `path`; callers may replace it.
BpeVocab hf_bpe_vocab(const nlohmann::json& tokenizer_json, const std::string& path,
                      const nlohmann::json& tokenizer_config = nullptr,
                      const std::string& config_path = "tokenizer_config.json");

}  // namespace nk
