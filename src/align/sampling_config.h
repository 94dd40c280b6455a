// The align.* keys of rejection sampling (align.method=rs) and SteerLM
// (align.method=steerlm), beside AlignConfig's (align.data_path,
// align.prompt_key, align.label_key) and the training recipe's (the SFT pass,
// train.init_from the policy). Names follow NeMo-Aligner's (rs.
// num_rollouts_per_prompt, top_n_rollouts; SteerLM's attribute model) and
// `nekton generate`'s sampling keys.
#pragma once
#include <string>

#include "align/rejection_sampling.h"
#include "align/steerlm.h"
#include "core/config_bind.h"

namespace nk {

struct AlignSamplingConfig {
  // Rejection sampling.
  std::string reward_model;  // a sequence-classifier folder (one label)
  RejectionSamplingOptions rs;
  bool rs_sft = false;          // fine-tune on the kept samples afterwards
  int64_t progress_every = 32;  // prompts per chunk saved to OUTPUT.partial.jsonl
  // SteerLM.
  std::string attribute_model;  // a sequence-classifier folder whose labels name attributes
  std::string attributes;       // align.steerlm_attributes: "a,b,c" ("" = model's or HelpSteer's)
  SteerLmSpec steerlm;          // names resolved by the command
  std::string response_key = "response";
  bool steerlm_sft = true;
  // Both.
  std::string output_path;  // "" = train.out_dir/{rs,steerlm}_sft.jsonl
  std::string scorer_dtype = "f32";
  int64_t score_batch = 8;

  void bind(ConfigBinder& b);
};

}  // namespace nk
