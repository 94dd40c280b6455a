#include "ckpt/peft_adapter.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "ckpt/hf_files.h"
#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/json.h"
#include "core/limits.h"
#include "core/log.h"
#include "model/arch.h"

namespace nk {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

constexpr const char* kConfig = "adapter_config.json";
constexpr const char* kWeights = "adapter_model.safetensors";

// A key that must be absent, null, false or empty: a PEFT option this
// reader does not implement.
void refuse_option(const json& j, const std::string& where, const char* key, const char* what) {
  if (!j.contains(key)) return;
  const json& v = j.at(key);
  if (v.is_null() || (v.is_boolean() && !v.get<bool>()) || (v.is_object() && v.empty()) ||
      (v.is_array() && v.empty()))
    return;
  fail("{}: '{}' = {} is not supported ({})", where, key, v.dump(), what);
}

// The routers peft.train_router trains: their layout names and Hugging
// Face module paths (not Qwen2-MoE's shared_expert_gate).
std::vector<std::pair<std::string, std::string>> trained_routers(const ModelConfig& c) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& r : router_modules(c))
    if (r.first.ends_with(".moe.router.weight")) out.push_back(r);
  return out;
}

// PEFT's modules_to_save for the routers: the module's name within a layer
// ("block_sparse_moe.gate", "mlp.gate"), which PEFT matches as a suffix of
// each module's path (so Qwen2-MoE's mlp.shared_expert_gate is not one).
std::string router_module_name(const ModelConfig& c) {
  const std::vector<std::pair<std::string, std::string>> r = trained_routers(c);
  NK_CHECK(!r.empty(), "router_module_name: no router");
  const std::string& m = r.front().second;  // model.layers.0.block_sparse_moe.gate
  const std::string layers = "layers.";
  const size_t at = m.find(layers);
  NK_CHECK(at != std::string::npos, "router module '{}' is not under layers.N", m);
  return m.substr(m.find('.', at + layers.size()) + 1);
}

}  // namespace

std::vector<PeftTensor> peft_tensors(const ModelConfig& c) {
  std::vector<PeftTensor> out;
  auto add = [&](std::string name, std::string param, Shape shape, std::string part = "") {
    out.push_back({std::move(name), std::move(param), std::move(shape), std::move(part)});
  };
  const int64_t r = c.lora.rank;
  for (const AdaptedModule& t : lora_targets(c)) {
    const std::string m = "base_model.model." + t.module;
    add(m + ".lora_A.weight", t.a_name(), {r, t.in}, t.lora_part());
    add(m + ".lora_B.weight", t.b_name(), {t.rows, r}, t.lora_part());
  }
  // The trained routers as PEFT saves modules_to_save: the module's own
  // tensor names under base_model.model.
  if (c.lora.enabled() && c.lora.train_router)
    for (const auto& [param, module] : trained_routers(c))
      add("base_model.model." + module + ".weight", param, {c.num_experts, c.d_model});
  for (const AdaptedModule& t : ia3_targets(c))
    add("base_model.model." + t.module + ".ia3_l", t.ia3_name(),
        t.feedforward ? Shape{1, t.in} : Shape{t.rows, 1});
  const int64_t dim = c.bottleneck.dim;
  for (const AdaptedModule& t : bottleneck_targets(c)) {
    const std::string m = "base_model.model." + t.module + ".adapter.";
    add(m + "layer_norm.weight", t.adapter_name("ln.weight"), {t.out});
    add(m + "layer_norm.bias", t.adapter_name("ln.bias"), {t.out});
    add(m + "linear_in.weight", t.adapter_name("linear_in.weight"), {dim, t.out});
    add(m + "linear_out.weight", t.adapter_name("linear_out.weight"), {t.out, dim});
  }
  if (c.prompt.enabled())
    add("prompt_embeddings", kPromptTable, {c.prompt.virtual_tokens, c.d_model});
  return out;
}

namespace {

// A list of module names (or "all-linear"), sorted: PEFT keeps them as a set.
std::vector<std::string> module_list(const json& j, const std::string& where, const char* key,
                                     bool required) {
  if (!j.contains(key) || j.at(key).is_null()) {
    if (required) fail("{}: missing field '{}'", where, key);
    return {};
  }
  const json& t = j.at(key);
  std::vector<std::string> out;
  if (t.is_string() && t.get<std::string>() == "all-linear")
    out = {"all-linear"};
  else if (t.is_array() &&
           std::all_of(t.begin(), t.end(), [](const json& x) { return x.is_string(); }))
    out = t.get<std::vector<std::string>>();
  else
    fail(
        "{}: '{}' must be a list of module names (a regular expression is not supported), got "
        "{}",
        where, key, t.dump());
  std::sort(out.begin(), out.end());
  return out;
}

// PEFT's fan_in_fan_out for this architecture's modules: true where they are
// GPT-2's Conv1D, which stores [in, out].
bool fan_in_fan_out(const ModelConfig& c) {
  for (const ExternalTensor& e :
       c.architecture().hf_tensors(c, c.architecture().hf_tensor_prefix()))
    if (e.transposed) return true;
  return false;
}

}  // namespace

ModelConfig adapted_config(const ModelConfig& base, const PeftAdapterInfo& info) {
  ModelConfig c = base;
  c.lora = info.lora;
  c.ia3 = info.ia3;
  c.bottleneck = info.bottleneck;
  c.prompt = info.prompt;
  return c;
}

PeftAdapterInfo read_peft_adapter_config(const std::string& dir, const ModelConfig& base) {
  const fs::path path = fs::path(dir) / kConfig;
  const std::string where = path.string();
  const json j = parse_json_object(hf::read_text(path, "PEFT adapter '" + dir + "'"), where);
  auto str = [&](const char* key, const std::string& def) {
    if (!j.contains(key) || j.at(key).is_null()) return def;
    if (!j.at(key).is_string())
      fail("{}: '{}' must be a string, got {}", where, key, j.at(key).dump());
    return j.at(key).get<std::string>();
  };
  auto number = [&](const char* key, double def) {
    if (!j.contains(key)) return def;
    if (!j.at(key).is_number())
      fail("{}: '{}' must be a number, got {}", where, key, j.at(key).dump());
    return j.at(key).get<double>();
  };
  auto integer = [&](const char* key, int64_t limit) {
    if (!j.contains(key)) fail("{}: missing field '{}'", where, key);
    return json_int(j.at(key), where, key, 1, limit);
  };
  PeftAdapterInfo info;
  info.type = str("peft_type", "");
  const std::set<std::string> types = {"LORA", "IA3", "P_TUNING", "PROMPT_TUNING",
                                       "BOTTLENECK_ADAPTER"};
  if (!types.count(info.type))
    fail(
        "{}: 'peft_type' is {}, Nekton reads LORA, IA3, P_TUNING and PROMPT_TUNING adapters "
        "(and its own BOTTLENECK_ADAPTER)",
        where, j.contains("peft_type") ? j.at("peft_type").dump() : "missing");
  // modules_to_save: a MoE model's routers alone (peft.train_router).
  bool routers_saved = false;
  if (j.contains("modules_to_save") && j.at("modules_to_save").is_array() &&
      !j.at("modules_to_save").empty() && base.is_moe()) {
    const std::string router = router_module_name(base);
    for (const json& m : j.at("modules_to_save"))
      if (!m.is_string() ||
          !(m.get<std::string>() == router || router.ends_with("." + m.get<std::string>()) ||
            m.get<std::string>() == "gate"))
        fail(
            "{}: 'modules_to_save' = {} is not supported (adapter weights, and a "
            "Mixture-of-Experts "
            "model's routers: [\"{}\"])",
            where, j.at("modules_to_save").dump(), router);
    routers_saved = true;
  } else {
    refuse_option(j, where, "modules_to_save", "adapter weights only");
  }
  refuse_option(j, where, "layers_to_transform", "every layer is adapted");
  if (info.type == "LORA") {
    if (!j.contains("r")) fail("{}: missing field 'r'", where);
    info.lora.rank = json_int(j.at("r"), where, "r", 1, limits::kHidden);
    info.lora.alpha = number("lora_alpha", 8);
    info.lora.dropout = number("lora_dropout", 0);
    if (j.contains("use_rslora") && !j.at("use_rslora").is_null()) {
      if (!j.at("use_rslora").is_boolean()) fail("{}: 'use_rslora' must be true or false", where);
      info.lora.rslora = j.at("use_rslora").get<bool>();
    }
    refuse_option(j, where, "use_dora", "DoRA");
    refuse_option(j, where, "rank_pattern", "one rank for every module");
    refuse_option(j, where, "alpha_pattern", "one alpha for every module");
    refuse_option(j, where, "layer_replication", "no layer replication");
    if (const std::string bias = str("bias", "none"); bias != "none")
      fail("{}: 'bias' = \"{}\" is not supported (LoRA without bias training: \"none\")", where,
           bias);
    info.lora.target_modules = module_list(j, where, "target_modules", true);
    info.lora.train_router = routers_saved;
    // PEFT corrects a fan_in_fan_out that does not fit the module (nn.Linear
    // or Conv1D) with a warning; the adapter's tensors are the same either way.
    if (j.contains("fan_in_fan_out") && !j.at("fan_in_fan_out").is_null()) {
      if (!j.at("fan_in_fan_out").is_boolean())
        fail("{}: 'fan_in_fan_out' must be true or false, got {}", where,
             j.at("fan_in_fan_out").dump());
      const bool given = j.at("fan_in_fan_out").get<bool>(), fits = fan_in_fan_out(base);
      if (given != fits)
        NK_WARN("{}: 'fan_in_fan_out' is {} but {}'s modules are {}: applied as {} (as PEFT does)",
                where, given, base.architecture().display_name(),
                fits ? "Conv1D ([in, out])" : "nn.Linear ([out, in])", fits);
    }
  } else if (info.type == "P_TUNING" || info.type == "PROMPT_TUNING") {
    info.prompt.virtual_tokens = integer("num_virtual_tokens", limits::kSeqLen);
    if (j.contains("token_dim") && !j.at("token_dim").is_null() &&
        json_int(j.at("token_dim"), where, "token_dim") != base.d_model)
      fail("{}: 'token_dim' is {}, this base model's width is {} (an adapter for another base?)",
           where, j.at("token_dim").dump(), base.d_model);
    if (j.contains("num_transformer_submodules") && !j.at("num_transformer_submodules").is_null() &&
        json_int(j.at("num_transformer_submodules"), where, "num_transformer_submodules") != 1)
      fail("{}: 'num_transformer_submodules' must be 1 (a decoder-only model)", where);
  } else if (info.type == "BOTTLENECK_ADAPTER") {
    info.bottleneck.dim = integer("adapter_dim", limits::kHidden);
    info.bottleneck.target_modules = module_list(j, where, "target_modules", true);
    if (const std::string v = str("norm_position", "pre"); v != "pre")
      fail("{}: 'norm_position' = \"{}\" is not supported (\"pre\": LayerNorm on the input)", where,
           v);
    if (const std::string v = str("activation", "swish"); v != "swish")
      fail("{}: 'activation' = \"{}\" is not supported (\"swish\")", where, v);
    if (number("norm_eps", kBottleneckNormEps) != kBottleneckNormEps)
      fail("{}: 'norm_eps' must be {}", where, kBottleneckNormEps);
  } else {
    info.ia3.target_modules = module_list(j, where, "target_modules", true);
    info.ia3.feedforward_modules = module_list(j, where, "feedforward_modules", false);
    if (info.ia3.target_modules.empty()) fail("{}: 'target_modules' is empty", where);
  }
  if (routers_saved && info.type != "LORA")
    fail("{}: 'modules_to_save' (the routers) is read with LoRA adapters only", where);
  info.base_model = str("base_model_name_or_path", "");
  const ModelConfig c = adapted_config(base, info);
  try {
    validate_adapters(c, "");
  } catch (const Error& e) {
    throw e.with_context(where);
  }
  return info;
}

std::unique_ptr<Transformer> attach_peft_adapter(const Transformer& base, const std::string& dir,
                                                 PeftAdapterInfo* info_out) {
  NK_CHECK(!base.config().has_adapters(), "attach_peft_adapter: the base model has adapters");
  PeftAdapterInfo info = read_peft_adapter_config(dir, base.config());
  const ModelConfig cfg = adapted_config(base.config(), info);
  const std::string st_path = (fs::path(dir) / kWeights).string();
  if (!fs::exists(st_path)) fail("PEFT adapter: '{}' does not exist", st_path);
  SafetensorsFile file = SafetensorsFile::open(st_path);
  // Every tensor must belong to a target, and every target be there, before
  // anything is allocated.
  const std::vector<PeftTensor> tensors = peft_tensors(cfg);
  std::set<std::string> expected;
  for (const PeftTensor& t : tensors) {
    expected.insert(t.name);
    if (!file.has(t.name))
      fail("{}: missing tensor '{}' (the adapter's target_modules select it)", st_path, t.name);
    if (file.entry(t.name).shape != t.shape)
      fail(
          "{}: tensor '{}' has shape {}, this {} base model needs {} (an adapter for another "
          "base shape?)",
          st_path, t.name, shape_str(file.entry(t.name).shape), cfg.architecture().display_name(),
          shape_str(t.shape));
  }
  for (const SafetensorsEntry& e : file.entries())
    if (!expected.count(e.name))
      fail("{}: tensor '{}' is not a {} weight of {}this {} model", st_path, e.name,
           adapter_method(cfg), cfg.prompt.enabled() ? "" : "a target module of ",
           cfg.architecture().display_name());
  if (!file.entries().empty()) info.dtype = file.entries().front().dtype;

  // A tensor-parallel base (generate.tp, serve.tp) gets its adapters split
  // as training splits them: each rank its slice of the file's whole tensors.
  auto model = std::make_unique<Transformer>(
      cfg, base.compute_dtype(), 0, ParamInit::Zeros, std::vector<std::string>{}, base.device(),
      FrozenWeights::Master, QuantPlan(), base.tensor_parallel());
  Tensor src = const_cast<Transformer&>(base).params();
  for (const ParamInfo& p : base.layout().params())
    ops::convert(ParamLayout::view(model->params(), model->layout().find(p.name)),
                 ParamLayout::view(src, p));
  // A parameter's parts (LoRA's A and B) are one tensor of the file each.
  std::map<std::string, std::vector<const PeftTensor*>> parts;
  for (const PeftTensor& t : tensors) parts[t.param].push_back(&t);
  for (const auto& [name, of] : parts) {
    const ParamInfo& g = model->global_layout().find(name);
    Tensor whole = Tensor::zeros(g.shape, DType::F32);
    for (const PeftTensor* t : of) {
      Tensor w = lora_rows(g, whole, t->part);
      ops::convert(w, file.get(t->name).view(w.shape()));
      check_finite(w, st_path, t->name, false);
    }
    model->set_param_from_whole(model->layout().find(name), whole);
  }
  model->sync_compute_params();
  if (info_out) *info_out = info;
  return model;
}

void save_peft_adapter(const std::string& dir, const Transformer& model,
                       const std::string& base_model, DType dtype) {
  const ModelConfig& c = model.config();
  NK_CHECK(c.has_adapters(), "save_peft_adapter: the model has no adapters");
  std::vector<std::pair<std::string, Tensor>> tensors;
  Tensor params = const_cast<Transformer&>(model).params();
  for (const PeftTensor& t : peft_tensors(c)) {
    const ParamInfo& p = model.layout().find(t.param);
    Tensor f32 = Tensor::empty(p.shape, DType::F32), host = Tensor::empty(t.shape, dtype);
    // p-tuning's prompt: the encoder's output, as PEFT saves it.
    const bool encoded = t.param == kPromptTable && c.prompt.encoder_hidden > 0;
    ops::copy_to_host(encoded               ? model.prompt_f32()
                      : model.has_master(p) ? ParamLayout::view(params, p)
                                            : model.param_f32(p),
                      f32.data<float>());
    ops::convert(host, lora_rows(p, f32, t.part).view(t.shape));
    tensors.emplace_back(t.name, host);
  }
  std::sort(tensors.begin(), tensors.end(),
            [](const auto& x, const auto& y) { return x.first < y.first; });

  // The keys PEFT's configs write, sorted as its json.dump(sort_keys) does.
  auto modules = [](std::vector<std::string> m) {
    std::sort(m.begin(), m.end());
    return m.size() == 1 && m[0] == "all-linear" ? json("all-linear") : json(m);
  };
  const bool transposed = fan_in_fan_out(c);
  json j = json::object();
  j["base_model_name_or_path"] = base_model;
  j["fan_in_fan_out"] = transposed;
  j["inference_mode"] = true;
  j["modules_to_save"] = nullptr;
  if (c.lora.enabled() && c.lora.train_router) j["modules_to_save"] = {router_module_name(c)};
  j["revision"] = nullptr;
  j["task_type"] = "CAUSAL_LM";
  if (c.prompt.enabled()) {  // PEFT's PromptEncoderConfig, as saved after training
    j.erase("fan_in_fan_out");
    j["encoder_dropout"] = 0.0;
    j["encoder_hidden_size"] = c.prompt.encoder_hidden;
    j["encoder_num_layers"] = 2;
    j["encoder_reparameterization_type"] = "MLP";
    j["num_attention_heads"] = c.n_head;
    j["num_layers"] = c.n_layer;
    j["num_transformer_submodules"] = 1;
    j["num_virtual_tokens"] = c.prompt.virtual_tokens;
    j["peft_type"] = c.prompt.encoder_hidden > 0 ? "P_TUNING" : "PROMPT_TUNING";
    j["token_dim"] = c.d_model;
  } else if (c.bottleneck.enabled()) {
    j["activation"] = "swish";
    j["adapter_dim"] = c.bottleneck.dim;
    j["norm_eps"] = kBottleneckNormEps;
    j["norm_position"] = "pre";
    j["peft_type"] = "BOTTLENECK_ADAPTER";
    j["target_modules"] = modules(c.bottleneck.target_modules);
  } else {
    j["target_modules"] = modules(c.lora.enabled() ? c.lora.target_modules : c.ia3.target_modules);
    // PEFT's all-linear would adapt a MoE model's routers too; the modules
    // Nekton adapted are written by name instead (each a suffix PEFT matches).
    if (c.is_moe() && j["target_modules"] == "all-linear") {
      std::vector<std::string> names;
      for (const AdaptedModule& t : lora_targets(c))
        names.push_back(t.module.substr(t.module.rfind('.') + 1));
      std::sort(names.begin(), names.end());
      names.erase(std::unique(names.begin(), names.end()), names.end());
      j["target_modules"] = names;
    }
  }
  if (c.lora.enabled()) {
    j["alpha_pattern"] = json::object();
    j["bias"] = "none";
    j["init_lora_weights"] = true;
    j["layers_pattern"] = nullptr;
    j["layers_to_transform"] = nullptr;
    if (c.lora.alpha == std::floor(c.lora.alpha) && std::abs(c.lora.alpha) < 1e15)
      j["lora_alpha"] = int64_t(c.lora.alpha);  // PEFT's is an int; 16, not 16.0
    else
      j["lora_alpha"] = c.lora.alpha;
    j["lora_dropout"] = c.lora.dropout;
    j["peft_type"] = "LORA";
    j["r"] = c.lora.rank;
    j["rank_pattern"] = json::object();
    j["use_dora"] = false;
    j["use_rslora"] = c.lora.rslora;
  } else if (c.ia3.enabled()) {
    j["feedforward_modules"] = modules(c.ia3.feedforward_modules);
    j["init_ia3_weights"] = true;
    j["peft_type"] = "IA3";
  }

  fs::path tmp = temporary_path(dir);
  std::error_code ec;
  fs::remove_all(tmp, ec);
  if (!fs::create_directories(tmp, ec) && ec)
    fail("cannot create '{}': {}", tmp.string(), ec.message());
  try {
    save_safetensors((tmp / kWeights).string(), tensors, {{"format", "pt"}});
    write_file_atomic((tmp / kConfig).string(), j.dump(2));
    install_folder(tmp.string(), dir);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

}  // namespace nk
