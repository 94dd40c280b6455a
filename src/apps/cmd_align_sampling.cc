#include "apps/cmd_align_sampling.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "align/prompt_data.h"
#include "align/reward_scoring.h"
#include "align/sampling_config.h"
#include "ckpt/hf_io.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "data/chat/chat_config.h"
#include "data/dataset/text_dataset.h"
#include "data/json_records.h"
#include "dist/mpi/launch_env.h"
#include "infer/model_source.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace nk {

namespace fs = std::filesystem;

AlignSamplingConfig align_sampling_keys(const Config& c) {
  AlignSamplingConfig k;
  ConfigReader r(c);
  k.bind(r);
  return k;
}

void align_sampling_checks(const CommandArgs& a, const TrainConfig& cfg, const AlignConfig& ac,
                           const std::string& method, const char* data_what) {
  if (a.nproc > 0 || dist::launched_by_mpi())
    fail("align.method={}: runs on one process for now (no --nproc, no mpirun)", method);
  if (!cfg.data.path.empty() || !cfg.data.prefix.empty() || !cfg.data.blend.empty() ||
      cfg.data.sft())
    fail(
        "data.*: align.method={} reads {} from align.data_path and fine-tunes on what it "
        "writes; data.path, data.prefix, data.blend and data.sft_path stay unset",
        method, data_what);
  if (ac.data_path.empty())
    fail("align.data_path: the {} (JSONL) for align.method={}", data_what, method);
  if (cfg.init_from.empty())
    fail("train.init_from: align.method={} needs the policy model folder to start from", method);
}

void align_sft_pass(const CommandArgs& a, const ConfigSchema& schema, const std::string& sft_path,
                    bool chat, const std::string& chat_template) {
  std::vector<std::string> o = a.overrides;
  o.push_back("data.sft_path=" + sft_path);
  if (!chat && (chat_template.empty() || chat_template == "auto"))
    o.push_back("data.chat_template=plain");
  const Config c = Config::load(schema, a.config_path, o);
  TrainConfig t = train_config_from(c);
  NK_INFO("fine-tuning on {} (train.out_dir = {})", sft_path, t.out_dir);
  Trainer trainer(t);
  trainer.run();
}

namespace {

nlohmann::json rs_settings(const TrainConfig& cfg, const AlignConfig& ac,
                           const AlignSamplingConfig& k, const std::string& data_hash) {
  const RejectionSamplingOptions& o = k.rs;
  return {{"prompts", ac.data_path},
          {"prompts_fnv1a", data_hash},
          {"prompt_key", ac.data.prompt_key},
          {"policy", cfg.init_from},
          {"tokenizer", cfg.data.tokenizer},
          {"chat_template", cfg.data.chat_template},
          {"reward_model", k.reward_model},
          {"scorer_dtype", k.scorer_dtype},
          {"num_rollouts_per_prompt", o.num_rollouts},
          {"top_n_rollouts", o.top_n},
          {"reward_threshold", std::isfinite(o.threshold) ? nlohmann::json(o.threshold) : nullptr},
          {"max_tokens", o.max_tokens},
          {"temperature", o.sampling.temperature},
          {"top_k", o.sampling.top_k},
          {"top_p", o.sampling.top_p},
          {"seed", o.sampling.seed},
          {"stop", o.stop}};
}

// FNV-1a of a file's bytes, hex: the prompts a reused output was made from.
std::string file_hash(const std::string& path) {
  const std::string bytes = read_text_file(path);
  uint64_t h = 1469598103934665603ull;
  for (unsigned char ch : bytes) h = (h ^ ch) * 1099511628211ull;
  return fmt::format("{:016x}", h);
}

}  // namespace

int align_rejection_sampling(const CommandArgs& a, const ConfigSchema& schema, const Config& c,
                             const TrainConfig& cfg, const AlignConfig& ac) {
  align_sampling_checks(a, cfg, ac, "rs", "prompts");
  AlignSamplingConfig k = align_sampling_keys(c);
  k.rs.check();
  if (k.progress_every < 1) fail("align.progress_every: must be >= 1, got {}", k.progress_every);
  if (k.reward_model.empty())
    fail("align.reward_model: align.method=rs scores its samples with a reward model folder");
  const std::string output =
      k.output_path.empty() ? (fs::path(cfg.out_dir) / "rs_sft.jsonl").string() : k.output_path;

  // Everything is read and checked before anything is generated or written.
  const PromptRecords p = read_prompt_records(ac.data_path, ac.data.prompt_key);
  auto where = [&](size_t i) { return p.file.where(p.file.records[i], ac.data.prompt_key); };
  // A Hugging Face policy is imported where the SFT pass's Trainer reads it from.
  std::string policy_dir = cfg.init_from;
  if (is_hf_model_folder(cfg.init_from)) {
    policy_dir = imported_base_dir(cfg);
    if (!fs::exists(policy_dir + "/config.json")) {
      const HfImportReport r = import_hf(cfg.init_from, policy_dir);
      NK_INFO("train.init_from: imported the Hugging Face model {} ({}) into {}", cfg.init_from,
              r.architecture, policy_dir);
    }
  }
  RunnableModel policy;
  try {
    ModelSourceKeys mk;
    mk.prefix = "align";
    mk.model = policy_dir;
    mk.tokenizer = cfg.data.tokenizer;
    mk.dtype = cfg.dtype == DType::BF16 ? "bf16" : "f32";
    mk.device = cfg.device;
    policy = load_runnable_model(mk);
  } catch (const Error& e) {
    fail("train.init_from '{}': {}", cfg.init_from, e.what());
  }
  const auto tmpl =
      chat_template_if_any(cfg.data.chat_template, cfg.init_from, "data.chat_template");
  const ChatSpecials specials = chat_specials(*policy.tokenizer, cfg.init_from);
  const PreferenceRenderer pr{*policy.tokenizer, *tmpl, specials};
  std::vector<std::vector<int32_t>> prompt_tokens;
  const int64_t context = policy.model->config().max_seq_len;
  for (size_t i = 0; i < p.prompts.size(); ++i) {
    prompt_tokens.push_back(render_prompt(p.prompts[i], pr, where(i)));
    if (int64_t(prompt_tokens.back().size()) >= context)
      fail("{}: {} tokens leave no room for a sample in train.init_from's context of {}", where(i),
           prompt_tokens.back().size(), context);
  }
  const RewardScorer rm("align.reward_model", k.reward_model, cfg.data.chat_template, cfg.init_from,
                        k.scorer_dtype, cfg.device, k.score_batch);
  if (rm.num_labels() != 1)
    fail(
        "align.reward_model '{}': {} labels ({}); rejection sampling ranks by one reward (a "
        "num_labels 1 model)",
        k.reward_model, rm.num_labels(), fmt::join(rm.labels(), ", "));
  for (size_t i = 0; i < p.prompts.size(); ++i)
    if (int64_t(render_prompt(p.prompts[i], rm.renderer(), where(i)).size()) >= rm.max_seq_len())
      fail("{}: the prompt fills align.reward_model's context of {} tokens", where(i),
           rm.max_seq_len());

  const nlohmann::json settings = rs_settings(cfg, ac, k, file_hash(ac.data_path));
  if (rejection_sampling_done(output, settings)) {
    NK_INFO("rejection sampling: reusing {} (made with these settings)", output);
  } else {
    NK_INFO("rejection sampling: {} prompts x {} samples from {}, scored by {}", p.prompts.size(),
            k.rs.num_rollouts, cfg.init_from, k.reward_model);
    auto score = [&](const std::vector<std::vector<int32_t>>& seqs) {
      std::vector<float> r;
      for (const auto& s : rm.score(seqs)) r.push_back(s.at(0));
      return r;
    };
    // Chunk by chunk, each appended to the progress file a rerun resumes from.
    std::vector<PromptRollouts> rollouts =
        read_rejection_progress(output, settings, p.prompts.size());
    for (PromptRollouts& r : rollouts) settle_rollouts(r, k.rs.top_n, k.rs.threshold);
    if (!rollouts.empty())
      NK_INFO("rejection sampling: resuming after {} of {} prompts ({})", rollouts.size(),
              p.prompts.size(), rejection_progress_path(output));
    bool fresh = rollouts.empty();
    const size_t chunk = size_t(k.progress_every);
    for (size_t begin = rollouts.size(); begin < p.prompts.size(); begin += chunk) {
      const size_t end = std::min(p.prompts.size(), begin + chunk);
      const std::vector<std::vector<int32_t>> part(prompt_tokens.begin() + int64_t(begin),
                                                   prompt_tokens.begin() + int64_t(end));
      const std::vector<std::vector<std::string>> samples =
          generate_rollouts(*policy.model, *policy.tokenizer, policy.end_ids, part, k.rs, begin);
      std::vector<PromptRollouts> done(end - begin);
      for (size_t i = 0; i < done.size(); ++i) {
        done[i].prompt = p.prompts[begin + i];
        done[i].samples = samples[i];
      }
      score_rollouts(
          done, rm.renderer(), score, k.rs.top_n, k.rs.threshold,
          [&](size_t i) { return where(begin + i); }, rm.max_seq_len());
      append_rejection_progress(output, settings, fresh, done);
      fresh = false;
      rollouts.insert(rollouts.end(), done.begin(), done.end());
      NK_INFO("rejection sampling: {}/{} prompts done", end, p.prompts.size());
    }
    for (size_t i = 0; i < rollouts.size(); ++i) {
      rollouts[i].line = p.file.records[i].line;
      rollouts[i].prompt = p.prompts[i];
    }
    write_rejection_sampling(output, "align.output_path", rollouts, settings);
    NK_INFO("rejection sampling: {}; wrote {} and {}", summarize(rollouts).line(), output,
            rejection_stats_path(output));
  }
  if (k.rs_sft) align_sft_pass(a, schema, output, p.chat, cfg.data.chat_template);
  return 0;
}

}  // namespace nk
