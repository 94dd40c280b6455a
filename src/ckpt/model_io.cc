#include "ckpt/model_io.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "ckpt/checkpoint.h"
#include "ckpt/load_progress.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/json.h"
#include "core/log.h"
#include "model/arch.h"
#include "ops/ops.h"

namespace nk {

namespace fs = std::filesystem;
using nlohmann::json;

std::string model_config_to_json(const ModelConfig& c) {
  json j = {{"format", "nekton"},
            {"arch", c.arch},
            {"vocab_size", c.vocab_size},
            {"max_seq_len", c.max_seq_len},
            {"n_layer", c.n_layer},
            {"n_head", c.n_head},
            {"n_kv_head", c.n_kv_head},
            {"d_model", c.d_model},
            {"d_ff", c.d_ff},
            {"norm_eps", c.norm_eps},
            {"rope_theta", c.rope_theta},
            {"tied_embeddings", c.tied_embeddings},
            {"init_std", c.init_std}};
  // Only when set, so the config of a model without one stays as it was.
  if (c.sliding_window > 0) j["sliding_window"] = c.sliding_window;
  if (c.sliding_window_pattern > 0) j["sliding_window_pattern"] = c.sliding_window_pattern;
  if (c.rope_local_theta > 0) j["rope_local_theta"] = c.rope_local_theta;
  if (c.query_pre_attn_scalar > 0) j["query_pre_attn_scalar"] = c.query_pre_attn_scalar;
  if (c.attn_logit_softcap > 0) j["attn_logit_softcap"] = c.attn_logit_softcap;
  if (c.final_logit_softcap > 0) j["final_logit_softcap"] = c.final_logit_softcap;
  if (c.attn_head_dim > 0) j["head_dim"] = c.attn_head_dim;
  if (c.partial_rotary_factor != 1.0) j["partial_rotary_factor"] = c.partial_rotary_factor;
  if (c.qk_norm) j["qk_norm"] = true;
  if (c.mla())
    j["mla"] = {{"q_lora_rank", c.q_lora_rank},
                {"kv_lora_rank", c.kv_lora_rank},
                {"qk_rope_head_dim", c.qk_rope_head_dim},
                {"v_head_dim", c.v_head_dim}};
  if (c.is_moe())
    j["moe"] = {{"num_experts", c.num_experts},
                {"num_experts_per_tok", c.num_experts_per_tok},
                {"moe_d_ff", c.moe_d_ff},
                {"norm_topk_prob", c.norm_topk_prob},
                {"score_func", c.moe_score_func},
                {"aux_loss_coeff", c.moe_aux_loss_coeff},
                {"z_loss_coeff", c.moe_z_loss_coeff},
                {"capacity_factor", c.moe_capacity_factor},
                {"aux_loss_type", c.moe_aux_loss_type},
                {"n_group", c.moe_n_group},
                {"topk_group", c.moe_topk_group},
                {"routed_scaling", c.moe_routed_scaling},
                {"score_bias", c.has_score_bias()},
                {"bias_update_rate", c.moe_bias_update_rate},
                {"first_dense_layers", c.moe_first_dense_layers}};
  if (!c.moe_dense_layers.empty()) j["moe"]["dense_layers"] = c.moe_dense_layers;
  if (c.moe_shared_d_ff > 0) {
    j["moe"]["shared_d_ff"] = c.moe_shared_d_ff;
    j["moe"]["shared_expert_gate"] = c.moe_shared_expert_gate;
  }
  // A sequence classifier (reward or attribute model).
  if (c.classifier()) {
    j["num_labels"] = c.num_labels;
    if (!c.labels.empty()) j["labels"] = c.labels;
  }
  if (c.value_head) j["value_head"] = true;  // a PPO policy's
  // Only when set, so that the files of unscaled models keep their bytes.
  if (c.rope_scaling.enabled()) j["rope_scaling"] = rope_scaling_to_json(c.rope_scaling);
  // A model with LoRA adapters in its weights (a fine-tuning run's).
  if (c.lora.enabled())
    j["lora"] = {{"rank", c.lora.rank},
                 {"alpha", c.lora.alpha},
                 {"dropout", c.lora.dropout},
                 {"rslora", c.lora.rslora},
                 {"target_modules", c.lora.target_modules}};
  if (c.lora.train_router) j["lora"]["train_router"] = true;  // only when set: the bytes stay
  if (c.ia3.enabled())
    j["ia3"] = {{"target_modules", c.ia3.target_modules},
                {"feedforward_modules", c.ia3.feedforward_modules}};
  if (c.bottleneck.enabled())
    j["bottleneck"] = {{"dim", c.bottleneck.dim}, {"target_modules", c.bottleneck.target_modules}};
  if (c.prompt.enabled())
    j["prompt"] = {{"virtual_tokens", c.prompt.virtual_tokens},
                   {"encoder_hidden", c.prompt.encoder_hidden}};
  return j.dump(2) + "\n";
}

ModelConfig model_config_from_json(const std::string& text, const std::string& where) {
  json j = parse_json_object(text, where);
  ModelConfig c;
  auto get = [&](const char* key, auto& field) {
    if (!j.contains(key)) fail("{}: missing field '{}'", where, key);
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, int64_t>) {
      field = json_int(j.at(key), where, key);
      return;
    }
    try {
      j.at(key).get_to(field);
    } catch (const json::exception&) {
      fail("{}: field '{}' has the wrong type ({})", where, key, j.at(key).dump());
    }
  };
  get("arch", c.arch);
  get("vocab_size", c.vocab_size);
  get("max_seq_len", c.max_seq_len);
  get("n_layer", c.n_layer);
  get("n_head", c.n_head);
  get("n_kv_head", c.n_kv_head);
  get("d_model", c.d_model);
  get("d_ff", c.d_ff);
  get("norm_eps", c.norm_eps);
  get("rope_theta", c.rope_theta);
  get("tied_embeddings", c.tied_embeddings);
  if (j.contains("init_std")) get("init_std", c.init_std);
  if (j.contains("sliding_window")) get("sliding_window", c.sliding_window);
  if (j.contains("sliding_window_pattern")) get("sliding_window_pattern", c.sliding_window_pattern);
  if (j.contains("rope_local_theta")) get("rope_local_theta", c.rope_local_theta);
  if (j.contains("query_pre_attn_scalar")) get("query_pre_attn_scalar", c.query_pre_attn_scalar);
  if (j.contains("attn_logit_softcap")) get("attn_logit_softcap", c.attn_logit_softcap);
  if (j.contains("final_logit_softcap")) get("final_logit_softcap", c.final_logit_softcap);
  if (j.contains("head_dim")) get("head_dim", c.attn_head_dim);
  if (j.contains("partial_rotary_factor")) get("partial_rotary_factor", c.partial_rotary_factor);
  if (j.contains("qk_norm")) get("qk_norm", c.qk_norm);
  if (j.contains("mla")) {  // Multi-head Latent Attention (DeepSeek)
    const json& m = j["mla"];
    if (!m.is_object()) fail("{}: field 'mla' must be an object, got {}", where, m.dump());
    for (auto [key, field] : {std::pair<const char*, int64_t*>{"q_lora_rank", &c.q_lora_rank},
                              {"kv_lora_rank", &c.kv_lora_rank},
                              {"qk_rope_head_dim", &c.qk_rope_head_dim},
                              {"v_head_dim", &c.v_head_dim}}) {
      if (!m.contains(key)) fail("{}: field 'mla' needs '{}'", where, key);
      *field = json_int(m.at(key), where, std::string("mla.") + key);
    }
  }
  if (j.contains("moe")) {
    const json& m = j["moe"];
    if (!m.is_object()) fail("{}: field 'moe' must be an object, got {}", where, m.dump());
    try {
      c.num_experts = json_int(m.at("num_experts"), where, "moe.num_experts");
      c.num_experts_per_tok =
          json_int(m.at("num_experts_per_tok"), where, "moe.num_experts_per_tok");
      c.moe_d_ff = json_int(m.at("moe_d_ff"), where, "moe.moe_d_ff");
      m.at("norm_topk_prob").get_to(c.norm_topk_prob);
      m.at("score_func").get_to(c.moe_score_func);
      m.at("aux_loss_coeff").get_to(c.moe_aux_loss_coeff);
      m.at("z_loss_coeff").get_to(c.moe_z_loss_coeff);
      if (m.contains("capacity_factor")) m.at("capacity_factor").get_to(c.moe_capacity_factor);
      // DeepSeek-style routing (absent from older files: Mixtral's).
      if (m.contains("aux_loss_type")) m.at("aux_loss_type").get_to(c.moe_aux_loss_type);
      if (m.contains("n_group")) c.moe_n_group = json_int(m.at("n_group"), where, "moe.n_group");
      if (m.contains("topk_group"))
        c.moe_topk_group = json_int(m.at("topk_group"), where, "moe.topk_group");
      if (m.contains("routed_scaling")) m.at("routed_scaling").get_to(c.moe_routed_scaling);
      if (m.contains("score_bias")) m.at("score_bias").get_to(c.moe_score_bias);
      if (m.contains("bias_update_rate")) m.at("bias_update_rate").get_to(c.moe_bias_update_rate);
      if (m.contains("first_dense_layers"))
        c.moe_first_dense_layers =
            json_int(m.at("first_dense_layers"), where, "moe.first_dense_layers");
      if (m.contains("dense_layers")) {
        const json& d = m.at("dense_layers");
        if (!d.is_array())
          fail("{}: field 'moe.dense_layers' must be a list, got {}", where, d.dump());
        for (const json& x : d)
          c.moe_dense_layers.push_back(json_int(x, where, "moe.dense_layers"));
      }
      if (m.contains("shared_d_ff"))
        c.moe_shared_d_ff = json_int(m.at("shared_d_ff"), where, "moe.shared_d_ff");
      if (m.contains("shared_expert_gate"))
        m.at("shared_expert_gate").get_to(c.moe_shared_expert_gate);
    } catch (const json::exception& e) {
      fail(
          "{}: field 'moe' needs num_experts, num_experts_per_tok, moe_d_ff, norm_topk_prob, "
          "score_func, aux_loss_coeff and z_loss_coeff ({})",
          where, e.what());
    }
  }
  if (j.contains("num_labels")) get("num_labels", c.num_labels);
  if (j.contains("labels")) get("labels", c.labels);
  if (j.contains("value_head")) get("value_head", c.value_head);
  if (j.contains("rope_scaling")) c.rope_scaling = rope_scaling_from_json(j["rope_scaling"], where);
  if (j.contains("lora")) {
    const json& l = j["lora"];
    if (!l.is_object()) fail("{}: field 'lora' must be an object, got {}", where, l.dump());
    try {
      c.lora.rank = json_int(l.at("rank"), where, "lora.rank");
      l.at("alpha").get_to(c.lora.alpha);
      l.at("dropout").get_to(c.lora.dropout);
      l.at("rslora").get_to(c.lora.rslora);
      l.at("target_modules").get_to(c.lora.target_modules);
      if (l.contains("train_router")) l.at("train_router").get_to(c.lora.train_router);
    } catch (const json::exception& e) {
      fail("{}: field 'lora' needs rank, alpha, dropout, rslora and target_modules ({})", where,
           e.what());
    }
    if (c.lora.rank <= 0) fail("{}: field 'lora.rank' must be positive", where);
  }
  if (j.contains("ia3")) {
    const json& a = j["ia3"];
    try {
      a.at("target_modules").get_to(c.ia3.target_modules);
      a.at("feedforward_modules").get_to(c.ia3.feedforward_modules);
    } catch (const json::exception& e) {
      fail("{}: field 'ia3' needs target_modules and feedforward_modules ({})", where, e.what());
    }
    if (c.ia3.target_modules.empty()) fail("{}: field 'ia3.target_modules' is empty", where);
  }
  if (j.contains("bottleneck")) {
    const json& a = j["bottleneck"];
    try {
      c.bottleneck.dim = json_int(a.at("dim"), where, "bottleneck.dim");
      a.at("target_modules").get_to(c.bottleneck.target_modules);
    } catch (const json::exception& e) {
      fail("{}: field 'bottleneck' needs dim and target_modules ({})", where, e.what());
    }
    if (c.bottleneck.dim <= 0) fail("{}: field 'bottleneck.dim' must be positive", where);
  }
  if (j.contains("prompt")) {
    const json& a = j["prompt"];
    try {
      c.prompt.virtual_tokens = json_int(a.at("virtual_tokens"), where, "prompt.virtual_tokens");
      c.prompt.encoder_hidden = json_int(a.at("encoder_hidden"), where, "prompt.encoder_hidden");
    } catch (const json::exception& e) {
      fail("{}: field 'prompt' needs virtual_tokens and encoder_hidden ({})", where, e.what());
    }
    if (c.prompt.virtual_tokens <= 0)
      fail("{}: field 'prompt.virtual_tokens' must be positive", where);
  }
  try {
    c.validate("");
  } catch (const Error& e) {
    throw e.with_context(where);
  }
  return c;
}

void save_model(const std::string& dir, Transformer& model) {
  fs::path final_dir = fs::path(dir);
  fs::path tmp = temporary_path(final_dir.string());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) && ec)
    fail("cannot create '{}': {}", tmp.string(), ec.message());
  try {
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const ParamInfo& p : model.layout().params()) {
      if (p.quantized)
        fail(
            "saving model to '{}': its base '{}' is held in NF4 (QLoRA), which is not saved; "
            "save the adapter and merge it into the original base",
            dir, p.name);
      tensors.emplace_back(p.name, model.has_master(p)
                                       ? ParamLayout::view(model.params(), p)
                                       : ParamLayout::view(model.compute_params(), p));
    }
    save_safetensors((tmp / "model.safetensors").string(), tensors, {{"format", "nekton"}});
    write_file_atomic((tmp / "config.json").string(), model_config_to_json(model.config()));
    install_folder(tmp.string(), final_dir.string());
  } catch (const fs::filesystem_error& e) {
    fs::remove_all(tmp, ec);
    fail("saving model to '{}': {}", dir, e.what());
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

void check_finite(const Tensor& t, const std::string& file, const std::string& name,
                  bool allow_nonfinite) {
  const int64_t bad = ops::count_nonfinite(t);
  if (bad == 0) return;
  std::string what = fmt::format("{}: tensor '{}' has {} non-finite values (NaN or Inf) of {}",
                                 file, name, bad, t.numel());
  if (!allow_nonfinite) fail("{}; refusing to load it (--allow-nonfinite loads it anyway)", what);
  NK_WARN("{} (loaded anyway: --allow-nonfinite)", what);
}

ModelConfig read_model_config(const std::string& dir) {
  fs::path cfg_path = fs::path(dir) / "config.json";
  std::ifstream in(cfg_path);
  if (!in) fail("model '{}': cannot read {}", dir, cfg_path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  return model_config_from_json(ss.str(), cfg_path.string());
}

namespace {

// Every tensor `layout` needs is in `file` with its shape (those a run adds
// to a base may be missing when keep_added), checked before any memory is sized from it.
void check_model_file(const SafetensorsFile& file, const ParamLayout& layout, bool keep_added) {
  for (const ParamInfo& p : layout.params()) {
    if (!file.has(p.name)) {
      if (keep_added && added_to_base(p)) continue;
      fail("{}: missing tensor '{}'", file.path(), p.name);
    }
    const auto& e = file.entry(p.name);
    if (e.shape != p.shape)
      fail("{}: tensor '{}' has shape {}, the model in config.json needs {}", file.path(), p.name,
           shape_str(e.shape), shape_str(p.shape));
  }
}

}  // namespace

void load_weights(Transformer& model, const std::string& dir, bool keep_added,
                  bool allow_nonfinite) {
  std::string st_path = (fs::path(dir) / "model.safetensors").string();
  SafetensorsFile file = SafetensorsFile::open(st_path);
  check_model_file(file, model.layout(), keep_added);
  double total = 0;
  for (const ParamInfo& p : model.layout().params())
    if (file.has(p.name)) total += double(file.entry(p.name).end - file.entry(p.name).begin);
  LoadProgress progress(st_path, total);
  for (const ParamInfo& p : model.layout().params()) {
    if (!file.has(p.name)) continue;  // an adapter kept (checked above)
    Tensor t = file.get(p.name);
    check_finite(t, st_path, p.name, allow_nonfinite);
    model.set_param(p, t);
    progress.advance(double(file.entry(p.name).end - file.entry(p.name).begin));
  }
  progress.finish();
}

void load_weight_pieces(Transformer& m, const std::string& dir, const ParamLayout& whole,
                        const std::function<bool(const ParamInfo&)>& in_file,
                        bool allow_nonfinite) {
  const nn::TensorParallel& tp = m.tensor_parallel();
  // An NF4 share is cut from the whole tensor's blocks (its absmaxes are
  // quantised over the whole); a block-quantised one (generate.quantize) is
  // its own slice quantised, the same blocks (whole rows, or columns cut at
  // a multiple of the block: quant_plan_for).
  const auto read_whole = [&](const ParamInfo& p) {
    return tp.active() && p.quantized && m.frozen_weights() == FrozenWeights::Nf4;
  };
  const ParamLayout mine =
      m.layout().subset([&](const ParamInfo& p) { return in_file(p) && !read_whole(p); });
  const std::string path = (fs::path(dir) / "model.safetensors").string();
  const SafetensorsFile file = SafetensorsFile::open(path);
  double whole_bytes = 0;
  for (const ParamInfo& p : m.layout().params())
    if (in_file(p) && read_whole(p) && file.has(p.name))  // (a missing one: named below)
      whole_bytes += double(file.entry(p.name).end - file.entry(p.name).begin);
  LoadProgress progress(path, flat_tensor_read_bytes(file, mine, "") + whole_bytes);
  read_tensor_shards(
      file, whole, "", mine, tp.rank(), tp.size(),
      [&](const ParamInfo& p, const Tensor& values) {
        const ParamInfo& q = m.layout().find(p.name);
        if (m.has_master(q)) return ParamLayout::view(m.params(), q);
        if (values.defined()) {
          check_finite(values, path, p.name, allow_nonfinite);
          m.set_param(q, values);
        }
        return Tensor();
      },
      &progress);
  for (const ParamInfo& p : m.layout().params()) {
    if (!in_file(p) || !read_whole(p)) continue;
    const Tensor values = file.get(p.name);  // (its shape checked with the others above)
    check_finite(values, path, p.name, allow_nonfinite);
    m.set_param_from_whole(p, values);
    progress.advance(double(file.entry(p.name).end - file.entry(p.name).begin));
  }
  progress.finish();
  for (const ParamInfo& p : mine.params())
    if (m.has_master(m.layout().find(p.name)))
      check_finite(ParamLayout::view(m.params(), m.layout().find(p.name)), path, p.name,
                   allow_nonfinite);
  m.sync_compute_params();
}

std::unique_ptr<Transformer> load_model(const std::string& dir, DType compute, bool allow_nonfinite,
                                        Device device, const nn::TensorParallel& tp) {
  ModelConfig cfg = read_model_config(dir);
  // Check every tensor against the layout before allocating the model, so a
  // config.json that claims more than the file holds allocates nothing.
  check_model_file(SafetensorsFile::open((fs::path(dir) / "model.safetensors").string()),
                   model_layout(cfg), false);
  auto model =
      std::make_unique<Transformer>(cfg, compute, 0, ParamInit::Zeros, std::vector<std::string>{},
                                    device, FrozenWeights::Master, QuantPlan(), tp);
  if (tp.active())
    load_weight_pieces(
        *model, dir, model->global_layout(), [](const ParamInfo&) { return true; },
        allow_nonfinite);
  else
    load_weights(*model, dir, false, allow_nonfinite);
  return model;
}

std::string model_folder_name(const std::string& dir) {
  fs::path p = fs::path(dir);
  if (p.filename().empty()) p = p.parent_path();  // "DIR/"
  return fs::absolute(p).lexically_normal().filename().string();
}

}  // namespace nk
