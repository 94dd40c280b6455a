// Online RL (align.method=grpo, rloo) as a TrainObjective: the Trainer's loop,
// resume, checkpoints and export, with the data made as it trains. At the
// first step of each round (rollouts.h) the objective
//   1. generates the round's completions with the batched Generator over the
//      policy's live weights (the Transformer the optimizer updates: no copy,
//      no weight sync; a fresh paged KV cache each round, so no cached prefix
//      outlives the weights it was computed with), each data-parallel rank
//      the completions k with k % dp = rank, seeded per (prompt position,
//      generation), so any layout draws the same ones. Where the model is in
//      pieces (tensor, pipeline or expert parallel, FSDP) or forwards chunks of rows
//      (context parallel) the live weights are gathered into a whole model
//      on every rank for the round (as veRL hands FSDP's weights to its
//      generator), every rank generating the k with k % world = rank; freed
//      after step 3, or over a frozen base kept for the next round, which
//      gathers the trainable parameters alone;
//   2. scores its completions (the reward functions), and the ranks sum
//      every completion's tokens, flags and rewards, so each holds the whole
//      round (advantages are normalised over whole groups);
//   3. computes the old policy's (when the round makes several steps) and
//      the reference's per-token log-probabilities of the completions this
//      rank trains on (reference: the policy with its adapters off, or a
//      frozen copy; none with align.kl_coef = 0 under GRPO);
// then every micro-batch runs the policy's forward, rl_loss.h's per-token
// terms and the head's per-token backward.
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "align/align_config.h"
#include "align/critic.h"
#include "align/online_config.h"
#include "align/prompt_data.h"
#include "align/rewards/reward_input.h"
#include "align/rollouts.h"
#include "data/tokenizer/tokenizer.h"
#include "train/train_objective.h"

namespace nk {

// The reward functions' scores of this rank's completions (RewardSet::score;
// the same parts, by name, for any number of inputs, none included).
using OnlineScorer = std::function<RewardScores(std::span<const RewardInput>)>;

// The prompts, rendered (chat prompts with the generation prompt) and cut
// to their last max_prompt_length tokens.
struct OnlinePrompts {
  PromptRecords records;
  std::vector<std::vector<int32_t>> tokens;
  int64_t truncated = 0;
};

class OnlineObjective : public TrainObjective {
 public:
  // tok: the policy's tokenizer; end_ids: ids besides its eod that end a
  // completion (a chat model's end-of-turn tokens). reference: where the
  // reference log-probabilities come from when align.kl_coef > 0
  // (AdapterOff or Copy).
  OnlineObjective(const TrainConfig& cfg, const OnlineRlConfig& rl,
                  std::shared_ptr<const OnlinePrompts> prompts, std::shared_ptr<Tokenizer> tok,
                  std::vector<int32_t> end_ids, OnlineScorer scorer, ReferenceSource reference);
  TrainData data(const TrainConfig& cfg) override;
  void prepare(Transformer& model, bool fresh) override;
  bool online() const override { return true; }
  void before_step(Transformer& model, int64_t step) override;
  void checkpoint_saved(int64_t step) override;
  double train_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                           float grad_scale) override;
  double eval_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch) override;
  bool staged() const override { return true; }
  // Context parallel: each rank's tokens' terms (they are per token).
  bool splits_rows() const override { return true; }
  double head_micro_batch(Transformer& model, Activations& a, const MicroBatch& batch,
                          float grad_scale, bool train) override;
  // reward, reward_std, rewards/NAME/mean and /std, accuracy (RewardTally's
  // figures over the round), frac_reward_zero_std, completion length, clip ratios, kl, entropy (the
  // sampled tokens' mean -log p), and the round's generation, scoring and log-probability times (on
  // the step that made the round).
  ObjectiveMetrics take_metrics(bool eval) override;
  // Validation prompts (align.valid_path), rendered as the training ones: at
  // each validation step every one of them, in file order, gets
  // align.num_generations completions from the live policy, scored by the
  // reward functions (collective: the ranks share the generations as a
  // round's). validate's figures: take_metrics' reward ones and the
  // completions' mean length and clipped ratio, over them. None without.
  void set_valid_prompts(std::shared_ptr<const OnlinePrompts> p) { valid_prompts_ = std::move(p); }
  ObjectiveMetrics validate(Transformer& model) override;
  // PPO: a critic of its own (align.value_model) in place of a value head
  // on the policy's trunk: the round's values and the value loss are its,
  // its gradients clipped with the policy's, its state saved with each
  // checkpoint and read back on resume, its weights exported at the end.
  void set_critic(std::unique_ptr<Critic> critic) { critic_ = std::move(critic); }
  double own_grad_norm_squared() override;
  void own_step(double lr, float clip) override;
  void save_state(int64_t step) override;

  // The current round (tests), and one made elsewhere: its samples with
  // rewards set; advantages, old and reference log-probabilities computed
  // here (fixed rollouts for the loss's parity test).
  std::shared_ptr<const RolloutRound> round() const { return round_; }
  void set_round(Transformer& model, std::shared_ptr<RolloutRound> round);

 private:
  std::shared_ptr<RolloutRound> make_round(Transformer& model, int64_t round);
  // One batch of prompts (`prompts`: indices into `from`, G completions
  // each, their sampling seeds from seed_first on): this rank's completions
  // generated and scored, then every rank's summed in.
  struct Batch {
    std::vector<Rollout> samples;  // n x G
    std::vector<std::vector<double>> parts;
  };
  Batch generate_batch(Transformer& model, const OnlinePrompts& from,
                       std::span<const int64_t> prompts, uint64_t seed_first);
  // The validation's seeds start here (prompt i's: kValidSeeds + i), far
  // from any round's (a round's are its prompt positions in the stream).
  static constexpr uint64_t kValidSeeds = uint64_t(1) << 40;
  // Advantages, and the old and reference log-probabilities (PPO: values)
  // of this rank's training samples; figures of the round's besides the
  // rewards' (PPO's objective/ ones).
  ObjectiveMetrics finish_round(Transformer& model, RolloutRound& r);
  // This rank's round indices (the samples its replica trains), ascending.
  std::vector<int64_t> own_samples() const;
  // Whether the steps read the round's policy's log-probabilities, and the
  // reference's.
  bool needs_old_logps() const;
  bool steps_read_ref_logps() const;
  // A round read back on resume: fails, naming `files`, where a sample this
  // rank trains lacks the per-token values its steps read.
  void check_round_values(const RolloutRound& round, const std::vector<std::string>& files) const;
  // Each row's completion tokens' log-probabilities, and with `values` the
  // value head's value at each (the state before the token): computed by
  // this rank (rows_token_logps), or where the policy is gathered whole, by
  // the replica's peers in turn (ObjectiveRanks::replica_peers; collective).
  void token_logps(Transformer& model, const std::vector<const Rollout*>& rows,
                   std::vector<std::vector<float>>& out,
                   std::vector<std::vector<float>>* values = nullptr);
  void rows_token_logps(Transformer& model, const std::vector<const Rollout*>& rows,
                        std::vector<std::vector<float>>& out,
                        std::vector<std::vector<float>>* values);
  // PPO: per-token rewards (the KL penalty, the score at the end), GAE over
  // the round's values, advantages whitened over every rank's samples.
  ObjectiveMetrics ppo_advantages(RolloutRound& r, const std::vector<int64_t>& own);
  void log_completions(const RolloutRound& r);
  std::string round_key() const;

  TrainConfig cfg_;
  OnlineRlConfig rl_;
  std::shared_ptr<const OnlinePrompts> prompts_, valid_prompts_;
  std::shared_ptr<Tokenizer> tok_;
  std::vector<int32_t> end_ids_;
  OnlineScorer scorer_;
  ReferenceSource reference_;
  RolloutSchedule schedule_;
  std::shared_ptr<RolloutDataset> dataset_;
  std::shared_ptr<RolloutRound> round_;
  std::unique_ptr<Transformer> ref_model_;  // reference=copy
  std::unique_ptr<Critic> critic_;          // ppo with align.value_model
  bool critic_pending_ = false;             // resumed: its checkpoint read at the first step
  // ObjectiveRanks::whole_policy's copy over a frozen base, kept between rounds.
  std::unique_ptr<Transformer> whole_;
  std::vector<RewardScores::Part> parts_;  // the reward functions (names, weights), no values

  struct Sums {  // this rank's training tokens since the last take_metrics
    double tokens = 0, kl = 0, low = 0, high = 0, nll = 0;
    double pg = 0, vf = 0, vclip = 0;  // PPO's policy and value losses, clipped values
  };
  Sums sums_;
  ObjectiveMetrics round_metrics_;              // the round made since the last take_metrics
  double gen_seconds_ = 0, score_seconds_ = 0;  // this rank's, for the round being made
  int64_t gen_tokens_ = 0;
};

// The prompts of `records` rendered with `renderer`, cut to their last
// max_prompt_length tokens (counted).
struct PreferenceRenderer;
OnlinePrompts render_online_prompts(PromptRecords records, const PreferenceRenderer& renderer,
                                    const std::string& key, int64_t max_prompt_length);

}  // namespace nk
