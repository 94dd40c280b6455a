// Adapters in Hugging Face PEFT's format: a folder holding
// adapter_config.json (peft_type LORA, IA3, P_TUNING or PROMPT_TUNING and
// their settings) and adapter_model.safetensors, tensors named after the
// adapted module's path:
//   LoRA  base_model.model.<module>.lora_A.weight [r, in], .lora_B.weight [out, r]
//   IA3   base_model.model.<module>.ia3_l [out, 1], or [1, in] for a
//         feedforward module (scaled on its input)
//   P-tuning, prompt tuning: prompt_embeddings [virtual tokens, d_model], the
//         prompt encoder's output (what PEFT saves and infers with)
// Bottleneck adapters, which PEFT does not have, are written the same way
// with peft_type BOTTLENECK_ADAPTER (Nekton's: adapter_dim, norm_position
// "pre", activation "swish", norm_eps) and NeMo's tensor names under the
// adapted module: <module>.adapter.layer_norm.weight, .layer_norm.bias
// [out], .linear_in.weight [dim, out], .linear_out.weight [out, dim].
// (<module>: model.layers.0.self_attn.q_proj for Llama, transformer.h.0.attn.c_attn
// for GPT-2). The safetensors file is written as the safetensors library
// writes it (metadata {"format": "pt"} first, tensors sorted by name, compact
// JSON), so an adapter PEFT saved comes back byte for byte.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "model/transformer.h"

namespace nk {

struct PeftAdapterInfo {
  std::string type;  // "LORA", "IA3", "P_TUNING", "PROMPT_TUNING", "BOTTLENECK_ADAPTER"
  LoraConfig lora;   // LORA's settings
  Ia3Config ia3;     // IA3's
  BottleneckConfig bottleneck;
  PromptConfig prompt;       // the stored prompt: no encoder
  DType dtype = DType::F32;  // of the stored tensors
  std::string base_model;    // base_model_name_or_path, as recorded
};

// Reads DIR/adapter_config.json for a model of `base`'s shape. nk::Error
// naming the file and key for another peft_type, options Nekton does not
// implement (DoRA, rank or alpha patterns, layers_to_transform,
// modules_to_save, biases) and bad values.
PeftAdapterInfo read_peft_adapter_config(const std::string& dir, const ModelConfig& base);
// `base` with the adapter's settings (its lora, ia3, bottleneck and prompt).
ModelConfig adapted_config(const ModelConfig& base, const PeftAdapterInfo& info);

// `base` (a model without adapters) with the adapter of DIR: a model whose
// config has the adapter's settings and whose adapter weights are the
// file's. nk::Error naming the file and tensor for a missing, extra,
// non-finite or wrongly shaped tensor (an adapter for another base shape).
std::unique_ptr<Transformer> attach_peft_adapter(const Transformer& base, const std::string& dir,
                                                 PeftAdapterInfo* info = nullptr);

// Writes the adapters of `model` (whose config has any) to DIR, replacing
// it atomically; tensors in `dtype` (f32, bf16 or f16). A p-tuning prompt
// encoder is written as its output.
void save_peft_adapter(const std::string& dir, const Transformer& model,
                       const std::string& base_model, DType dtype = DType::F32);

// One tensor of an adapter file: its PEFT name, the layout parameter that
// holds it (and the part of that parameter it is: an expert's LoRA A or B
// in its layer's stacked tensors, model/peft.h; "" for all of it), and its
// shape in the file.
struct PeftTensor {
  std::string name, param;
  Shape shape;
  std::string part;
};
// The tensors of c's adapters, in module order.
std::vector<PeftTensor> peft_tensors(const ModelConfig& c);

}  // namespace nk
