// `nekton align align.method=grpo|rloo|ppo`: online RL from a prompts file. Every
// rank reads the prompts, builds the reward functions and a data-parallel
// Trainer over OnlineObjective (src/align/online_objective.h), which
// generates each round's completions with the policy's live weights.
#include <fmt/format.h>

#include <optional>

#include "align/align_config.h"
#include "align/online_config.h"
#include "align/online_objective.h"
#include "align/preference_data.h"
#include "align/rewards/reward_set.h"
#include "align/sampling_config.h"
#include "apps/commands.h"
#include "apps/run_ranks.h"
#include "core/log.h"
#include "data/chat/chat_config.h"
#include "dist/mpi/runtime.h"
#include "infer/model_source.h"
#include "train/trainer.h"

namespace nk {

int align_online_run(TrainConfig cfg, const AlignConfig& ac, const Config& c,
                     dist::MpiRuntime* mpi) {
  AlignSamplingConfig k;
  OnlineRlConfig rl;
  RewardsConfig rc;
  {
    ConfigReader r(c);
    k.bind(r);
    rl.bind(r);
    rc.bind(r);
  }
  rl.check(ac.method, ac.loss_type, k.rs, cfg.global_batch, cfg.seq_len, ac.data.max_prompt_length);
  if (ac.data_path.empty())
    fail("align.data_path: the prompts (JSONL) for align.method={}", ac.method);
  // A validation pass at every train.val_every steps over align.valid_path's
  // prompts; none without them.
  if (ac.valid_path.empty()) cfg.val_every = 0;
  // PPO's critic: a value head on the policy's trunk, added to the base, or
  // (align.value_model) a model of its own, whole on every rank.
  if (ac.method == "ppo" && rl.value_model.empty()) cfg.model.value_head = true;
  std::optional<RunRanks> ranks;
  if (mpi) ranks.emplace(cfg, *mpi);

  // Everything is read and checked before the Trainer writes anything.
  std::shared_ptr<Tokenizer> tok =
      load_model_tokenizer(cfg.data.tokenizer, cfg.init_from, "data.tokenizer");
  const std::shared_ptr<const ChatTemplate> tmpl =
      chat_template_if_any(cfg.data.chat_template, cfg.init_from, "data.chat_template");
  const ChatSpecials specials = chat_specials(*tok, cfg.init_from);
  auto read = [&](const std::string& path, const char* key) {
    return std::make_shared<OnlinePrompts>(render_online_prompts(
        read_prompt_records(path, ac.data.prompt_key, key),
        PreferenceRenderer{*tok, *tmpl, specials}, ac.data.prompt_key, ac.data.max_prompt_length));
  };
  auto prompts = read(ac.data_path, "align.data_path");
  std::shared_ptr<OnlinePrompts> valid;
  if (!ac.valid_path.empty()) valid = read(ac.valid_path, "align.valid_path");
  std::vector<int32_t> end_ids;
  if (!cfg.init_from.empty())
    end_ids = generation_end_ids(cfg.init_from, *tok, cfg.model.vocab_size);
  RewardModelSource src;
  src.dir = k.reward_model;
  src.dtype = k.scorer_dtype;
  src.batch = k.score_batch;
  src.chat_template = cfg.data.chat_template;
  src.policy_dir = cfg.init_from;
  src.device = cfg.device;
  auto rewards = std::make_shared<RewardSet>(rc, src, rl.sampling.max_tokens);
  OnlineScorer scorer = [rewards](std::span<const RewardInput> in) { return rewards->score(in); };

  for (const auto& [key, v] : rl.signature()) cfg.extra_data_signature[key] = v;
  for (const auto& [key, v] : ac.signature()) cfg.extra_data_signature[key] = v;
  cfg.extra_data_signature["align.reward_funcs"] =
      fmt::format("{} weights {}", rc.funcs, rc.weights);
  auto objective = std::make_shared<OnlineObjective>(cfg, rl, prompts, tok, end_ids, scorer,
                                                     ac.reference_source);
  if (!rl.value_model.empty())
    objective->set_critic(std::make_unique<Critic>(cfg, rl.value_model, cfg.model.vocab_size));
  objective->set_moe_losses(ac.moe_losses);
  objective->set_valid_prompts(valid);
  Trainer trainer(cfg, ranks ? ranks->parallel() : TrainParallel{}, objective);
  trainer.run();
  return 0;
}

}  // namespace nk
