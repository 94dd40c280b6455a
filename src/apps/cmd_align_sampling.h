// `nekton align align.method=rs` (rejection sampling) and
// `align.method=steerlm` (SteerLM's attribute-conditioned SFT): they write
// SFT data, then (optionally) fine-tune on it with the finetune machinery.
// cmd_align.cc dispatches here.
#pragma once
#include "align/align_config.h"
#include "align/sampling_config.h"
#include "apps/commands.h"

namespace nk {

// `schema`: the align command's (its train.*, align.* keys), from which the
// SFT pass builds its settings.
int align_rejection_sampling(const CommandArgs& a, const ConfigSchema& schema, const Config& c,
                             const TrainConfig& cfg, const AlignConfig& ac);
int align_steerlm(const CommandArgs& a, const ConfigSchema& schema, const Config& c,
                  const TrainConfig& cfg, const AlignConfig& ac);

// Shared by both (cmd_align_sampling.cc):
AlignSamplingConfig align_sampling_keys(const Config& c);
// What both refuse or need before reading anything: one process, no data.*
// source, align.data_path (`data_what` says what it holds), train.init_from.
void align_sampling_checks(const CommandArgs& a, const TrainConfig& cfg, const AlignConfig& ac,
                           const std::string& method, const char* data_what);
// The SFT pass: the command's settings with data.sft_path = sft_path (string
// prompts rendered with no markup, as the sampler and the reward model saw
// them, unless data.chat_template names a template), through the Trainer as
// `nekton finetune` runs it.
void align_sft_pass(const CommandArgs& a, const ConfigSchema& schema, const std::string& sft_path,
                    bool chat, const std::string& chat_template);

}  // namespace nk
