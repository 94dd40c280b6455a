// Reading and writing byte-level BPE vocabularies in the formats users have:
//   GPT-2:    encoder.json (token -> id, tokens spelled in GPT-2's byte-to-
//             unicode alphabet) + vocab.bpe (merges in rank order); Hugging
//             Face ships the same two files as vocab.json + merges.txt
//   tiktoken: NAME.tiktoken, one "<base64 token> <rank>" per line
//   Nekton:   a folder with vocab.tiktoken, tokenizer.json {type: "bpe",
//             pattern, specials, name, eod (when not <|endoftext|>)} and, when
//             the vocabulary can be written that way, encoder.json + vocab.bpe
//             as well.
//   Hugging Face's tokenizer.json: read by hf_tokenizer_json.h.
// Every parse error is an nk::Error naming the file and line.
#pragma once
#include <memory>
#include <string>
#include <string_view>

#include "data/tokenizer/bpe_vocab.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

// OpenAI's names: "gpt2", "r50k_base", "p50k_base", "cl100k_base", "o200k_base".
bool is_openai_encoding(const std::string& name);
// tiktoken's pat_str and special tokens for one of those names.
std::string openai_pattern(const std::string& name);
std::vector<std::pair<std::string, int32_t>> openai_specials(const std::string& name);

// GPT-2's pair of files. Ids must equal ranks: the 256 single bytes take ids
// 0..255 (in any order), merge line i (after the "#version" header) makes the
// token with id 256 + i, and entries after the merges are special tokens.
// The result has no pattern (callers set it) and name = encoder_json.
BpeVocab load_gpt2_vocab(const std::string& encoder_json, const std::string& vocab_bpe);

// A .tiktoken rank file. Ranks may have holes (p50k_base has none at 50256);
// holes are empty strings in tokens. No pattern or specials are set.
BpeVocab load_tiktoken_vocab(const std::string& path);

// Writes `vocab` into folder `dir` (created if needed; files replaced
// atomically): vocab.tiktoken, tokenizer.json, and encoder.json + vocab.bpe
// when every token above the 256 bytes is the merge of two lower-ranked
// tokens and there are no holes. load_tokenizer(dir) reopens it.
void save_bpe_tokenizer(const BpeVocab& vocab, const std::string& dir);

// Reads a folder of one of these kinds, the first that applies:
//   - written by save_bpe_tokenizer (Nekton's tokenizer.json, with a "type")
//   - Hugging Face's tokenizer.json of a byte-level BPE (hf_tokenizer_json.h;
//     the eod from tokenizer_config.json's eos_token), unless a SentencePiece
//     tokenizer.model sits beside it
//   - encoder.json + vocab.bpe or vocab.json + merges.txt (GPT-2's pattern,
//     specials from the vocabulary).
BpeVocab load_bpe_dir(const std::string& dir);

// The factory's BPE branch (see load_tokenizer): an OpenAI name, a FILE.tiktoken,
// or a folder as load_bpe_dir reads; a Hugging Face tokenizer.json of a
// SentencePiece-style BPE (hf_spm_json.h; in a folder, one without a
// tokenizer.model) is an SpmBpeTokenizer. Nullptr if `spec` is none of these
// (a SentencePiece folder, say), so the factory can try other kinds.
std::unique_ptr<Tokenizer> open_bpe_tokenizer(const std::string& spec);

// GPT-2's reversible byte <-> printable code point mapping (bytes_to_unicode).
uint32_t gpt2_byte_to_codepoint(unsigned char b);
// A token as encoder.json / vocab.json spell it (in that mapping) -> its bytes;
// false if a character is outside the mapping.
bool gpt2_spelling_to_bytes(std::string_view spelled, std::string& bytes);

}  // namespace nk
