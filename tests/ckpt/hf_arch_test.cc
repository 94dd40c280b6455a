// Hugging Face import/export of Qwen2 and of RoPE-scaled models, checked
// against the independent reference (tests/ckpt/hf_reference.py, which builds
// its model from config.json alone and computes the scaled frequencies as
// transformers' modeling_rope_utils defines them):
//  - the reference writes a tiny Qwen2 / scaled Llama / scaled Qwen2, Nekton
//    imports it: logits within 1e-5 relative (fp32) and the same greedy
//    continuation; the same weights without rope_scaling give logits that
//    differ by far more, so the test positions reach the scaled frequencies;
//  - Nekton exports, the reference reads (rope_scaling written back);
//  - published config.json files (Llama 3.2 1B with llama3 scaling, Qwen2.5
//    0.5B) map to Nekton's presets' shapes; unsupported keys are named;
//  - Nekton's own config.json carries the scaling and keeps the bytes of
//    unscaled models.
//
// The scaled models use theta 100 over heads of 16 so that a 48-token window
// spans every band: wavelengths 2 pi 10^(i/4) = 6.3, 11, 20, 35, 63, ...
// positions. llama3 (Llama 3.1's factors 8, 1, 4 over an original context of
// 32): one pair kept, two smoothed, five divided. yarn (factor 4 over an
// original context of 16, max_position_embeddings 64 = 4 x 16): pair 0 kept,
// pair 1 blended, the rest divided.
#include <gtest/gtest.h>

#include <cmath>

#include "hf_test_util.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kTol = 1e-5;

json scaled_spec(const std::string& arch, const json& rope_scaling) {
  json s = {{"arch", arch},      {"vocab", 97},
            {"ctx", 64},         {"layers", 2},
            {"hidden", 64},      {"heads", 4},
            {"kv_heads", 2},     {"ffn", 96},
            {"tied", false},     {"dtype", "F32"},
            {"shards", 1},       {"seed", 3},
            {"rope_theta", 100}, {"rope_scaling", rope_scaling},
            {"seq", 48}};
  // Phi-3's LongRoPE: an original context of 16 (config.json's top-level
  // original_max_position_embeddings; factor 64 / 16 = 4, attention factor
  // sqrt(1 + ln 4 / ln 16)) that the 48 positions pass, so that the long
  // factors apply in both; "phi3_short" keeps the original context at 64
  // (factor 1: the short factors, no attention scaling).
  // The greedy check's prompt (20 tokens) is past it too: transformers
  // chooses the factors by the sequence's length (model/rope.h).
  if (arch == "phi3") {
    s["original_ctx"] = rope_scaling.value("original_ctx", 16);
    s["prompt"] = 20;
  }
  s["rope_scaling"].erase("original_ctx");
  return s;
}

// Per-pair LongRoPE factors for heads of 16 (8 pairs), each pair its own.
json longrope_scaling(const char* type, int original_ctx) {
  return {{"type", type},
          {"short_factor", {1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8}},
          {"long_factor", {1.0, 1.5, 2.2, 3.4, 5.0, 7.5, 11.0, 16.0}},
          {"original_ctx", original_ctx}};
}

json qwen2_spec() {
  return {{"arch", "qwen2"}, {"vocab", 97},   {"ctx", 32},   {"layers", 2},      {"hidden", 32},
          {"heads", 4},      {"kv_heads", 2}, {"ffn", 48},   {"tied", true},     {"dtype", "F32"},
          {"shards", 1},     {"seed", 4},     {"eps", 1e-6}, {"rope_theta", 1e6}};
}

json llama3_scaling() {  // Llama 3.1's keys, the context scaled down
  return {{"factor", 8.0},
          {"high_freq_factor", 4.0},
          {"low_freq_factor", 1.0},
          {"original_max_position_embeddings", 32},
          {"rope_type", "llama3"}};
}

// The relative difference between the logits of two imported models over
// the reference's tokens of `name`.
double logits_moved(const TempDir& tmp, const std::string& name, const std::string& a,
                    const std::string& b) {
  SafetensorsFile ref = SafetensorsFile::open(tmp / (name + ".ref.safetensors"));
  auto ma = load_model(a, DType::F32), mb = load_model(b, DType::F32);
  return max_rel_diff(logits_of(*ma, ref.get("tokens")), logits_of(*mb, ref.get("tokens")));
}

// ---- published configs ----

TEST(HfArch, Llama32ConfigWithLlama3ScalingImports) {
  // meta-llama/Llama-3.2-1B's config.json, as published.
  const char* text = R"({
  "architectures": ["LlamaForCausalLM"],
  "attention_bias": false,
  "attention_dropout": 0.0,
  "bos_token_id": 128000,
  "eos_token_id": 128001,
  "head_dim": 64,
  "hidden_act": "silu",
  "hidden_size": 2048,
  "initializer_range": 0.02,
  "intermediate_size": 8192,
  "max_position_embeddings": 131072,
  "mlp_bias": false,
  "model_type": "llama",
  "num_attention_heads": 32,
  "num_hidden_layers": 16,
  "num_key_value_heads": 8,
  "pretraining_tp": 1,
  "rms_norm_eps": 1e-05,
  "rope_scaling": {
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
    "rope_type": "llama3"
  },
  "rope_theta": 500000.0,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.45.0.dev0",
  "use_cache": true,
  "vocab_size": 128256
})";
  HfModelInfo i = hf_model_info_from_json(text, "config.json");
  const ModelConfig& c = i.config;
  EXPECT_EQ(c.rope_scaling.type, RopeScalingType::Llama3);
  EXPECT_EQ(c.rope_scaling.factor, 32.0);
  EXPECT_EQ(c.rope_scaling.low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_scaling.high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_scaling.original_max_seq_len, 8192);
  // The shape is the llama-1b preset's.
  ModelConfig preset = model_preset("llama-1b");
  preset.norm_eps = 1e-5;
  preset.rope_scaling = c.rope_scaling;
  EXPECT_EQ(model_config_to_json(c), model_config_to_json(preset));
  // Export writes the dict back; it reads back the same.
  json back = json::parse(hf_config_json(c, DType::BF16));
  EXPECT_EQ(back["rope_scaling"], json::parse(text)["rope_scaling"]);
  EXPECT_EQ(model_config_to_json(hf_model_info_from_json(back.dump(), "exported").config),
            model_config_to_json(c));
}

TEST(HfArch, Qwen2ConfigMapping) {
  // Qwen/Qwen2.5-0.5B's config.json, as published.
  json q = json::parse(R"({
  "architectures": ["Qwen2ForCausalLM"],
  "attention_dropout": 0.0,
  "bos_token_id": 151643,
  "eos_token_id": 151643,
  "hidden_act": "silu",
  "hidden_size": 896,
  "initializer_range": 0.02,
  "intermediate_size": 4864,
  "max_position_embeddings": 32768,
  "max_window_layers": 24,
  "model_type": "qwen2",
  "num_attention_heads": 14,
  "num_hidden_layers": 24,
  "num_key_value_heads": 2,
  "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0,
  "sliding_window": 32768,
  "tie_word_embeddings": true,
  "torch_dtype": "bfloat16",
  "transformers_version": "4.43.1",
  "use_cache": true,
  "use_sliding_window": false,
  "vocab_size": 151936
})");
  HfModelInfo i = hf_model_info_from_json(q.dump(), "config.json");
  EXPECT_EQ(i.config.arch, "qwen2");
  EXPECT_EQ(i.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(model_config_to_json(i.config), model_config_to_json(model_preset("qwen2-0.5b")));
  json back = json::parse(hf_config_json(i.config, DType::BF16));
  EXPECT_EQ(back["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(back["model_type"], "qwen2");
  EXPECT_EQ(back["use_sliding_window"], false);
  EXPECT_EQ(model_config_to_json(hf_model_info_from_json(back.dump(), "exported").config),
            model_config_to_json(i.config));
  // Without the keys: Qwen2Config's defaults (rms_norm_eps 1e-6, untied, theta 1e4).
  json bare = q;
  for (const char* k : {"rms_norm_eps", "tie_word_embeddings", "rope_theta", "sliding_window",
                        "max_window_layers", "use_sliding_window"})
    bare.erase(k);
  ModelConfig b = hf_model_info_from_json(bare.dump(), "config.json").config;
  EXPECT_EQ(b.norm_eps, 1e-6);
  EXPECT_FALSE(b.tied_embeddings);
  EXPECT_EQ(b.rope_theta, 10000.0);

  auto err = [](json cfg) { return error_of([&] { hf_model_info_from_json(cfg.dump(), "C"); }); };
  json m = q;
  m["use_sliding_window"] = true;
  EXPECT_TRUE(contains(err(m), "C: unsupported 'use_sliding_window' = true")) << err(m);
  m = q;
  m["layer_types"] = json::array();
  for (int l = 0; l < 24; ++l)
    m["layer_types"].push_back(l < 20 ? "full_attention" : "sliding_attention");
  EXPECT_TRUE(contains(err(m), "'layer_types'")) << err(m);
  m["layer_types"] = json::array();
  for (int l = 0; l < 24; ++l) m["layer_types"].push_back("full_attention");
  EXPECT_EQ(err(m), "(no error)");
  m = q;
  m["hidden_act"] = "gelu";
  EXPECT_TRUE(contains(err(m), "'hidden_act'")) << err(m);
  m = q;
  m["model_type"] = "llama";
  EXPECT_TRUE(contains(err(m), "'model_type'")) << err(m);
}

TEST(HfArch, RopeScalingKeys) {
  json base = {{"architectures", {"LlamaForCausalLM"}},
               {"hidden_size", 64},
               {"intermediate_size", 96},
               {"num_hidden_layers", 2},
               {"num_attention_heads", 4},
               {"vocab_size", 100},
               {"max_position_embeddings", 256}};
  auto read = [](const json& j) { return hf_model_info_from_json(j.dump(), "C").config; };
  auto err = [](const json& j) {
    return error_of([&] { hf_model_info_from_json(j.dump(), "C"); });
  };
  // Older configs spell the type "type"; "rope_type" wins when both are there.
  json j = base;
  j["rope_scaling"] = {{"type", "linear"}, {"factor", 2}};
  EXPECT_EQ(read(j).rope_scaling.type, RopeScalingType::Linear);
  EXPECT_EQ(read(j).rope_scaling.factor, 2.0);
  j["rope_scaling"]["rope_type"] = "yarn";
  EXPECT_EQ(read(j).rope_scaling.type, RopeScalingType::Yarn);
  // yarn's optional keys: defaults, or as given (transformers reads 0 as unset).
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}, {"beta_fast", 0}};
  RopeScaling y = read(j).rope_scaling;
  EXPECT_EQ(y.beta_fast, 32.0);
  EXPECT_EQ(y.beta_slow, 1.0);
  EXPECT_EQ(y.original_max_seq_len, 0);
  EXPECT_EQ(y.attention_factor, 0.0);
  j["rope_scaling"] = {
      {"rope_type", "yarn"},     {"factor", 4.0},     {"beta_fast", 16},
      {"beta_slow", 2},          {"mscale", 1.0},     {"mscale_all_dim", 0.5},
      {"attention_factor", 1.1}, {"truncate", false}, {"original_max_position_embeddings", 64}};
  y = read(j).rope_scaling;
  EXPECT_EQ(y.beta_fast, 16.0);
  EXPECT_EQ(y.beta_slow, 2.0);
  EXPECT_EQ(y.mscale, 1.0);
  EXPECT_EQ(y.mscale_all_dim, 0.5);
  EXPECT_EQ(y.attention_factor, 1.1);
  EXPECT_FALSE(y.truncate);
  EXPECT_EQ(y.original_max_seq_len, 64);
  json back = json::parse(hf_config_json(read(j), DType::F32));
  EXPECT_EQ(read(back).rope_scaling, y);
  // "default" is no scaling; so is null.
  j["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_FALSE(read(j).rope_scaling.enabled());
  j["rope_scaling"] = nullptr;
  EXPECT_FALSE(read(j).rope_scaling.enabled());
  // transformers 5 writes rope_parameters, with theta inside.
  j = base;
  j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 1e6}};
  EXPECT_EQ(read(j).rope_theta, 1e6);
  EXPECT_FALSE(read(j).rope_scaling.enabled());
  j["rope_parameters"] = {{"rope_type", "linear"}, {"factor", 3.0}, {"rope_theta", 5e5}};
  EXPECT_EQ(read(j).rope_theta, 5e5);
  EXPECT_EQ(read(j).rope_scaling.factor, 3.0);

  // Errors name the key.
  j = base;
  j["rope_scaling"] = {{"rope_type", "llama3"},
                       {"factor", 8},
                       {"high_freq_factor", 4},
                       {"original_max_position_embeddings", 8192}};
  EXPECT_TRUE(contains(err(j), "C: 'rope_scaling' of type llama3 needs field 'low_freq_factor'"))
      << err(j);
  j["rope_scaling"]["low_freq_factor"] = 8;  // above high_freq_factor
  EXPECT_TRUE(contains(err(j), "rope_scaling.high_freq_factor")) << err(j);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", "2"}};
  EXPECT_TRUE(contains(err(j), "field 'rope_scaling.factor' must be a number")) << err(j);
  j["rope_scaling"] = {{"rope_type", "linear"}, {"factor", -2}};
  EXPECT_TRUE(contains(err(j), "rope_scaling.factor: must be a positive number")) << err(j);
  j["rope_scaling"] = {{"rope_type", "longrope"}, {"factor", 2}};
  EXPECT_TRUE(contains(err(j), "'rope_scaling' of type longrope needs field 'short_factor'"))
      << err(j);
  j["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2}};
  EXPECT_TRUE(contains(err(j), "C: unsupported 'rope_scaling'") && contains(err(j), "dynamic"))
      << err(j);
  j["rope_scaling"] = {{"factor", 2}};
  EXPECT_TRUE(contains(err(j), "'rope_scaling' has no 'rope_type'")) << err(j);
  j["rope_scaling"] = "linear";
  EXPECT_TRUE(contains(err(j), "'rope_scaling' must be an object")) << err(j);
  j["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4}, {"original_max_position_embeddings", 0}};
  EXPECT_TRUE(contains(err(j), "'rope_scaling.original_max_position_embeddings'")) << err(j);
}

// ---- Nekton's own config.json ----

TEST(HfArch, NektonConfigJsonCarriesScalingAndKeepsUnscaledBytes) {
  ModelConfig c = model_preset("llama-tiny");
  // The file as it was written before RoPE scaling existed.
  nlohmann::json legacy = {{"format", "nekton"},
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
  EXPECT_EQ(model_config_to_json(c), legacy.dump(2) + "\n");

  for (RopeScalingType t :
       {RopeScalingType::Linear, RopeScalingType::Llama3, RopeScalingType::Yarn}) {
    ModelConfig s = c;
    s.rope_scaling.type = t;
    s.rope_scaling.factor = 4;
    if (t == RopeScalingType::Llama3) {
      s.rope_scaling.low_freq_factor = 1;
      s.rope_scaling.high_freq_factor = 4;
      s.rope_scaling.original_max_seq_len = 64;
    }
    if (t == RopeScalingType::Yarn) {
      s.rope_scaling.beta_fast = 8;
      s.rope_scaling.attention_factor = 1.5;
      s.rope_scaling.truncate = false;
    }
    std::string text = model_config_to_json(s);
    EXPECT_EQ(json::parse(text)["rope_scaling"]["type"], rope_scaling_type_name(t));
    EXPECT_EQ(model_config_from_json(text, "config.json").rope_scaling, s.rope_scaling)
        << rope_scaling_type_name(t);
  }
  json bad = json::parse(model_config_to_json(c));
  bad["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}, {"fator", 3.0}};
  std::string e = error_of([&] { model_config_from_json(bad.dump(), "M/config.json"); });
  EXPECT_TRUE(contains(e, "M/config.json: unknown field 'rope_scaling.fator'")) << e;
  bad["rope_scaling"] = {{"type", "ntk"}, {"factor", 2.0}};
  e = error_of([&] { model_config_from_json(bad.dump(), "M/config.json"); });
  EXPECT_TRUE(contains(e, "rope_scaling.type") && contains(e, "'ntk'")) << e;
  bad["rope_scaling"] = {{"type", "linear"}};
  e = error_of([&] { model_config_from_json(bad.dump(), "M/config.json"); });
  EXPECT_TRUE(contains(e, "M/config.json: missing field 'rope_scaling.factor'")) << e;
}

// ---- HF (written by the reference) -> Nekton ----

TEST(HfArch, Qwen2ImportMatchesReference) {
  TempDir tmp("nk_hf_arch");
  // Tied, as the small Qwen2 models are; bf16 in two shards.
  json spec = qwen2_spec();
  spec["dtype"] = "BF16";
  spec["shards"] = 2;
  std::string hf = write_hf(tmp, "qwen2", spec);
  RunResult r = run_nekton("import hf " + hf + " " + (tmp / "nk"));
  ASSERT_EQ(r.code, 0) << r.out;
  expect_matches_reference(tmp, "qwen2", tmp / "nk", kTol);
  SafetensorsFile f = SafetensorsFile::open(tmp / "nk/model.safetensors");
  EXPECT_EQ(f.entry("h.0.attn.qkv.bias").shape, (Shape{64}));  // q 32 + k 16 + v 16
  EXPECT_FALSE(f.has("h.0.attn.proj.bias"));
  EXPECT_FALSE(f.has("lm_head.weight"));

  // Untied, f32: Nekton's q, k, v bias parts are HF's tensors, bit for bit.
  spec = qwen2_spec();
  spec["tied"] = false;
  hf = write_hf(tmp, "qwen2_untied", spec);
  HfImportReport rep = import_hf(hf, tmp / "nk2");
  EXPECT_EQ(rep.architecture, "Qwen2ForCausalLM");
  EXPECT_EQ(rep.config.arch, "qwen2");
  expect_matches_reference(tmp, "qwen2_untied", tmp / "nk2", kTol);
  auto src = hf_tensors(hf);
  SafetensorsFile g = SafetensorsFile::open(tmp / "nk2/model.safetensors");
  std::string bias = std::string(static_cast<const char*>(g.get("h.1.attn.qkv.bias").raw()),
                                 g.get("h.1.attn.qkv.bias").nbytes());
  EXPECT_EQ(bias, src["model.layers.1.self_attn.q_proj.bias"].bytes +
                      src["model.layers.1.self_attn.k_proj.bias"].bytes +
                      src["model.layers.1.self_attn.v_proj.bias"].bytes);

  // A missing bias is named.
  SafetensorsFile h = SafetensorsFile::open(hf + "/model.safetensors");
  std::vector<std::pair<std::string, Tensor>> ts;
  for (const SafetensorsEntry& e : h.entries())
    if (e.name != "model.layers.0.self_attn.k_proj.bias") ts.emplace_back(e.name, h.get(e.name));
  fs::create_directories(tmp / "nobias");
  fs::copy_file(hf + "/config.json", tmp / "nobias/config.json");
  save_safetensors(tmp / "nobias/model.safetensors", ts);
  expect_import_error(tmp / "nobias", tmp / "out",
                      {"missing tensor 'model.layers.0.self_attn.k_proj.bias'", "Qwen2"});
}

TEST(HfArch, ScaledImportsMatchReference) {
  TempDir tmp("nk_hf_arch");
  struct Case {
    std::string name, arch;
    json rope_scaling;
  };
  std::vector<Case> cases = {
      {"llama3", "llama", llama3_scaling()},
      {"linear", "llama", {{"type", "linear"}, {"factor", 2.0}}},
      {"yarn",
       "llama",
       {{"rope_type", "yarn"},
        {"factor", 4.0},
        {"original_max_position_embeddings", 16},
        {"beta_fast", 2.0},
        {"beta_slow", 0.5},
        {"attention_factor", 1.2}}},
      // As Qwen2.5's model cards add it, in the older "type" spelling.
      {"qwen2_yarn",
       "qwen2",
       {{"factor", 4.0}, {"original_max_position_embeddings", 16}, {"type", "yarn"}}},
      // Phi-3's LongRoPE, past the original context (long factors) and, in
      // the older "su" spelling, within it (short factors).
      {"phi3_longrope", "phi3", longrope_scaling("longrope", 16)},
      {"phi3_su_short", "phi3", longrope_scaling("su", 64)},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::string hf = write_hf(tmp, c.name, scaled_spec(c.arch, c.rope_scaling));
    HfImportReport rep = import_hf(hf, tmp / (c.name + "_nk"));
    EXPECT_TRUE(rep.config.rope_scaling.enabled());
    expect_matches_reference(tmp, c.name, tmp / (c.name + "_nk"), kTol);

    // The same weights without the scaling: far from the reference.
    fs::copy(hf, tmp / (c.name + "_plain"), fs::copy_options::recursive);
    json cfg = read_json(hf + "/config.json");
    cfg.erase("rope_scaling");
    write_json(tmp / (c.name + "_plain/config.json"), cfg);
    import_hf(tmp / (c.name + "_plain"), tmp / (c.name + "_plain_nk"));
    double moved = logits_moved(tmp, c.name, tmp / (c.name + "_nk"), tmp / (c.name + "_plain_nk"));
    std::cout << "[ " << c.name << " ] logits without the scaling move by " << moved
              << " (relative)\n";
    EXPECT_GT(moved, 0.05);
  }
}

// ---- Nekton -> HF, read by the reference ----

TEST(HfArch, Qwen2ExportReadByReference) {
  TempDir tmp("nk_hf_arch");
  ModelConfig c = model_preset("qwen2-tiny");
  c.vocab_size = 97;
  c.init_std = 0.15;
  Transformer model(c, DType::F32, 9);
  // Nonzero biases (they start at zero), so that a misplaced one shows.
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const ParamInfo& p = model.layout().find(fmt::format("h.{}.attn.qkv.bias", l));
    float* b = ParamLayout::view(model.params(), p).data<float>();
    for (int64_t i = 0; i < p.numel(); ++i) b[i] = 0.5f * std::sin(float(i * 7 + l));
  }
  model.sync_compute_params();
  save_model(tmp / "model", model);
  HfExportOptions opt;
  opt.dtype = DType::F32;
  export_hf(tmp / "model", tmp / "hf", opt);
  json cfg = read_json(tmp / "hf/config.json");
  EXPECT_EQ(cfg["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(cfg["rope_theta"], 1e6);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  auto t = hf_tensors(tmp / "hf");
  EXPECT_EQ(t.size(), 1 + 2 * 12 + 1u);  // embed, 12 per layer (3 biases), norm; tied
  EXPECT_EQ(t["model.layers.0.self_attn.k_proj.bias"].shape, (Shape{32}));
  write_nekton_results(model, tmp / "nekton.safetensors");
  expect_reference_agrees(tmp / "hf", tmp / "nekton.safetensors", "qwen2-tied", kTol);
  // Without --dtype: bf16, as Qwen2 is published.
  export_hf(tmp / "model", tmp / "hf16");
  EXPECT_EQ(read_json(tmp / "hf16/config.json")["torch_dtype"], "bfloat16");
}

TEST(HfArch, ScaledExportReadByReferenceAndRoundTrip) {
  TempDir tmp("nk_hf_arch");
  struct Case {
    std::string name, arch;
    json rope_scaling;
  };
  for (const Case& c :
       {Case{"llama3", "llama", llama3_scaling()},
        Case{"yarn",
             "qwen2",
             {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 16}}},
        Case{"longrope", "phi3", longrope_scaling("longrope", 16)}}) {
    SCOPED_TRACE(c.name);
    json spec = scaled_spec(c.arch, c.rope_scaling);
    spec["dtype"] = "BF16";
    std::string hf = write_hf(tmp, c.name, spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (c.name + "_nk"))).code, 0);
    RunResult r =
        run_nekton("export hf " + (tmp / (c.name + "_nk")) + " " + (tmp / (c.name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    json back = read_json(tmp / (c.name + "_back/config.json"));
    RopeScaling want =
        hf_model_info_from_json(read_file(hf + "/config.json"), "src").config.rope_scaling;
    EXPECT_EQ(hf_model_info_from_json(back.dump(), "back").config.rope_scaling, want);
    EXPECT_EQ(back["rope_scaling"]["rope_type"], c.rope_scaling.contains("rope_type")
                                                     ? c.rope_scaling["rope_type"]
                                                     : c.rope_scaling["type"]);
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (c.name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    for (auto& [name, raw] : src) EXPECT_TRUE(out[name] == raw) << name;
    // The reference reads the export (its config alone says how to scale).
    auto model = load_model(tmp / (c.name + "_nk"), DType::F32);
    write_nekton_results(*model, tmp / (c.name + ".nekton.safetensors"), 48,
                         spec.value("prompt", 5));
    expect_reference_agrees(tmp / (c.name + "_back"), tmp / (c.name + ".nekton.safetensors"),
                            c.name, kTol);
  }
}

}  // namespace
}  // namespace nk
