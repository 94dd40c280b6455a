// A saved model: DIR/model.safetensors (f32 master weights, Nekton names) and
// DIR/config.json (the ModelConfig). Saving writes a sibling temporary folder
// and renames it into place, so DIR is always either the old or the new model.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include "model/transformer.h"

namespace nk {

std::string model_config_to_json(const ModelConfig& c);
// Throws nk::Error naming the file and the missing or invalid field.
ModelConfig model_config_from_json(const std::string& text, const std::string& where);

// Every parameter in f32 (its master), or a frozen one without a master in
// the compute dtype (exact); nk::Error for an NF4 base (FrozenWeights::Nf4),
// which is not saved: its adapters are (ckpt/peft_adapter.h).
void save_model(const std::string& dir, Transformer& model);
// Reads DIR/config.json and DIR/model.safetensors; every tensor must be present
// with the configured shape and finite (nk::Error naming the file and tensor
// otherwise, before the model's memory is allocated for a shape mismatch).
// Under tensor parallelism (`tp` active) the model is this rank's pieces,
// each read as its slice of the file's whole tensor (load_weight_pieces).
std::unique_ptr<Transformer> load_model(const std::string& dir, DType compute,
                                        bool allow_nonfinite = false, Device device = kHost,
                                        const nn::TensorParallel& tp = {});
// DIR/config.json (nk::Error naming the file).
ModelConfig read_model_config(const std::string& dir);
// The model's name as a folder: DIR's last component ("runs/model/" and
// "runs/model" give "model"; "." the current folder's name).
std::string model_folder_name(const std::string& dir);
// Sets `model`'s parameters from DIR/model.safetensors one tensor at a time
// (Transformer::set_param: no second copy of the model, NF4 quantised as it
// is read), with the checks of load_model. keep_added: the parameters a run
// adds to a base (added_to_base: adapters, a classifier's score head) that
// the file lacks keep their values.
void load_weights(Transformer& model, const std::string& dir, bool keep_added = false,
                  bool allow_nonfinite = false);
// The same for a model split by tensor or pipeline parallelism: each of its
// parameters that `in_file` accepts (the others keep their values) read as
// this rank's slice of its stage's tensor in DIR/model.safetensors, which
// holds the whole ones laid out as `whole`. A parameter with an f32 master
// is read into it; a base held without (bf16, NF4, block-quantised) is set
// from its slices (a block-quantised slice quantised there: the whole's
// blocks, cut at a block boundary), but under tensor parallelism an NF4 one
// from its whole tensor (its share cut from the whole's blocks, whose
// absmaxes span ranks: Transformer::set_param_from_whole).
void load_weight_pieces(Transformer& model, const std::string& dir, const ParamLayout& whole,
                        const std::function<bool(const ParamInfo&)>& in_file,
                        bool allow_nonfinite = false);

// The check every reader of weights runs (saved models, Hugging Face
// safetensors, training checkpoints): nk::Error "FILE: tensor 'NAME' has K
// non-finite values (NaN or Inf) of N" when `t` holds any. allow_nonfinite
// (--allow-nonfinite, to inspect a broken model) turns it into a warning.
void check_finite(const Tensor& t, const std::string& file, const std::string& name,
                  bool allow_nonfinite);

}  // namespace nk
