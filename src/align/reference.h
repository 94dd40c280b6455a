// The reference model's log-probabilities of preference sequences (DPO,
// KTO), from one of three sources (AlignConfig::reference):
//  - precompute: one forward pass of the initial model over every training
//    and validation sequence before the first step, kept in
//    OUT_DIR/reference_logps.json under a key of the data, the initial
//    model and the settings; a resumed run with the same key reads it back
//    (bit for bit: the values round-trip) instead of running the pass again.
//  - copy: a frozen second copy of the initial model beside the policy.
//  - adapter_off: the policy itself with its adapters switched off, which is
//    its base bit for bit (Transformer::set_adapters_enabled).
#pragma once
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "align/preference_data.h"
#include "model/transformer.h"
#include "train/train_config.h"

namespace nk {

// Each row's summed completion log-probability: embedding, blocks and
// Transformer::head_row_nll (the activations are left as a backward needs
// them). tokens, targets: i32 [a.B, a.T] on the model's device.
void sequence_logps(Transformer& model, Activations& a, const Tensor& tokens, const Tensor& targets,
                    std::span<double> logp);
// The same negated: each row's summed -log p(target).
void sequence_nll(Transformer& model, Activations& a, const Tensor& tokens, const Tensor& targets,
                  std::span<double> nll);

// The model a run starts from, built as the Trainer builds it before its
// first step: train.init_from's weights, or the seed's initialisation.
// frozen_copy: every parameter frozen (no gradient or optimizer arena), for
// a reference that only runs forwards.
std::unique_ptr<Transformer> initial_model(const TrainConfig& cfg, bool frozen_copy);

// Every sequence of `data` (its file order) through `model`, micro_batch
// rows at a time: logp per sequence.
std::vector<double> compute_sequence_logps(Transformer& model, const PreferenceDataset& data,
                                           int64_t micro_batch);
// The same through `row_nll`: row_nll(tokens, targets, nll) sets nll[b] to
// the sum of -log p(target) over row b of i32 [micro_batch, T] tokens and
// targets on `device` (a model in pieces over ranks: its distributed forward,
// ObjectiveRanks::row_nll).
using RowNll =
    std::function<void(const Tensor& tokens, const Tensor& targets, std::span<double> row_nll)>;
std::vector<double> compute_sequence_logps(const PreferenceDataset& data, int64_t micro_batch,
                                           Device device, const RowNll& row_nll);

// What makes precomputed values valid: the sequences, the initial model's
// source (train.init_from's config and weight files, or the seed and model
// config), the compute dtype, device, sequence length and micro-batch. Hex.
std::string reference_key(const TrainConfig& cfg, const PreferenceData& train,
                          const PreferenceData* valid);

struct ReferenceLogps {
  std::string key;
  std::vector<double> train, valid;
};
// OUT_DIR/reference_logps.json, written atomically; read back, or nullopt
// when absent. nk::Error naming the file when it is corrupt.
std::string reference_logps_path(const TrainConfig& cfg);
void save_reference_logps(const std::string& path, const ReferenceLogps& r);
std::optional<ReferenceLogps> load_reference_logps(const std::string& path);

}  // namespace nk
