// Supervised fine-tuning samples: JSONL records (OpenAI's chat form or NeMo's
// prompt/answer form, plain or zstd) rendered with a chat template, tokenized
// once as a whole, with a mask of the tokens the loss covers.
//
//   {"messages": [{"role": "system"|"user"|"assistant"|"tool", "content": "..."}, ...]}
//   {"input": "prompt", "output": "answer"}           (key names configurable;
//                                                      an optional system key)
//
// The mask is derived from the rendered text's segments (chat_template.h):
// token i is trained when any of its bytes lies in a trained segment. The
// tokens are those of the whole rendered text, exactly what generation feeds
// the model for the same conversation, not a concatenation of per-segment
// encodings (which differ at the segment edges for SentencePiece's leading
// space).
#pragma once
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "data/chat/chat_template.h"
#include "data/dataset/epoch_order.h"
#include "data/dataset/packing.h"
#include "data/dataset/sample_dataset.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

enum class LossOn { Assistant, All };
enum class OverlongSample { Truncate, Drop };

struct SftOptions {
  std::string messages_key = "messages";
  std::string input_key = "input", output_key = "output", system_key = "system";
  LossOn loss_on = LossOn::Assistant;
  int64_t max_tokens = 0;  // a sample's token limit (> 0): seq_len + 1 for training
  OverlongSample overlong = OverlongSample::Truncate;
};

// One conversation of a record; nk::Error naming `where` (FILE:LINE) and the
// key: no messages and no input/output keys, a message that is not an object
// with string role and content (null only beside an assistant's tool_calls),
// a role other than system/user/assistant/tool, no assistant turn (nothing
// to learn), an empty output. A message's other keys (tool_calls,
// tool_call_id, name, ...) go to the template as given.
std::vector<ChatMessage> conversation_from_record(const nlohmann::ordered_json& record,
                                                  const SftOptions& opt, const std::string& where);

struct SftSample {
  std::vector<int32_t> tokens;
  std::vector<uint8_t> trained;  // 1: token i is predicted by the loss
};

// The tokens of the segments' text (special-token strings as their ids) and
// the mask, as above. loss_on = All marks every token.
SftSample tokenize_chat(const std::vector<ChatSegment>& segments, const Tokenizer& tok,
                        LossOn loss_on = LossOn::Assistant);

struct SftStats {
  int64_t records = 0;         // samples kept
  int64_t truncated = 0;       // kept with their tail cut to max_tokens
  int64_t dropped = 0;         // over max_tokens and dropped, or nothing trained left
  int64_t tokens = 0;          // kept tokens
  int64_t trained_tokens = 0;  // kept tokens the loss covers
};

struct SftData {
  std::vector<std::vector<int32_t>> tokens;  // per sample
  std::vector<std::vector<uint8_t>> trained;
  SftStats stats;
};

// Every record of a JSONL file (plain or zstd) as a sample. nk::Error naming
// the file and line for bad records (see conversation_from_record) and for a
// conversation the template refuses; an overlong sample is cut or dropped by
// opt.overlong and counted; a sample whose trained tokens were all cut off is
// dropped and counted. Errors for a file with no usable sample.
// One JSONL record (`line`; `where` is its FILE:LINE for errors) rendered by
// `tmpl`: what read_sft_jsonl does with each line before tokenizing.
std::vector<ChatSegment> render_record(std::string_view line, const std::string& where,
                                       const ChatTemplate& tmpl, const ChatSpecials& specials,
                                       const SftOptions& opt);

SftData read_sft_jsonl(const std::string& path, const ChatTemplate& tmpl,
                       const ChatSpecials& specials, const Tokenizer& tok, const SftOptions& opt);

// Training rows of seq_len tokens: packed (first-fit-decreasing, attention
// within each sample) or one sample per row, padded. Targets ignore the
// untrained tokens (packing.h's loss masks).
PackedRows sft_rows(const SftData& data, int64_t seq_len, bool pack, int32_t pad_id);

// The rows as a training dataset: an endless sequence of epochs, each the
// rows in an order shuffled by (seed, epoch) (shuffle = false: file order),
// so sample i depends only on i and a resumed run reads what an
// uninterrupted one would.
class SftDataset : public SampleDataset {
 public:
  SftDataset(PackedRows rows, uint64_t seed, bool shuffle, std::string name);
  int64_t size() const override { return INT64_MAX; }
  int64_t seq_len() const override { return rows_.seq_len; }
  void sample(int64_t, int32_t*) const override;  // rows only: an internal error
  std::string name() const override { return name_; }
  std::string describe(int64_t i) const override;
  int64_t max_segments() const override { return rows_.max_segments; }
  void row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
           int32_t* cu_seqlens) const override;
  const PackedRows& rows() const { return rows_; }

 private:
  int64_t row_of(int64_t i) const;  // which row sample i is
  PackedRows rows_;
  std::string name_;
  EpochOrder order_;
};

}  // namespace nk
