#include "data/data_config.h"

#include "core/error.h"
#include "data/dataset/gpt_indices.h"

namespace nk {

void DataConfig::bind(ConfigBinder& b) {
  b.bind("data.path", path, "UTF-8 text file (optionally .gz/.dz) to train on, byte-level tokens");
  b.bind("data.prefix", prefix,
         "Megatron indexed dataset PREFIX (.bin/.idx) to train on (instead of data.path)");
  b.bind("data.blend", blend,
         "weighted indexed datasets: \"0.3,PREFIX1,0.7,PREFIX2\" (in YAML also a list)");
  b.bind("data.split", split,
         "train,valid,test weights over the documents of data.prefix / data.blend");
  b.bind("data.tokenizer", tokenizer,
         "tokenizer that made the data (name, file or folder), kept with the saved model; "
         "default: bytes for data.path, none for indexed data");
  b.bind("data.cache_dir", cache_dir,
         "folder for the cached sample indices (default: the dataset's folder/cache)");
  b.bind("data.val_fraction", val_fraction,
         "data.path only: last fraction of the tokens held out for validation");
  b.bind("data.max_bytes", max_bytes, "read at most this many bytes of the corpus (0 = all)");
  b.bind_with<std::string>("data.invalid_utf8", replace_invalid_utf8 ? "replace" : "error",
                           "invalid UTF-8 in the corpus: error, or replace (with U+FFFD)",
                           [&](const std::string& v) {
                             if (v != "error" && v != "replace")
                               fail("data.invalid_utf8: expected error or replace, got '{}'", v);
                             replace_invalid_utf8 = v == "replace";
                           });
  b.bind("data.sft_path", sft_path,
         "fine-tuning: JSONL (plain or zstd) of {\"messages\": [...]} or {\"input\", \"output\"} "
         "records");
  b.bind("data.sft_valid_path", sft_valid_path, "fine-tuning: validation JSONL (optional)");
  b.bind("data.chat_template", chat_template,
         "fine-tuning: auto (train.init_from's own Jinja template, from its "
         "tokenizer_config.json), a FILE.jinja, or chatml, llama3, llama2, mistral, gemma, phi3, "
         "plain");
  b.bind("data.loss_on", loss_on, "fine-tuning: tokens the loss covers: assistant or all");
  b.bind("data.pack", pack, "fine-tuning: pack several samples into each row");
  b.bind("data.overlong", overlong,
         "fine-tuning: a sample longer than train.seq_len: truncate or drop (counted)");
  b.bind("data.shuffle", shuffle, "fine-tuning: shuffle the rows every epoch (by train.seed)");
  b.bind("data.messages_key", messages_key, "fine-tuning: the key of a record's messages");
  b.bind("data.input_key", input_key, "fine-tuning: the prompt's key of a prompt/answer record");
  b.bind("data.output_key", output_key, "fine-tuning: the answer's key of a prompt/answer record");
  b.bind("data.system_key", system_key,
         "fine-tuning: the optional system prompt's key of a prompt/answer record");
}

void DataConfig::check_training_source() {
  int sources = !path.empty() + !prefix.empty() + !blend.empty() + !sft_path.empty();
  if (sources == 0)
    fail(
        "data.path: no training data given (data.path=TEXT_FILE, data.prefix=INDEXED_PREFIX, "
        "data.blend=W1,PREFIX1,W2,PREFIX2 or data.sft_path=CONVERSATIONS.jsonl)");
  if (sources > 1)
    fail("data.{}: give only one of data.path, data.prefix, data.blend and data.sft_path",
         !sft_path.empty() ? "sft_path"
         : blend.empty()   ? "prefix"
                           : "blend");
  if (loss_on != "assistant" && loss_on != "all")
    fail("data.loss_on: expected assistant or all, got '{}'", loss_on);
  if (overlong != "truncate" && overlong != "drop")
    fail("data.overlong: expected truncate or drop, got '{}'", overlong);
  if (!blend.empty()) blend_sets = parse_blend(blend, "data.blend");
  if (indexed()) {
    try {
      parse_split(split);
    } catch (const Error& e) {
      throw e.with_context("data.split");
    }
  }
  if (!(val_fraction >= 0 && val_fraction < 1))
    fail("data.val_fraction: must be in [0, 1), got {}", val_fraction);
}

}  // namespace nk
