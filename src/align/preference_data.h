// Preference data in the JSONL forms found on the Hugging Face hub, plain or
// zstd (JsonlReader), as token sequences two per example:
//
//   paired (DPO family, ORPO, SimPO)
//     standard        {"prompt": "...", "chosen": "...", "rejected": "..."}
//     conversational  {"prompt": [messages], "chosen": [messages], "rejected": [messages]}
//                     or without "prompt": chosen and rejected are whole
//                     conversations and their shared leading messages are the
//                     prompt (TRL's implicit prompt)
//   unpaired (KTO)    {"prompt": "..." | [messages], "completion": "..." | [messages],
//                      "label": true | false}
//
// Standard prompts and completions are tokenized as they are, each
// completion ended by the tokenizer's end-of-document token; conversational
// ones are rendered with the chat template as fine-tuning renders them
// (data/chat): the prompt messages with the generation prompt, then the
// completion as the rest of the whole conversation's rendering, whose
// assistant text and end-of-turn markers the loss covers. A sequence is the
// prompt's tokens then the completion's, and the loss (and log-probability)
// covers only completion tokens.
//
// Sequence 2i is example i's chosen completion (KTO: the example itself),
// 2i+1 its rejected one (KTO: example i's prompt with the completion of the
// example before it in its group of `kto_group` consecutive examples, the
// first taking the group's last: TRL's mismatched pairs for the KL estimate).
//
// Truncation (TRL's keep_end for the prompt): an example whose prompt and
// longest completion exceed max_length tokens keeps the last
// max_prompt_length tokens of its prompt (when set), then its completions
// are cut to fit. Counted, never silent.
#pragma once
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "align/preference_loss.h"
#include "data/chat/chat_template.h"
#include "data/dataset/epoch_order.h"
#include "data/dataset/sample_dataset.h"
#include "data/tokenizer/tokenizer.h"

namespace nk {

struct PreferenceDataOptions {
  bool unpaired = false;          // KTO's form
  int64_t max_length = 0;         // tokens in a sequence (train.seq_len)
  int64_t max_prompt_length = 0;  // 0: prompts are never cut
  int64_t kto_group = 1;          // examples per KL rotation group (per micro-batch)
  std::string prompt_key = "prompt", chosen_key = "chosen", rejected_key = "rejected";
  std::string completion_key = "completion", label_key = "label";
  // With `margins` (a reward model's data), paired records may hold a number
  // by which the chosen reward must beat the rejected one (TRL's "margin"
  // column), in every record or in none.
  bool margins = false;
  std::string margin_key = "margin";
};

struct PreferenceData {
  std::string path;
  // Per sequence [2 x examples]: its tokens and, per token, whether the loss
  // predicts it (completion tokens only); the prompt's length.
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<uint8_t>> trained;
  std::vector<uint8_t> desirable;  // per example (KTO); empty for pairs
  std::vector<double> margin;      // per pair, when the records have margins; else empty
  std::vector<int64_t> line;       // per example: its line in `path`
  int64_t truncated = 0;           // examples cut to fit
  int64_t examples() const { return int64_t(line.size()); }
  // "N of M pairs truncated ..." for the log.
  std::string summary() const;
};

// Every record of `path`. nk::Error naming PATH:LINE and the key for a
// record that is not an object, a missing or mistyped field, an empty
// completion, roles that do not fit (a completion must be assistant
// messages, a prompt end with a user message), a prompt that leaves no room
// for a completion token in max_length, a chosen and rejected sequence equal
// token for token, or a template that does not render the prompt as the
// conversation's beginning; nk::Error naming the file when it holds no record.
PreferenceData read_preference_jsonl(const std::string& path, const Tokenizer& tok,
                                     const ChatTemplate& tmpl, const ChatSpecials& specials,
                                     const PreferenceDataOptions& opt);

// One prompt or (prompt, completion) pair rendered exactly as
// read_preference_jsonl renders a record's: for generation from a prompt
// (rejection sampling, SteerLM) and for scoring a completion with a reward
// model, so both see what DPO and reward-model training see.
struct PreferenceRenderer {
  const Tokenizer& tok;
  const ChatTemplate& tmpl;
  const ChatSpecials& specials;
};

// True for a chat prompt (a list of messages), false for a string;
// nk::Error naming `where` (PATH:LINE: KEY) for anything else.
bool is_chat_prompt(const nlohmann::json& prompt, const std::string& where);

// The prompt's tokens as a sequence's beginning: a string's tokens as they
// are, or the messages (ending with the user's turn) rendered with the
// generation prompt. nk::Error naming `where` (PATH:LINE: KEY) for an empty
// or mistyped prompt, a bad message or role, or a template that refuses it.
std::vector<int32_t> render_prompt(const nlohmann::json& prompt, const PreferenceRenderer& r,
                                   const std::string& where);

// A whole sequence: the prompt's tokens, then the completion's as a chosen
// one is rendered (a string: its tokens and the end-of-document token; with
// a chat prompt, the assistant messages as the rest of the whole
// conversation's rendering). With a chat prompt a string completion is one
// assistant message. Never truncated. prompt_tokens (if given) receives the
// prompt's length.
// nk::Error naming `where` as render_prompt, and for an empty completion, a
// string prompt with a message completion, or a completion holding other
// than assistant messages.
std::vector<int32_t> render_sequence(const nlohmann::json& prompt, const nlohmann::json& completion,
                                     const PreferenceRenderer& r, const std::string& where,
                                     int64_t* prompt_tokens = nullptr);

// The sequences as training rows of max_length tokens, one per row, padded
// (targets -100): sample i is sequence 2 e + i % 2 of example e = the
// (i / 2)-th of an epoch's order, shuffled by (seed, epoch) (or file order),
// so both rows of an example meet in one micro-batch (an even micro_batch)
// and sample i depends only on i.
class PreferenceDataset : public SampleDataset {
 public:
  PreferenceDataset(std::shared_ptr<const PreferenceData> data, int64_t seq_len, int32_t pad_id,
                    uint64_t seed, bool shuffle, std::string name);
  int64_t size() const override { return INT64_MAX; }
  int64_t seq_len() const override { return seq_len_; }
  void sample(int64_t, int32_t*) const override;  // rows only: an internal error
  std::string name() const override { return name_; }
  std::string describe(int64_t i) const override;
  int64_t max_segments() const override { return 1; }
  void row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
           int32_t* cu_seqlens) const override;
  // Which sequence sample i is (2 x example + side): stable across epochs
  // and runs, the key of its reference log-probability.
  int64_t sequence_of(int64_t i) const;
  // Sequence s as a row (tokens, targets of seq_len each).
  void sequence_row(int64_t s, int32_t* tokens, int32_t* targets) const;
  const PreferenceData& data() const { return *data_; }

 private:
  int64_t example_of(int64_t i) const;
  std::shared_ptr<const PreferenceData> data_;
  int64_t seq_len_;
  int32_t pad_;
  std::string name_;
  EpochOrder order_;  // of the examples
};

}  // namespace nk
