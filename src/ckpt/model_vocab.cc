#include "ckpt/model_vocab.h"

#include "core/error.h"
#include "core/log.h"

namespace nk {

void check_model_vocab(int64_t model_vocab, const std::string& model_source,
                       int64_t tokenizer_vocab, const std::string& tokenizer_source) {
  if (model_vocab < tokenizer_vocab)
    fail(
        "the model's vocabulary has {} rows ({}) but the tokenizer has {} ids ({}): ids {}..{} "
        "would have no embedding; use the tokenizer the model was trained with, or a model with "
        "at least {} rows",
        model_vocab, model_source, tokenizer_vocab, tokenizer_source, model_vocab,
        tokenizer_vocab - 1, tokenizer_vocab);
  if (model_vocab > tokenizer_vocab)
    NK_INFO(
        "the model's vocabulary has {} rows ({}), the tokenizer {} ids ({}): ids {}..{} are "
        "padding and are never sampled",
        model_vocab, model_source, tokenizer_vocab, tokenizer_source, tokenizer_vocab,
        model_vocab - 1);
}

}  // namespace nk
