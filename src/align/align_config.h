// The align.* keys of `nekton align` (beside every train.*, model.*, peft.*
// and data.tokenizer/chat_template key of the training recipe), named as
// TRL's DPOConfig, KTOConfig, ORPOConfig and CPOConfig name them.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "align/preference_data.h"
#include "align/preference_loss.h"
#include "core/config.h"
#include "core/config_bind.h"

namespace nk {

// Where the reference log-probabilities come from (DPO, KTO).
enum class ReferenceSource {
  Precompute,  // one pass of the initial model over the data before training, kept in OUT_DIR
  Copy,        // a frozen second copy of the initial model, run beside the policy
  AdapterOff,  // the policy with its adapters switched off (LoRA, IA3, bottleneck)
};

struct AlignConfig {
  std::string method = "dpo";  // dpo | ipo | hinge | kto | orpo | simpo | rm
  std::string loss_type = "sigmoid";
  std::string reference = "auto";
  PreferenceLossConfig loss;
  // align.method=rm: a reward model (Bradley-Terry on the pairs).
  bool reward_model = false;
  double center_rewards_coefficient = 0;
  // align.method=rm: binary_ranking (pairs) or regression (SteerLM's
  // attribute model: one output per name in `attributes`, the
  // align.steerlm_attributes that AlignSamplingConfig binds, set by the
  // caller before check(); empty after it unless a regression).
  std::string reward_model_type = "binary_ranking";
  std::vector<std::string> attributes;
  std::string response_key = "response";  // align.response_key (AlignSamplingConfig binds it)
  std::string data_path, valid_path;
  bool shuffle = true;
  // A Mixture of Experts model's balancing and z-losses in the objective
  // (TRL: output_router_logits with router_aux_loss_coef); off, the routers
  // learn from the objective alone.
  bool moe_losses = false;
  PreferenceDataOptions data;

  void bind(ConfigBinder& b);
  // Resolved after binding: nk::Error naming the key for a bad value.
  // `adapters`: the policy trains adapters (peft.method) over a frozen base.
  void check(bool adapters);
  bool online() const { return method == "grpo" || method == "rloo" || method == "ppo"; }
  ReferenceSource reference_source = ReferenceSource::Precompute;
  // The settings a resume must find unchanged, by key.
  std::map<std::string, std::string> signature() const;
};

// The model.* keys an align recipe implies, set in `c` (the train, align
// and align-sampling keys) before the TrainConfig is read from it: a reward
// model (align.method=rm) is a sequence classifier of one label, its score
// head in place of the LM head, whatever train.init_from is; an attribute
// model (align.reward_model_type=regression) has one output per
// align.steerlm_attributes name, named after them. nk::Error naming
// model.num_labels when it is set to another count.
void set_align_model_keys(Config& c);

}  // namespace nk
