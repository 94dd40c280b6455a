#include "align/rewards/model_reward.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk {

ModelReward::ModelReward(const RewardModelSource& src) {
  if (src.dir.empty())
    fail(
        "align.reward_model: align.reward_funcs lists model, but no reward model folder is "
        "given");
  rm_ = std::make_unique<RewardScorer>("align.reward_model", src.dir, src.chat_template,
                                       src.policy_dir, src.dtype, src.device, src.batch);
  if (rm_->num_labels() != 1)
    fail("align.reward_model '{}': {} labels ({}); a reward is one number (a num_labels 1 model)",
         src.dir, rm_->num_labels(), fmt::join(rm_->labels(), ", "));
}

std::vector<double> ModelReward::score(std::span<const RewardInput> in) {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<size_t> of;  // the rollout of each sequence
  for (size_t i = 0; i < in.size(); ++i) {
    if (in[i].completion.empty()) continue;
    if (!in[i].prompt) fail("{}: no prompt", rollout_name(in, i));
    seqs.push_back(
        render_sequence(*in[i].prompt, in[i].completion, rm_->renderer(), rollout_name(in, i)));
    if (int64_t(seqs.back().size()) > rm_->max_seq_len())
      fail("{}: {} tokens as align.reward_model renders it, more than its context of {}",
           rollout_name(in, i), seqs.back().size(), rm_->max_seq_len());
    of.push_back(i);
  }
  std::vector<double> v(in.size(), 0.0);
  if (seqs.empty()) return v;
  const std::vector<std::vector<float>> s = rm_->score(seqs);
  double lowest = INFINITY;
  for (size_t k = 0; k < s.size(); ++k) {
    const double x = s[k].at(0);
    if (!std::isfinite(x)) fail("{}: align.reward_model scored it {}", rollout_name(in, of[k]), x);
    v[of[k]] = x;
    lowest = std::min(lowest, x);
  }
  for (size_t i = 0; i < in.size(); ++i)
    if (in[i].completion.empty()) v[i] = lowest;
  return v;
}

}  // namespace nk
