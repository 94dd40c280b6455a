#include "ckpt/gguf_export.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/gguf_reader.h"
#include "ckpt/gguf_vocab.h"
#include "ckpt/model_io.h"
#include "core/atomic_file.h"
#include "core/error.h"
#include "core/output_lock.h"
#include "data/chat/chat_config.h"
#include "data/dataset/text_dataset.h"
#include "model/arch.h"

namespace nk {

namespace fs = std::filesystem;

namespace {

// llama.cpp's llama_ftype for a file written with `recipe`.
uint32_t file_type(const std::string& recipe) {
  static const std::map<std::string, uint32_t> ftype = {{"f32", 0},     {"f16", 1},   {"q4_0", 2},
                                                        {"q8_0", 7},    {"q4_k", 14}, {"q6_k", 18},
                                                        {"q4_k_m", 15}, {"bf16", 32}};
  return ftype.at(recipe);
}

// llama.cpp's use_more_bits: the first and last eighth of the layers and
// every third one between get the more precise type.
bool more_bits(int64_t i, int64_t n) {
  return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2;
}

// The layer of "blk.N.*", else -1.
int64_t layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  return std::stoll(name.substr(4, name.find('.', 4) - 4));
}

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

ModelConfig read_config(const std::string& dir) {
  fs::path p = fs::path(dir) / "config.json";
  if (!fs::is_directory(dir)) fail("model folder '{}' does not exist", dir);
  std::ifstream in(p);
  if (!in) fail("model '{}': cannot read {}", dir, p.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return model_config_from_json(ss.str(), p.string());
}

// RoPE scaling as llama.cpp reads it (its converter writes the same):
// linear and yarn as rope.scaling.* keys, from which llama.cpp recomputes the
// frequencies (yarn: its ramp and attention factor are transformers' for the
// default beta_fast, beta_slow and attention factor; other values are
// refused); llama3 as a rope_freqs.weight tensor of per-pair divisors
// theta_i / scaled theta_i, which llama.cpp's Llama graph applies to the
// plain frequencies; longrope (phi3 only) as llama.cpp's converter writes
// Phi-3's: rope_factors_long.weight and rope_factors_short.weight [D/2]
// (per-pair divisors), rope.scaling.attn_factor and
// rope.scaling.original_context_length; llama.cpp takes the long factors
// when its context exceeds the original one, as Nekton does by max_seq_len.
void add_rope_scaling(GgufWriter& w, const std::string& ga, const ModelConfig& c,
                      const Architecture& arch, const std::string& dir) {
  const RopeScaling& s = c.rope_scaling;
  const std::string k = ga + ".rope.scaling.";
  switch (s.type) {
    case RopeScalingType::None:
      return;
    case RopeScalingType::Linear:
      w.add_string(k + "type", "linear");
      w.add_f32(k + "factor", float(s.factor));
      return;
    case RopeScalingType::Yarn:
      // (MLA's mscale: add_latent_attention.)
      if (s.attention_factor > 0 || (!c.mla() && s.mscale > 0 && s.mscale_all_dim > 0))
        fail(
            "model '{}': GGUF export of yarn RoPE scaling with an explicit attention_factor or "
            "mscale is not supported (llama.cpp derives the attention factor from the scaling "
            "factor alone)",
            dir);
      if (!s.truncate)
        fail("model '{}': GGUF export of yarn RoPE scaling with truncate = false is not supported",
             dir);
      // llama.cpp's default context parameters pass beta_fast 32 and
      // beta_slow 1, which take precedence over the file's: measured, a file
      // with other betas (2 and 0.5) ran in llama.cpp far from Nekton's logits.
      if (s.beta_fast != 32 || s.beta_slow != 1)
        fail(
            "model '{}': GGUF export of yarn RoPE scaling with beta_fast = {}, beta_slow = {} is "
            "not supported (llama.cpp runs with its defaults 32 and 1)",
            dir, s.beta_fast, s.beta_slow);
      w.add_string(k + "type", "yarn");
      w.add_f32(k + "factor", float(s.factor));
      w.add_u32(k + "original_context_length",
                uint32_t(s.original_max_seq_len > 0 ? s.original_max_seq_len : c.max_seq_len));
      return;
    case RopeScalingType::LongRope: {
      if (ga != "phi3")
        fail(
            "model '{}': GGUF export of longrope RoPE scaling is supported for phi3 only "
            "(llama.cpp's {} architecture reads no rope_factors_long/short)",
            dir, ga);
      w.add_f32(k + "attn_factor", float(rope_attention_factor(s)));
      w.add_u32(k + "original_context_length", uint32_t(s.original_max_seq_len));
      for (const auto& [name, list] : {std::pair{"rope_factors_long.weight", &s.long_factor},
                                       std::pair{"rope_factors_short.weight", &s.short_factor}}) {
        if (int64_t(list->size()) * 2 != c.rotary_dim())
          fail("model '{}': longrope has {} factors; {} rotated values per head have {} pairs", dir,
               list->size(), c.rotary_dim(), c.rotary_dim() / 2);
        std::vector<double> f = *list;
        w.add_tensor(name, {int64_t(f.size())}, GgmlType::F32,
                     [f](std::vector<float>& out) { out.assign(f.begin(), f.end()); });
      }
      return;
    }
    case RopeScalingType::Llama3: {
      if (!arch.gguf_rope_freqs())
        fail(
            "model '{}': GGUF export of llama3 RoPE scaling needs per-pair frequency factors, "
            "which llama.cpp's {} architecture does not read",
            dir, ga);
      const int64_t half = c.rotary_dim() / 2;
      std::vector<double> plain = rope_inv_freq(c.rotary_dim(), c.rope_theta, {}, c.max_seq_len);
      std::vector<double> scaled = rope_inv_freq(c.rotary_dim(), c.rope_theta, s, c.max_seq_len);
      w.add_tensor("rope_freqs.weight", {half}, GgmlType::F32,
                   [plain, scaled, half](std::vector<float>& out) {
                     out.resize(size_t(half));
                     for (int64_t i = 0; i < half; ++i)
                       out[size_t(i)] = float(plain[size_t(i)] / scaled[size_t(i)]);
                   });
      return;
    }
  }
}

// Gemma 2 and 3 as llama.cpp's gemma2 / gemma3 graphs run them. What those
// graphs fix rather than read is checked against the model, and a model that
// differs is refused (the GGUF would compute other results):
//   - the attention scale is 1/sqrt(head_dim) (1/sqrt(d_model / n_head) at
//     the 27B's layer count, 46 for gemma2, 62 for gemma3), not read from
//     the file: query_pre_attn_scalar must be that;
//   - gemma2: every other layer local (layer 0 first), attention and final
//     soft-capping always applied, from attn_logit_softcapping and
//     final_logit_softcapping;
//   - gemma3: five local layers then one global, the local layers' RoPE base
//     10000 unscaled, no soft-capping;
//   - the head tied to the embedding (gemma2 reads no output.weight).
// The window is attention.sliding_window (Nekton's and llama.cpp's both
// count the query itself: distance < window); Gemma 2 with every layer
// global gets a window of the whole context.
void add_gemma(GgufWriter& w, const std::string& ga, const ModelConfig& c, const std::string& dir) {
  const bool g3 = ga == "gemma3";
  const int64_t big = g3 ? 62 : 46;
  const double scalar = double(c.n_layer == big ? c.d_model / c.n_head : c.head_dim());
  const double qpas = c.query_pre_attn_scalar > 0 ? c.query_pre_attn_scalar : c.head_dim();
  if (qpas != scalar)
    fail(
        "model '{}': query_pre_attn_scalar = {}: llama.cpp's {} architecture scales the "
        "attention by 1/sqrt({}) for this shape (head_dim, or hidden / heads at {} layers) and "
        "reads no scale from the file",
        dir, qpas, ga, scalar, big);
  if (!c.tied_embeddings)
    fail("model '{}': an untied LM head: llama.cpp's {} architecture uses the embedding", dir, ga);
  if (g3) {
    if (c.sliding_window <= 0 || c.sliding_window_pattern != 6)
      fail(
          "model '{}': sliding_window = {}, sliding_window_pattern = {}: llama.cpp's gemma3 "
          "architecture runs five local layers then a global one (pattern 6) with a window",
          dir, c.sliding_window, c.sliding_window_pattern);
    if (c.rope_local_theta != 10000.0)
      fail(
          "model '{}': rope_local_base_freq = {}: llama.cpp's gemma3 architecture fixes the "
          "local layers' RoPE base at 10000",
          dir, c.rope_local_theta);
    if (c.attn_logit_softcap > 0 || c.final_logit_softcap > 0)
      fail(
          "model '{}': attn_logit_softcapping = {}, final_logit_softcapping = {}: llama.cpp's "
          "gemma3 architecture with local layers caps neither",
          dir, c.attn_logit_softcap, c.final_logit_softcap);
    w.add_u32(ga + ".attention.sliding_window", uint32_t(c.sliding_window));
    return;
  }
  if (c.sliding_window > 0 && c.sliding_window_pattern != 2)
    fail(
        "model '{}': sliding_window_pattern = {}: llama.cpp's gemma2 architecture alternates "
        "local and global layers (pattern 2)",
        dir, c.sliding_window_pattern);
  if (c.attn_logit_softcap <= 0 || c.final_logit_softcap <= 0)
    fail(
        "model '{}': attn_logit_softcapping = {}, final_logit_softcapping = {}: llama.cpp's "
        "gemma2 architecture always soft-caps both (give each a value)",
        dir, c.attn_logit_softcap, c.final_logit_softcap);
  w.add_u32(ga + ".attention.sliding_window",
            uint32_t(c.sliding_window > 0 ? c.sliding_window : c.max_seq_len));
  w.add_f32(ga + ".attn_logit_softcapping", float(c.attn_logit_softcap));
  w.add_f32(ga + ".final_logit_softcapping", float(c.final_logit_softcap));
}

// Multi-head Latent Attention as llama.cpp's deepseek2 reads it: the ranks,
// and (yarn) the scores' mscale through rope.scaling.yarn_log_multiplier
// (0.1 mscale_all_dim: llama.cpp scales the scores by (1 + that ln factor)^2
// and leaves cos/sin unscaled, so yarn's cos/sin factor must be 1:
// mscale = mscale_all_dim). kv_b goes split per head (attn_k_b, attn_v_b:
// Deepseek::gguf_tensors) with the sizes llama.cpp's converter writes for
// its absorbed path: one key/value head (the latent row) of key_length
// kv_rank + rope and value_length kv_rank, each query head's key_length_mla
// (nope + rope) and value_length_mla (v).
void add_latent_attention(GgufWriter& w, const std::string& ga, const ModelConfig& c,
                          const std::string& dir) {
  const std::string k = ga + ".attention.";
  w.add_u32(k + "key_length", uint32_t(c.kv_lora_rank + c.qk_rope_head_dim));
  w.add_u32(k + "value_length", uint32_t(c.kv_lora_rank));
  w.add_u32(k + "key_length_mla", uint32_t(c.head_dim()));
  w.add_u32(k + "value_length_mla", uint32_t(c.v_head_dim));
  // Written as 0 without one: llama.cpp reads the key unless the layer count is
  // V2-Lite's (26 or 27), and tells the graphs apart by attn_q's presence.
  w.add_u32(k + "q_lora_rank", uint32_t(c.q_lora_rank));
  w.add_u32(k + "kv_lora_rank", uint32_t(c.kv_lora_rank));
  const RopeScaling& s = c.rope_scaling;
  if (s.type != RopeScalingType::Yarn) return;
  if (std::abs(rope_attention_factor(s) - 1.0) > 1e-12)
    fail(
        "model '{}': yarn with mscale = {}, mscale_all_dim = {} scales cos/sin by {}; llama.cpp's "
        "{} architecture does not (GGUF export needs mscale = mscale_all_dim)",
        dir, s.mscale, s.mscale_all_dim, rope_attention_factor(s), ga);
  w.add_f32(ga + ".rope.scaling.yarn_log_multiplier", float(0.1 * s.mscale_all_dim));
}

// DeepSeek-V3's routing as llama.cpp reads it from the metadata
// (Architecture::gguf_deepseek_routing): the gating function, the top-k
// renormalised or not, the routed scaling, the groups, leading dense layers
// and an ungated shared expert of whole experts' widths.
void add_deepseek_experts(GgufWriter& w, const std::string& ga, const ModelConfig& c,
                          const std::string& dir) {
  if (!c.moe_dense_layers.empty())
    fail(
        "model '{}': moe_dense_layers = {}: llama.cpp's {} architecture has dense layers only "
        "before the first MoE one (leading_dense_block_count)",
        dir, fmt::join(c.moe_dense_layers, ","), ga);
  if (c.moe_shared_d_ff == 0 || c.moe_shared_d_ff % c.expert_d_ff() || c.moe_shared_expert_gate)
    fail(
        "model '{}': moe_shared_d_ff = {} (gate {}): llama.cpp's {} architecture has an ungated "
        "shared expert of expert_shared_count x {} units",
        dir, c.moe_shared_d_ff, c.moe_shared_expert_gate, ga, c.expert_d_ff());
  w.add_u32(ga + ".leading_dense_block_count", uint32_t(c.moe_first_dense_layers));
  w.add_u32(ga + ".expert_feed_forward_length", uint32_t(c.expert_d_ff()));
  w.add_u32(ga + ".expert_count", uint32_t(c.num_experts));
  w.add_u32(ga + ".expert_used_count", uint32_t(c.num_experts_per_tok));
  w.add_u32(ga + ".expert_shared_count", uint32_t(c.moe_shared_d_ff / c.expert_d_ff()));
  w.add_f32(ga + ".expert_weights_scale", float(c.moe_routed_scaling));
  w.add_bool(ga + ".expert_weights_norm", c.norm_topk_prob);
  w.add_u32(ga + ".expert_gating_func", c.moe_score_func == "sigmoid" ? 2 : 1);
  if (c.moe_n_group > 1) {
    w.add_u32(ga + ".expert_group_count", uint32_t(c.moe_n_group));
    w.add_u32(ga + ".expert_group_used_count", uint32_t(c.moe_topk_group));
  }
}

// A Mixture-of-Experts model's router as llama.cpp's graph for `ga` runs it:
// softmax scores, the top expert_used_count renormalised or not as that
// graph does (Architecture::gguf_norm_topk), every layer a MoE one. Other
// routers would compute other results there, so they are refused. The
// experts' widths go where that graph reads them (gguf_expert_ff_keys).
void add_experts(GgufWriter& w, const std::string& ga, const ModelConfig& c,
                 const Architecture& arch, const std::string& dir) {
  if (arch.gguf_deepseek_routing()) return add_deepseek_experts(w, ga, c, dir);
  const bool norm = arch.gguf_norm_topk();
  if (c.moe_score_func != "softmax" || c.norm_topk_prob != norm || c.moe_n_group != 1 ||
      c.moe_routed_scaling != 1.0 || c.has_score_bias())
    fail(
        "model '{}': GGUF export of a Mixture-of-Experts router with moe_score_func = {}, "
        "norm_topk_prob = {}, moe_n_group = {}, moe_routed_scaling = {}, moe_score_bias = {} is "
        "not supported (llama.cpp's {} architecture {} the top-k of softmax scores, ungrouped, "
        "unscaled, without a bias)",
        dir, c.moe_score_func, c.norm_topk_prob, c.moe_n_group, c.moe_routed_scaling,
        c.has_score_bias(), ga, norm ? "renormalises" : "does not renormalise");
  for (int64_t l = 0; l < c.n_layer; ++l)
    if (!c.moe_layer(l))
      fail(
          "model '{}': layer {} has a dense MLP (moe_first_dense_layers / moe_dense_layers); "
          "llama.cpp's {} architecture has Mixture-of-Experts blocks in every layer",
          dir, l, ga);
  w.add_u32(ga + ".expert_count", uint32_t(c.num_experts));
  w.add_u32(ga + ".expert_used_count", uint32_t(c.num_experts_per_tok));
  if (!arch.gguf_expert_ff_keys()) return;
  w.add_u32(ga + ".expert_feed_forward_length", uint32_t(c.expert_d_ff()));
  if (c.moe_shared_d_ff > 0)
    w.add_u32(ga + ".expert_shared_feed_forward_length", uint32_t(c.moe_shared_d_ff));
}

// The tokenizer as tokenizer.ggml.* metadata, and the chat template beside
// the model as llama.cpp's converter stores it; returns the GGUF tokenizer
// model ("llama", "gpt2"). llama.cpp refuses to load a GGUF without a
// tokenizer, so a model that has none is an error saying how to give one.
std::string add_tokenizer(GgufWriter& w, const std::string& model_dir, const ModelConfig& c,
                          const std::string& given) {
  const std::string spec = given.empty() ? stored_tokenizer(model_dir) : given;
  if (spec.empty())
    fail(
        "model '{}' has no tokenizer stored with it (no tokenizer.txt), and llama.cpp cannot "
        "load a GGUF without one: pass --tokenizer SPEC with the tokenizer the model was trained "
        "with (a SentencePiece FILE.model, a GPT-2 BPE folder with encoder.json + vocab.bpe, a "
        "folder from `nekton tokenizer train --type bpe`, a FILE.tiktoken, or a name: gpt2, "
        "cl100k_base, bytes, ...)",
        model_dir);
  const std::string what = given.empty()
                               ? fmt::format("model '{}': stored tokenizer '{}'", model_dir, spec)
                               : fmt::format("--tokenizer '{}'", spec);
  GgufVocab v;
  try {
    v = gguf_vocab(*load_tokenizer(spec), c.vocab_size);
  } catch (const Error& e) {
    throw e.with_context(what);
  }
  add_gguf_vocab(w, v);
  // The chat template, from where a model folder keeps it (DIR/ or, for an
  // imported one, DIR/tokenizer/): the default of Hugging Face's list form,
  // else a chat_template.jinja.
  std::string chat_template;
  if (const std::string tc = find_model_file(model_dir, "tokenizer_config.json"); !tc.empty()) {
    const nlohmann::json j = nlohmann::json::parse(read_text_file(tc), nullptr, false);
    const nlohmann::json ct = j.is_object() ? j.value("chat_template", nlohmann::json()) : nullptr;
    if (ct.is_string()) chat_template = ct.get<std::string>();
    if (ct.is_array())
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          chat_template = e["template"].get<std::string>();
  }
  if (const std::string f = find_model_file(model_dir, "chat_template.jinja");
      chat_template.empty() && !f.empty())
    chat_template = read_text_file(f);
  if (!chat_template.empty()) w.add_string("tokenizer.chat_template", chat_template);
  return v.model;
}

// A head-split tensor (ExternalTensor::head_split: MLA's attn_k_b,
// attn_v_b): slice h holds rows [head_row0, head_row0 + head_rows) of the
// parameter's h-th block of rows, transposed for attn_k_b.
void add_head_split(GgufWriter& w, const ExternalTensor& e, const ParamInfo& p, Transformer* m,
                    const std::string& recipe, const ModelConfig& c) {
  const int64_t H = e.head_split, rows = e.head_rows, in = p.shape[1];
  const int64_t block = p.shape[0] / H, row0 = e.head_row0;
  const bool tr = e.transposed;
  const Shape shape = tr ? Shape{H, in, rows} : Shape{H, rows, in};
  w.add_tensor(e.name, shape,
               gguf_tensor_type(recipe, e.name, shape, c.n_layer, c.tied_embeddings, c.num_experts),
               [m, pp = &p, H, rows, in, block, row0, tr](std::vector<float>& out) {
                 const float* base = ParamLayout::view(m->params(), *pp).data<float>();
                 out.resize(size_t(H * rows * in));
                 for (int64_t h = 0; h < H; ++h) {
                   const float* src = base + (h * block + row0) * in;  // [rows, in]
                   float* dst = out.data() + h * rows * in;
                   if (!tr) {
                     std::copy(src, src + rows * in, dst);
                     continue;
                   }
                   for (int64_t r = 0; r < rows; ++r)
                     for (int64_t i = 0; i < in; ++i) dst[i * rows + r] = src[r * in + i];
                 }
               });
}

}  // namespace

const std::vector<std::string>& gguf_recipes() {
  static const std::vector<std::string> r = {"f32",  "f16",  "bf16", "q8_0",
                                             "q4_0", "q4_k", "q6_k", "q4_k_m"};
  return r;
}

void check_gguf_recipe(const std::string& recipe) {
  const auto& r = gguf_recipes();
  if (std::find(r.begin(), r.end(), recipe) == r.end())
    fail("unknown GGUF type '{}' (known: {})", recipe, fmt::join(r, ", "));
}

GgmlType gguf_tensor_type(const std::string& recipe, const std::string& name, const Shape& shape,
                          int64_t n_layer, bool tied, int64_t n_expert) {
  check_gguf_recipe(recipe);
  if (shape.size() < 2 || ends_with(name, ".ffn_gate_inp.weight")) return GgmlType::F32;
  GgmlType t = parse_ggml_type(recipe == "q4_k_m" ? "q4_k" : recipe);
  const bool four_bit = t == GgmlType::Q4_0 || t == GgmlType::Q4_K;
  const bool output = name == "output.weight" || (tied && name == "token_embd.weight");
  if (four_bit && output) t = GgmlType::Q6_K;
  if (recipe == "q4_k_m" &&
      (ends_with(name, ".attn_v.weight") || ends_with(name, ".ffn_down.weight") ||
       ends_with(name, ".ffn_down_exps.weight") || ends_with(name, ".ffn_down_shexp.weight")) &&
      more_bits(layer_of(name), n_layer))
    t = GgmlType::Q6_K;
  const bool quantized = ggml_is_quantized(t);
  if (n_expert == 8 && quantized &&
      (ends_with(name, ".attn_v.weight") || ends_with(name, ".attn_k.weight")))
    t = GgmlType::Q8_0;
  if (n_expert == 8 && recipe == "q4_k_m" && ends_with(name, ".attn_output.weight"))
    t = GgmlType::Q6_K;
  const int64_t row = shape.back();
  if (row % ggml_block(t) != 0 && (t == GgmlType::Q4_K || t == GgmlType::Q6_K)) t = GgmlType::Q8_0;
  if (row % ggml_block(t) != 0) t = GgmlType::F16;
  return t;
}

void permute_rope_rows(const float* src, float* dst, int64_t n_heads, int64_t head_dim,
                       int64_t in) {
  const int64_t half = head_dim / 2;
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t j = 0; j < half; ++j)
      for (int64_t s = 0; s < 2; ++s) {
        const float* from = src + (h * head_dim + s * half + j) * in;
        std::copy(from, from + in, dst + (h * head_dim + 2 * j + s) * in);
      }
}

GgufExportResult export_gguf(const std::string& model_dir, const std::string& out_path,
                             const GgufExportOptions& opt) {
  OutputLock lock(out_path, LockAt::Beside);
  remove_stale_temporaries_of(out_path);
  const ModelConfig c = read_config(model_dir);
  const Architecture& arch = c.architecture();
  const std::string ga = arch.gguf_arch();
  if (ga.empty())
    fail("GGUF export does not support the {} architecture yet; '{}' is {} (config.json arch)",
         arch.display_name(), model_dir, c.arch);
  if (c.classifier())
    fail(
        "model '{}' is a sequence classifier (num_labels = {}: a reward or attribute model); "
        "GGUF export writes causal LMs only (export it with nekton export hf)",
        model_dir, c.num_labels);
  const bool gemma = ga == "gemma2" || ga == "gemma3";
  if (!gemma && c.sliding_window > 0 && c.sliding_window < c.max_seq_len)
    fail(
        "model '{}' uses sliding-window attention ({} positions); llama.cpp's {} architecture "
        "has none, so the GGUF would compute other results",
        model_dir, c.sliding_window, ga);
  // llama.cpp reads rotary keys only for rotary architectures, and the norm
  // epsilon under the key of the block's norm.
  const BlockSpec spec = c.block();
  const bool rotary = !spec.learned_positions;
  if (rotary && c.head_dim() % 2 != 0)
    fail("model '{}': head_dim {} is odd; rotary embeddings need an even one", model_dir,
         c.head_dim());

  check_gguf_recipe(opt.type);
  GgufWriter w;
  GgufExportResult result;
  w.add_string("general.architecture", ga);
  w.add_string("general.name", opt.name.empty() ? model_folder_name(model_dir) : opt.name);
  w.add_u32("general.file_type", file_type(opt.type));
  if (opt.type != "f32" && opt.type != "f16" && opt.type != "bf16")
    w.add_u32("general.quantization_version", 2);
  w.add_u32("general.alignment", 32);
  w.add_u32(ga + ".context_length", uint32_t(c.max_seq_len));
  w.add_u32(ga + ".embedding_length", uint32_t(c.d_model));
  w.add_u32(ga + ".block_count", uint32_t(c.n_layer));
  // llama.cpp's "llama" graph sizes the experts by feed_forward_length (the
  // Qwen MoE ones by expert_feed_forward_length: add_experts).
  const bool experts_ff = c.is_moe() && !arch.gguf_expert_ff_keys();
  w.add_u32(ga + ".feed_forward_length", uint32_t(experts_ff ? c.expert_d_ff() : c.d_ff));
  w.add_u32(ga + ".attention.head_count", uint32_t(c.n_head));
  // MLA: the one latent row every head reads (add_latent_attention).
  w.add_u32(ga + ".attention.head_count_kv", uint32_t(c.mla() ? 1 : c.n_kv_head));
  // (In the order earlier exports wrote them: a Llama file stays byte-identical.)
  if (rotary) w.add_f32(ga + ".rope.freq_base", float(c.rope_theta));
  w.add_f32(ga + "." + gguf_norm_eps_key(spec), float(c.norm_eps));
  if (rotary) w.add_u32(ga + ".rope.dimension_count", uint32_t(c.rotary_dim()));
  w.add_u32(ga + ".vocab_size", uint32_t(c.vocab_size));
  if (rotary) add_rope_scaling(w, ga, c, arch, model_dir);
  if (c.is_moe()) add_experts(w, ga, c, arch, model_dir);
  if (gemma) add_gemma(w, ga, c, model_dir);
  // A head size apart from d_model / n_head (Qwen3's), as llama.cpp reads it.
  if (c.mla()) {
    add_latent_attention(w, ga, c, model_dir);
  } else if (c.head_dim() * c.n_head != c.d_model) {
    w.add_u32(ga + ".attention.key_length", uint32_t(c.head_dim()));
    w.add_u32(ga + ".attention.value_length", uint32_t(c.out_head_dim()));
  }

  // The tokenizer before the weights: its errors are cheaper to find.
  result.tokenizer = add_tokenizer(w, model_dir, c, opt.tokenizer);

  std::unique_ptr<Transformer> model = load_model(model_dir, DType::F32, opt.allow_nonfinite);
  Transformer* m = model.get();
  // 1-d tensors (norms, biases) stay f32, as llama.cpp's converter stores them.
  for (const ExternalTensor& e : arch.gguf_tensors(c)) {
    if (e.kv_b == ExternalTensor::KvB::Unsplit) continue;  // read by import, never written
    const ParamInfo& p = m->layout().find(e.param);
    if (e.head_split > 0) {
      add_head_split(w, e, p, m, opt.type, c);
      continue;
    }
    Shape shape = p.shape;
    // The first row of each slice: one, or one per expert of a stacked tensor.
    std::vector<int64_t> row0 = {0};
    if (e.experts > 0) {
      row0.clear();
      for (int64_t x = 0; x < e.experts; ++x) {
        const ParamPart& part = p.part(fmt::format(fmt::runtime(e.part), x));
        row0.push_back(part.row0);
        shape = {e.experts, part.rows, p.shape[1]};
      }
    } else if (!e.part.empty()) {
      row0[0] = p.part(e.part).row0;
      shape[0] = p.part(e.part).rows;
    } else if (e.flat) {
      shape = {p.numel()};  // [1, in] as [in]
    }
    const int64_t rows = shape.size() > 2 ? shape[1] : shape[0];
    const int64_t in = shape.size() > 1 ? shape.back() : 1;
    const int64_t heads = e.rope_heads;
    const float add = e.add;
    w.add_tensor(
        e.name, shape,
        gguf_tensor_type(opt.type, e.name, shape, c.n_layer, c.tied_embeddings, c.num_experts),
        [m, &p, row0, rows, in, heads, add](std::vector<float>& out) {
          const float* base = ParamLayout::view(m->params(), p).data<float>();
          out.resize(size_t(row0.size() * rows * in));
          for (size_t x = 0; x < row0.size(); ++x) {
            const float* src = base + row0[x] * in;
            float* dst = out.data() + x * size_t(rows * in);
            if (heads > 0)
              permute_rope_rows(src, dst, heads, rows / heads, in);
            else
              std::copy(src, src + rows * in, dst);
          }
          if (add != 0)
            for (float& x : out) x += add;
        });
  }

  w.write(out_path, opt.progress);
  result.tensors = w.tensor_count();
  return result;
}

GgufExportResult requantize_gguf(const std::string& in_path, const std::string& out_path,
                                 const std::string& recipe, bool allow_requantize,
                                 Progress* progress) {
  check_gguf_recipe(recipe);
  if (fs::exists(out_path) && fs::exists(in_path) && fs::equivalent(in_path, out_path))
    fail("'{}': the output would replace the input", out_path);
  OutputLock lock(out_path, LockAt::Beside);
  remove_stale_temporaries_of(out_path);
  std::unique_ptr<GgufFile> f = GgufFile::open(in_path);
  const std::string ga = f->get_string("general.architecture", "");
  const int64_t n_layer = f->get_int(ga + ".block_count", 0);
  const bool tied = f->find("output.weight") == nullptr;
  const int64_t n_expert = f->get_int(ga + ".expert_count", 0);
  GgufWriter w;
  for (const GgufFile::RawKv& kv : f->raw_metadata()) {
    if (kv.key == "general.file_type" || kv.key == "general.quantization_version" ||
        kv.key == "general.alignment")
      continue;
    w.add_raw(kv.key, kv.type, kv.bytes);
  }
  w.add_u32("general.file_type", file_type(recipe));
  if (recipe != "f32" && recipe != "f16" && recipe != "bf16")
    w.add_u32("general.quantization_version", 2);
  w.add_u32("general.alignment", 32);
  for (const GgufFile::TensorInfo& t : f->tensors()) {
    if (!t.known)
      fail(
          "GGUF '{}': tensor '{}' is of type {}, which Nekton does not read (f32, f16, bf16, "
          "q8_0, q4_0, q4_k, q6_k)",
          in_path, t.name, ggml_type_number_name(t.type));
    if (t.shape.size() > 1 && ggml_is_quantized(GgmlType(t.type)) && !allow_requantize)
      fail(
          "GGUF '{}': tensor '{}' is already {}; quantising it again loses more than once "
          "(--allow-requantize to do it anyway)",
          in_path, t.name, ggml_type_number_name(t.type));
    const GgmlType type = gguf_tensor_type(recipe, t.name, t.shape, n_layer, tied, n_expert);
    const GgufFile::TensorInfo* src = &t;
    w.add_tensor(t.name, t.shape, type, [src](std::vector<float>& out) {
      const int64_t in = src->shape.back(), rows = shape_numel(src->shape) / in;
      out.resize(size_t(rows * in));
      gguf_decode_rows(*src, 0, rows, out.data());
    });
  }
  w.write(out_path, progress);
  GgufExportResult r;
  r.tensors = w.tensor_count();
  r.tokenizer = f->get_string("tokenizer.ggml.model", "");
  return r;
}

}  // namespace nk
