// A reward model's score (align.reward_model: a sequence classifier of one
// label, trained by align.method=rm or imported) of each (prompt,
// completion), rendered with the reward model's own tokenizer and chat
// template as its training rendered pairs (RewardScorer), whatever the
// policy's tokenizer. An empty completion cannot be rendered as one was in
// training; it gets the lowest score of its call (0 when every completion of
// the call is empty).
#pragma once
#include <memory>
#include <string>

#include "align/reward_scoring.h"
#include "align/rewards/reward_function.h"

namespace nk {

// Where the reward model comes from: the keys rejection sampling already
// reads (AlignSamplingConfig), and the policy's for its chat template.
struct RewardModelSource {
  std::string dir;                     // align.reward_model
  std::string dtype = "f32";           // align.scorer_dtype
  int64_t batch = 8;                   // align.score_batch_size
  std::string chat_template = "auto";  // data.chat_template (when the folder has none)
  std::string policy_dir;              // train.init_from
  Device device = Device::CPU;
};

class ModelReward : public RewardFunction {
 public:
  // nk::Error naming align.reward_model for a missing folder, a causal LM, or
  // a classifier of more than one label.
  explicit ModelReward(const RewardModelSource& src);
  std::vector<double> score(std::span<const RewardInput> in) override;

 private:
  std::unique_ptr<RewardScorer> rm_;
};

}  // namespace nk
