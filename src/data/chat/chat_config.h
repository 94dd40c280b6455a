// What a model folder says about chatting, wherever its files are: a
// Hugging Face folder keeps tokenizer_config.json (and chat_template.jinja,
// which newer transformers write beside it) at the top; a folder `nekton
// import hf` wrote keeps them under tokenizer/. Both are read.
#pragma once
#include <string>

#include "data/chat/chat_template.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

// DIR/NAME, else DIR/tokenizer/NAME; "" when neither exists.
std::string find_model_file(const std::string& model_dir, const std::string& name);

// The special-token strings a chat template writes: the tokenizer's bos and
// eos (its end-of-document token; <s>, <bos> or <|begin_of_text|> for bos),
// then what the folder's tokenizer_config.json names (bos_token, eos_token,
// unk_token, pad_token, sep_token, cls_token, mask_token: strings or
// {"content": ...}), which wins. nk::Error naming the file if it is not JSON.
ChatSpecials chat_specials(const Tokenizer& tok, const std::string& model_dir);

// chat_template_for(name, model_dir) for data that may not need a template
// (records of plain strings): when there is none, a template whose every
// render fails with that error, prefixed by `key` ("data.chat_template: ..."),
// so the first record that needs one names itself and the cause.
std::shared_ptr<const ChatTemplate> chat_template_if_any(const std::string& name,
                                                         const std::string& model_dir,
                                                         const std::string& key);

}  // namespace nk
