// Rotary position embeddings: the angle pair i of a head turns by per
// position (its inverse frequency), and RoPE scaling, the ways a model
// stretches those angles to reach past the context it was pretrained on.
// Scaling is a property of the position encoding, not of a family: every
// architecture with rotary positions gets it through ModelConfig::rope_scaling.
//
// The scaled frequencies follow Hugging Face transformers'
// `_compute_{linear_scaling,llama3,yarn}_parameters` (modeling_rope_utils.py),
// with theta_i = theta^(-2i/D) for pair i of a head of size D:
//   linear  theta_i / factor
//   llama3  (Llama 3.1) by wavelength w_i = 2 pi / theta_i against the
//           original context L: w_i < L / high_freq_factor keeps theta_i,
//           w_i > L / low_freq_factor takes theta_i / factor, between them
//           (1 - s) theta_i / factor + s theta_i with
//           s = (L / w_i - low_freq_factor) / (high_freq_factor - low_freq_factor)
//   yarn    theta_i / factor blended towards theta_i over pairs [low, high]
//           (the pairs that turn beta_fast down to beta_slow times over the
//           original context), and cos/sin multiplied by an attention factor
//           (default 0.1 ln(factor) + 1, or DeepSeek's mscale ratio)
//   longrope (Phi-3's LongRoPE, HF "longrope", formerly "su") theta_i / e_i
//           with e the long_factor list when the model's context
//           (max_seq_len) exceeds original_max_seq_len, else short_factor,
//           and cos/sin multiplied by attention_factor (default
//           sqrt(1 + ln(factor) / ln(original_max_seq_len)), 1 for factor
//           <= 1). Hugging Face picks the list by the current sequence's
//           length instead (longer than the original context: long); the two
//           agree on any sequence past the original context, which is what
//           a long-context model is run for, and Nekton's choice keeps one
//           table for the whole KV cache (llama.cpp chooses by its context
//           size, as Nekton does).
// All in double; an unscaled table is bit for bit the one ops::rope_table
// builds.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace nk {

enum class RopeScalingType { None, Linear, Llama3, Yarn, LongRope };

// "none", "linear", "llama3", "yarn", "longrope"
const char* rope_scaling_type_name(RopeScalingType t);
// nk::Error naming `what` and the known names.
RopeScalingType parse_rope_scaling_type(const std::string& s, const std::string& what);

// Hugging Face's `rope_scaling` dict, typed. Fields a type does not use stay
// at their defaults; 0 marks an optional value as unset.
struct RopeScaling {
  RopeScalingType type = RopeScalingType::None;
  double factor = 1.0;          // linear, llama3, yarn, longrope: how far the context is stretched
  double low_freq_factor = 0;   // llama3 (Llama 3.1: 1)
  double high_freq_factor = 0;  // llama3 (Llama 3.1: 4)
  int64_t original_max_seq_len = 0;      // original_max_position_embeddings: llama3 and
                                         // longrope (required), yarn (0: the model's max_seq_len)
  double beta_fast = 32, beta_slow = 1;  // yarn: rotation counts bounding the blended pairs
  double attention_factor = 0;  // yarn, longrope: cos/sin scale (0: from factor (and mscale))
  double mscale = 0, mscale_all_dim = 0;  // yarn (DeepSeek): 0 = unset
  bool truncate = true;                   // yarn: round the blended range to whole pairs
  // longrope: per-pair divisors of the frequencies (head_dim / 2 each), for a
  // context within the original one (short) and past it (long).
  std::vector<double> short_factor, long_factor;

  bool enabled() const { return type != RopeScalingType::None; }
  bool operator==(const RopeScaling&) const = default;
  // nk::Error naming prefix + the field ("model.rope_scaling.factor: ...").
  void validate(const std::string& prefix) const;
};

// Inverse frequencies (radians per position) of the head_dim / 2 pairs.
// max_seq_len stands in for yarn's unset original_max_seq_len.
std::vector<double> rope_inv_freq(int64_t head_dim, double theta, const RopeScaling& s,
                                  int64_t max_seq_len);
// The factor cos and sin are multiplied by: yarn's and longrope's attention
// factor, else 1.
double rope_attention_factor(const RopeScaling& s);

// The table ops::rope_inplace reads, f32 [max_t, head_dim]: row t holds
// cos(t f_i) m for i < D/2, then sin(t f_i) m, with f = rope_inv_freq and
// m = rope_attention_factor. Built on the host (angles in double), then copied.
Tensor rope_table(int64_t max_t, int64_t head_dim, double theta, const RopeScaling& s,
                  int64_t max_seq_len);

// Nekton's own spelling (config.json's "rope_scaling" object, the
// model.rope_scaling.* keys' names): {"type": "llama3", "factor": 8, ...},
// each field the type uses and each optional one that is set.
nlohmann::json rope_scaling_to_json(const RopeScaling& s);
// nk::Error "WHERE: rope_scaling.KEY ..." for a missing, mistyped or unknown key.
RopeScaling rope_scaling_from_json(const nlohmann::json& j, const std::string& where);

// Hugging Face's spelling, from a config.json object: `rope_theta` (default
// 10000) and the `rope_scaling` dict ({"rope_type": "llama3", "factor": 8,
// "original_max_position_embeddings": 8192, ...}; configs written before
// transformers 4.43 say "type"), or transformers 5's `rope_parameters`, which
// holds both. Types other than default, linear, llama3 and yarn are an
// nk::Error "WHERE: unsupported 'rope_scaling' ...", as is a missing or
// mistyped key the type needs.
void rope_from_hf_config(const nlohmann::json& config, const std::string& where, double& theta,
                         RopeScaling& s);
// The `rope_scaling` value export writes: null when none.
nlohmann::ordered_json rope_scaling_to_hf(const RopeScaling& s);

}  // namespace nk
