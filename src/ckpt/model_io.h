// A saved model: DIR/model.safetensors (f32 master weights, Nekton names) and
// DIR/config.json (the ModelConfig). Saving writes a sibling temporary folder
// and renames it into place, so DIR is always either the old or the new model.
#pragma once
#include <memory>
#include <string>

#include "model/transformer.h"

namespace nk {

std::string model_config_to_json(const ModelConfig& c);
// Throws nk::Error naming the file and the missing or invalid field.
ModelConfig model_config_from_json(const std::string& text, const std::string& where);

void save_model(const std::string& dir, Transformer& model);
// Reads DIR/config.json and DIR/model.safetensors; every tensor must be present
// with the configured shape and finite (nk::Error naming the file and tensor
// otherwise, before the model's memory is allocated for a shape mismatch).
std::unique_ptr<Transformer> load_model(const std::string& dir, DType compute,
                                        bool allow_nonfinite = false);

// The check every reader of weights runs (saved models, Hugging Face
// safetensors, training checkpoints): nk::Error "FILE: tensor 'NAME' has K
// non-finite values (NaN or Inf) of N" when `t` holds any. allow_nonfinite
// (--allow-nonfinite, to inspect a broken model) turns it into a warning.
void check_finite(const Tensor& t, const std::string& file, const std::string& name,
                  bool allow_nonfinite);

}  // namespace nk
