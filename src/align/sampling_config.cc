#include "align/sampling_config.h"

#include <cmath>
#include <limits>

#include "core/error.h"

namespace nk {

void AlignSamplingConfig::bind(ConfigBinder& b) {
  b.bind(
      "align.reward_model", reward_model,
      "rs, and the model reward of grpo/rloo (align.reward_funcs=model): the reward model folder "
      "(a sequence classifier, num_labels 1, e.g. trained by align.method=rm or imported from "
      "*ForSequenceClassification) scoring each (prompt, sample)");
  b.bind("align.num_rollouts_per_prompt", rs.num_rollouts,
         "rs: samples drawn per prompt, n of best-of-n (NeMo-Aligner rs.num_rollouts_per_prompt)");
  b.bind("align.top_n_rollouts", rs.top_n,
         "rs: samples kept per prompt, best first (NeMo-Aligner rs.top_n_rollouts)");
  b.bind_with<std::string>(
      "align.reward_threshold", "",
      "rs: keep only samples whose reward is at least this (\"\" = no threshold)",
      [&](const std::string& s) {
        if (s.empty()) {
          rs.threshold = -std::numeric_limits<double>::infinity();
          return;
        }
        size_t used = 0;
        try {
          rs.threshold = std::stod(s, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used != s.size() || !std::isfinite(rs.threshold))
          fail("align.reward_threshold: '{}' is not a finite number", s);
      });
  b.bind("align.max_tokens", rs.max_tokens, "rs: most new tokens per sample");
  b.bind("align.temperature", rs.sampling.temperature, "rs: softmax temperature (0 = greedy)");
  b.bind("align.top_k", rs.sampling.top_k, "rs: sample among the k most likely tokens (0 = all)");
  b.bind("align.top_p", rs.sampling.top_p, "rs: nucleus sampling mass (1 = off)");
  b.bind_with<int64_t>("align.seed", int64_t(rs.sampling.seed),
                       "rs: sampling seed (sample j of prompt i uses seed + i * n + j)",
                       [&](int64_t v) { rs.sampling.seed = uint64_t(v); });
  b.bind_with<std::string>("align.stop", "",
                           "rs: a stop string ending each sample before it (\"\" = none; the "
                           "end-of-document and generation_config.json's end ids always end one)",
                           [&](const std::string& s) {
                             rs.stop.clear();
                             if (!s.empty()) rs.stop.push_back(s);
                           });
  b.bind("align.rollout_batch_size", rs.batch,
         "rs: sequences the generator decodes together (NeMo-Aligner "
         "rs.rollout_micro_batch_size)");
  b.bind("align.progress_every", progress_every,
         "rs: prompts sampled and scored per chunk; each chunk is appended to "
         "OUTPUT.partial.jsonl, from which a rerun with the same settings resumes");
  b.bind("align.rs_sft", rs_sft,
         "rs: after writing the kept samples, fine-tune train.init_from on them (the finetune "
         "pass with data.sft_path = the written file, train.* as given)");
  b.bind("align.attribute_model", attribute_model,
         "steerlm: an attribute model folder (a sequence classifier whose labels name the "
         "attributes, NeMo-Aligner's SteerLM regression model) filling values a record lacks");
  b.bind("align.steerlm_attributes", attributes,
         "steerlm: the attributes, comma-separated, in the order the label string lists them "
         "(\"\" = the attribute model's labels, else HelpSteer's helpfulness,correctness,"
         "coherence,complexity,verbosity)");
  b.bind("align.steerlm_min", steerlm.min_value, "steerlm: the smallest attribute value");
  b.bind("align.steerlm_max", steerlm.max_value,
         "steerlm: the largest attribute value (a model's score is rounded, then clipped)");
  b.bind("align.steerlm_template", steerlm.prompt_template,
         "steerlm: how the label string is written into the prompt ({attributes} stands for "
         "\"helpfulness:4,correctness:3,...\"): a chat prompt's system message, a string "
         "prompt's first line");
  b.bind("align.response_key", response_key,
         "steerlm and rm (regression): the response's key in a record (HelpSteer's "
         "\"response\"); values are "
         "attribute-named keys (HelpSteer) or a label string under align.label_key (NeMo's "
         "\"label\")");
  b.bind("align.steerlm_sft", steerlm_sft,
         "steerlm: fine-tune train.init_from on the conditioned data once written (false: "
         "write it only)");
  b.bind("align.output_path", output_path,
         "rs, steerlm: the SFT JSONL written (\"\" = train.out_dir/rs_sft.jsonl or "
         "steerlm_sft.jsonl), with OUTPUT.stats.jsonl beside it");
  b.bind("align.scorer_dtype", scorer_dtype,
         "rs, steerlm, the model reward: the reward or attribute model's compute precision: f32 "
         "or bf16");
  b.bind("align.score_batch_size", score_batch,
         "rs, steerlm, the model reward: sequences per reward or attribute model forward");
}

}  // namespace nk
