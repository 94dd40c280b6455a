// A round of online RL's rollouts and how the Trainer's samples map onto it.
//
// Round r holds R completions, group-major: sample k is generation k % G of
// the round's prompt k / G. The Trainer reads samples in order, global batch
// by global batch; step s belongs to round s / U (U = ppo_epochs x R /
// global_batch optimizer steps a round makes), and its sample j is the
// round's completion (s % U % (R / GB)) x GB + j: each epoch walks the round
// in the same order (TRL's buffered generation batch).
//
// A sample is one row: the prompt then the completion, padded to seq_len;
// targets only on completion tokens (the loss and log-probabilities cover
// those), -100 elsewhere.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "align/rewards/reward_input.h"
#include "data/dataset/sample_dataset.h"

namespace nk {

struct Rollout {
  int64_t prompt = 0;           // the prompt's index in the prompts file
  std::vector<int32_t> tokens;  // the prompt's, then the completion's
  int64_t prompt_len = 0;
  bool truncated = false;  // stopped by align.max_tokens, not by an end token or stop string
  double reward = 0, advantage = 0;
  // Per completion token (completion() of them), this rank's training
  // samples only (empty where not needed or not this rank's): the round's
  // policy's (ppo_epochs > 1 or several steps a round) and the reference's.
  std::vector<float> old_logp, ref_logp;
  // PPO's, per completion token of this rank's training samples: the value
  // head's values when the round was made, the whitened GAE advantages and
  // the returns.
  std::vector<float> old_value, token_adv, returns;
  int64_t completion() const { return int64_t(tokens.size()) - prompt_len; }
};

struct RolloutRound {
  int64_t index = -1;
  std::vector<Rollout> samples;  // R, group-major
  // Each reward function's values (unweighted), [R] each.
  std::vector<RewardScores::Part> parts;
};

struct RolloutSchedule {
  int64_t samples = 0;       // R
  int64_t global_batch = 0;  // GB
  int64_t steps = 0;         // U
  int64_t round_of_step(int64_t step) const { return step / steps; }
  int64_t first_step(int64_t round) const { return round * steps; }
  // The round and completion that Trainer sample i (its consumed count) reads.
  int64_t round_of_sample(int64_t i) const { return i / global_batch / steps; }
  int64_t index_of_sample(int64_t i) const {
    const int64_t s = i / global_batch;
    return (s % steps) % (samples / global_batch) * global_batch + i % global_batch;
  }
};

// Sample r as a row of T tokens: tokens (padded with pad_id) and targets
// (the next token at a completion token's position before it, else -100).
void rollout_row(const Rollout& r, int64_t T, int32_t pad_id, int32_t* tokens, int32_t* targets);

// The Trainer's view of the current round (set by the objective before the
// round's first step is loaded).
class RolloutDataset : public SampleDataset {
 public:
  RolloutDataset(RolloutSchedule schedule, int64_t seq_len, int32_t pad_id, std::string name);
  void set_round(std::shared_ptr<const RolloutRound> round) { round_ = std::move(round); }
  int64_t size() const override { return INT64_MAX; }
  int64_t seq_len() const override { return seq_len_; }
  void sample(int64_t, int32_t*) const override;  // rows only: an internal error
  std::string name() const override { return name_; }
  std::string describe(int64_t i) const override;
  int64_t max_segments() const override { return 1; }
  void row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
           int32_t* cu_seqlens) const override;
  // The round's sample that Trainer sample i is (an internal error when the
  // round set is not i's).
  const Rollout& rollout(int64_t i) const;
  const RolloutSchedule& schedule() const { return schedule_; }

 private:
  RolloutSchedule schedule_;
  int64_t seq_len_;
  int32_t pad_;
  std::string name_;
  std::shared_ptr<const RolloutRound> round_;
};

// A round as a resumed run needs it mid-round (OUT_DIR/rollouts/round-R.rank-K.bin):
// written atomically after the round is made; read back, or null when the
// file is absent or was written under another key. nk::Error naming the file
// when it is corrupt.
std::string rollout_round_path(const std::string& out_dir, int64_t round, int64_t rank);
void save_rollout_round(const std::string& path, const std::string& key, const RolloutRound& r);
std::shared_ptr<RolloutRound> load_rollout_round(const std::string& path, const std::string& key);
// A round read back by a run resumed under any layout: every rank's file of
// the round in OUT_DIR/rollouts merged (their samples are the same; each
// holds the per-token values of the samples its replica trained), so a run
// saved under data parallelism resumes on another number of replicas. Null
// when no file of the round was written under `key`; nk::Error naming the
// files when two hold different samples. `files` lists those read.
std::shared_ptr<RolloutRound> load_rollout_round_of_every_rank(const std::string& out_dir,
                                                               int64_t round,
                                                               const std::string& key,
                                                               std::vector<std::string>* files);
// Removes every rank's round files of rounds before `round` (no rank needs
// them once a checkpoint of `round` is saved; a resume under fewer replicas
// leaves no file of the others behind).
void prune_rollout_rounds(const std::string& out_dir, int64_t round);

}  // namespace nk
