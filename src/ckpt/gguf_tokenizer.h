// The tokenizer a GGUF file carries (tokenizer.ggml.*), the inverse of
// ckpt/gguf_vocab.h:
//   "llama"  a SentencePiece BPE model rebuilt from the pieces, scores and
//            types (byte fallback, add_space_prefix as the dummy prefix, no
//            normalisation), run by libsentencepiece as a .model file would be
//   "gpt2"   a byte-level BPE from the tokens (GPT-2's byte-to-unicode
//            spelling), the merges and the pre-tokenizer name (gpt-2,
//            llama-bpe, gpt-4o, default), read through the same checks as a
//            Hugging Face tokenizer.json (data/tokenizer/hf_tokenizer_json.h);
//            control tokens become specials, eos the end-of-document token.
// Other models and pre-tokenizers are an nk::Error naming the file and key.
#pragma once
#include <memory>

#include "ckpt/gguf_reader.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

// null when the file has no tokenizer.ggml.model.
std::unique_ptr<Tokenizer> gguf_tokenizer(const GgufFile& f);

}  // namespace nk
