// The data.* keys: what a run reads or writes and how to read it, one group
// that training, fine-tuning and `nekton preprocess` share (preprocess binds
// the keys it uses: tokenizer, prefix as its output, invalid_utf8).
#pragma once
#include <cstdint>
#include <string>

#include "core/config_bind.h"
#include "data/dataset/blended_dataset.h"

namespace nk {

struct DataConfig {
  // A training run reads exactly one source: `path` (a text file, byte-level
  // tokens), `prefix` (one indexed dataset), `blend` (weighted indexed
  // datasets) or `sft_path` (fine-tuning conversations).
  std::string path;
  std::string prefix;
  std::string blend;  // as given: "0.3,PREFIX1,0.7,PREFIX2"; parsed into `blend_sets`
  BlendSpec blend_sets;
  std::string split = "969,30,1";     // train,valid,test weights over indexed documents
  std::string tokenizer;              // a load_tokenizer() spec; "" = bytes, none for indexed data
  std::string cache_dir;              // "" = beside the (first) dataset, in cache/
  double val_fraction = 0.05;         // text data: last fraction of the tokens held out
  int64_t max_bytes = 0;              // of the text file read (0 = all)
  bool replace_invalid_utf8 = false;  // data.invalid_utf8=replace: U+FFFD instead of an error

  // Fine-tuning (`sft_path`): JSONL conversations rendered with a chat
  // template, the loss on the answers (data/chat/sft_data.h).
  std::string sft_path, sft_valid_path;
  std::string chat_template =
      "auto";                         // a built-in name, or auto: the model's tokenizer_config.json
  std::string loss_on = "assistant";  // assistant | all
  bool pack = false;                  // several samples per row (attention kept apart)
  std::string overlong = "truncate";  // a sample over train.seq_len: truncate | drop
  bool shuffle = true;                // rows in a new order each epoch (by train.seed)
  std::string messages_key = "messages", input_key = "input", output_key = "output",
              system_key = "system";

  void bind(ConfigBinder& b);
  bool indexed() const { return !prefix.empty() || !blend.empty(); }
  bool sft() const { return !sft_path.empty(); }
  // Training's checks (nk::Error naming the key): exactly one source, a
  // parseable blend (filling blend_sets) and split, val_fraction in [0, 1).
  void check_training_source();
};

}  // namespace nk
