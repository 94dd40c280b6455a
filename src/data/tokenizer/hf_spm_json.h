// Hugging Face's tokenizer.json of a SentencePiece-style BPE (what
// transformers' convert_slow_tokenizer makes of Llama 2's, Mistral's,
// Gemma's and Phi-3's tokenizer.model) read into the SpmBpeSpec that
// SpmBpeTokenizer runs (spm_bpe_tokenizer.h lists the components):
//   Llama 2 / Mistral (legacy)  normalizer Sequence [Prepend "▁", Replace
//       " " -> "▁"], pre_tokenizer null, decoder Sequence [Replace "▁" -> " ",
//       ByteFallback, Fuse, Strip " " start 1]
//   Llama 2 / Phi-3 (recent transformers)  normalizer null, pre_tokenizer
//       Metaspace {replacement "▁", prepend_scheme first, split false},
//       decoder as above or Metaspace
//   Gemma 2/3  normalizer Replace " " -> "▁", pre_tokenizer Split " "
//       MergedWithPrevious (nothing left to split), decoder [Replace,
//       ByteFallback, Fuse]; <start_of_turn> and the like as added tokens
//   model  BPE {vocab, merges ("a b" or ["a", "b"]), byte_fallback, fuse_unk,
//       ignore_merges, unk_token}
// The end-of-document token is tokenizer_config.json's eos_token, else
// "</s>" or "<eos>"; the bos likewise ("<s>", "<bos>"). Every type or option
// this cannot honour is an nk::Error naming the file and the JSON path.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "data/tokenizer/spm_bpe_tokenizer.h"

namespace nk {

// Whether `tokenizer_json` describes a SentencePiece-style BPE rather than a
// byte-level one: model.byte_fallback true, or a Metaspace pre-tokenizer or
// decoder, or a decoder with ByteFallback.
bool is_hf_spm_bpe(const nlohmann::json& tokenizer_json);

// The spec of `tokenizer_json`, read from `path` (named in errors);
// `tokenizer_config` is the parsed tokenizer_config.json beside it, or null.
SpmBpeSpec hf_spm_bpe_spec(const nlohmann::json& tokenizer_json, const std::string& path,
                           const nlohmann::json& tokenizer_config = nullptr,
                           const std::string& config_path = "tokenizer_config.json");

}  // namespace nk
