// LoRA adapters in Hugging Face PEFT's format: a folder holding
// adapter_config.json (peft_type LORA, r, lora_alpha, lora_dropout,
// target_modules, use_rslora, ...) and adapter_model.safetensors with one
// lora_A [r, in] and lora_B [out, r] per adapted module, named
//   base_model.model.<HF module path>.lora_A.weight
// (model.layers.0.self_attn.q_proj for Llama, transformer.h.0.attn.c_attn for
// GPT-2). The safetensors file is written as the safetensors library writes
// it (metadata {"format": "pt"} first, tensors sorted by name, compact JSON),
// so an adapter PEFT saved comes back byte for byte.
#pragma once
#include <memory>
#include <string>

#include "core/dtype.h"
#include "model/transformer.h"

namespace nk {

struct PeftAdapterInfo {
  LoraConfig lora;
  DType dtype = DType::F32;  // of the stored tensors
  std::string base_model;    // base_model_name_or_path, as recorded
};

// Reads DIR/adapter_config.json for a model of `base`'s shape. nk::Error
// naming the file and key for another peft_type, options Nekton does not
// implement (DoRA, rank or alpha patterns, layers_to_transform,
// modules_to_save, biases) and bad values.
PeftAdapterInfo read_peft_adapter_config(const std::string& dir, const ModelConfig& base);

// `base` (a model without adapters) with the adapter of DIR: a model whose
// config has the adapter's LoRA and whose adapter weights are the file's.
// nk::Error naming the file and tensor for a missing, extra, non-finite or
// wrongly shaped tensor (an adapter for another base shape).
std::unique_ptr<Transformer> attach_peft_adapter(const Transformer& base, const std::string& dir,
                                                 PeftAdapterInfo* info = nullptr);

// Writes the adapters of `model` (whose config has LoRA) to DIR, replacing it
// atomically; tensors in `dtype` (f32, bf16 or f16).
void save_peft_adapter(const std::string& dir, const Transformer& model,
                       const std::string& base_model, DType dtype = DType::F32);

// The PEFT name of a target's A or B.
std::string peft_tensor_name(const LoraTarget& t, bool b);

}  // namespace nk
