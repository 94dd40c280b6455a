// The datasets a training run reads, from its config: random windows of a
// text corpus (data.path), or Megatron GPT datasets over one indexed dataset
// (data.prefix) or a weighted blend of them (data.blend), split by documents
// (data.split) into the train and valid parts.
#pragma once
#include <memory>
#include <string>

#include "data/chat/sft_data.h"
#include "data/dataset/sample_dataset.h"
#include "train/train_config.h"

namespace nk {

struct TrainData {
  std::shared_ptr<const SampleDataset> train;
  // nullptr: no validation (an empty or too small valid split, with a warning).
  std::shared_ptr<const SampleDataset> valid;
  std::string summary;  // one line for the log
};

// The train part holds train.steps * train.global_batch samples (more for
// text); the valid part val_batches * micro_batch, read from its start at
// every validation. nk::Error naming the config key and file for bad data.
TrainData build_train_data(const TrainConfig& cfg);

// What fine-tuning reads its conversations with (data.sft_path): the
// tokenizer, the chat template (data.chat_template, or train.init_from's own:
// chat_template_for), the special-token strings (the tokenizer's, and those
// its tokenizer_config.json names), and the sample options. nk::Error naming
// the key.
struct SftInputs {
  std::unique_ptr<Tokenizer> tok;
  std::shared_ptr<const ChatTemplate> tmpl;
  ChatSpecials specials;
  SftOptions opt;
};
SftInputs sft_inputs(const TrainConfig& cfg);

}  // namespace nk
