// A reward or attribute model folder (a sequence classifier,
// model.config().num_labels >= 1) with what scoring (prompt, completion)
// pairs needs: its own tokenizer, chat template and special tokens, so a
// pair is rendered as the model's own training rendered it
// (preference_data.h's render_sequence), whatever the policy's tokenizer.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "align/preference_data.h"
#include "core/allocator.h"
#include "data/chat/chat_template.h"
#include "model/transformer.h"

namespace nk {

class RewardScorer {
 public:
  // `key` (align.reward_model, align.attribute_model) names the folder in
  // errors; its chat template is the folder's own, else `chat_template` as
  // data.chat_template names it (with `policy_dir`); a chat record then
  // needing one that neither gives is the error, naming the record. nk::Error
  // naming `key` for a missing folder or a causal LM (num_labels 0).
  RewardScorer(const std::string& key, const std::string& dir, const std::string& chat_template,
               const std::string& policy_dir, const std::string& dtype, Device device,
               int64_t batch);
  ~RewardScorer();

  int64_t num_labels() const;
  int64_t max_seq_len() const { return model_->config().max_seq_len; }
  // The labels' names (HF's id2label): num_labels of them, or none.
  const std::vector<std::string>& labels() const;
  PreferenceRenderer renderer() const { return {*tok_, *tmpl_, specials_}; }
  // [seqs][num_labels]; nk::Error naming the key (a sequence longer than the
  // model's context, ...).
  std::vector<std::vector<float>> score(const std::vector<std::vector<int32_t>>& seqs) const;
  const std::string& key() const { return key_; }

 private:
  std::string key_, dir_;
  int64_t batch_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<Tokenizer> tok_;
  std::shared_ptr<const ChatTemplate> tmpl_;
  ChatSpecials specials_;
};

// The template `name` (data.chat_template) names for `model_dir`, else one
// whose every render fails with "KEY: WHY" (a file of string prompts needs
// none; the first chat record that does names itself in the error).
std::shared_ptr<const ChatTemplate> chat_template_or_deferred(const std::string& name,
                                                              const std::string& model_dir,
                                                              const std::string& key);

}  // namespace nk
