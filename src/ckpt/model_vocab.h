// A model's vocabulary against its tokenizer's. Models often have more
// embedding rows than their tokenizer has ids: Megatron pads the table to a
// multiple of 128 x tp, and so do most Hugging Face checkpoints (Qwen2's
// embedding has 151936 rows for about 151665 tokenizer ids). The rows past
// the tokenizer's ids are padding, which inference never samples
// (infer/sampler.h). Fewer rows than ids is the wrong pairing: those ids
// would have no embedding row.
#pragma once
#include <cstdint>
#include <string>

namespace nk {

// nk::Error naming both sizes and both sources when model_vocab <
// tokenizer_vocab; an info line (once per call) when model_vocab is larger.
// Sources read as "model folder 'DIR'", "tokenizer 'bytes'" and the like.
void check_model_vocab(int64_t model_vocab, const std::string& model_source,
                       int64_t tokenizer_vocab, const std::string& tokenizer_source);

}  // namespace nk
