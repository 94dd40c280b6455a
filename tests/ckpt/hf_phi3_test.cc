// Phi-3 (Llama's block with fused qkv_proj and gate_up_proj tensors and a
// sliding window) through Hugging Face import/export, checked against the
// independent reference (tests/ckpt/hf_reference.py slices the fused tensors
// as transformers' Phi3Attention and Phi3MLP do: q, k, v rows in that order,
// gate then up). Grouped-query attention (4 heads over 2 key/value heads)
// makes a misplaced k or v slice show. Tolerance 1e-5 relative in fp32, as
// for the other Llama-style families.
#include <gtest/gtest.h>

#include "ckpt/gguf_import.h"
#include "hf_test_util.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;

constexpr double kTol = 1e-5;

json phi3_spec(const json& window) {
  json s = llama_spec();
  s["arch"] = "phi3";
  s["window"] = window;
  s["seed"] = 13;
  return s;
}

TEST(HfPhi3, ImportMatchesReferenceWithAWindowShorterThanTheRows) {
  TempDir tmp("nk_hf_phi3");
  std::string hf = write_hf(tmp, "phi3", phi3_spec(5));
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, "Phi3ForCausalLM");
  EXPECT_EQ(rep.config.arch, "phi3");
  EXPECT_EQ(rep.config.sliding_window, 5);
  EXPECT_LT(rep.config.n_kv_head, rep.config.n_head);
  expect_matches_reference(tmp, "phi3", tmp / "nk", kTol);
}

TEST(HfPhi3, ExportReproducesEverySourceTensor) {
  TempDir tmp("nk_hf_phi3");
  for (const char* dtype : {"F32", "BF16"}) {
    SCOPED_TRACE(dtype);
    json spec = phi3_spec(nullptr);
    spec["dtype"] = dtype;
    const std::string name = std::string("phi3_") + dtype;
    std::string hf = write_hf(tmp, name, spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (name + "_nk"))).code, 0);
    RunResult r =
        run_nekton("export hf " + (tmp / (name + "_nk")) + " " + (tmp / (name + "_back")));
    ASSERT_EQ(r.code, 0) << r.out;
    auto src = hf_tensors(hf), out = hf_tensors(tmp / (name + "_back"));
    ASSERT_EQ(out.size(), src.size());
    EXPECT_TRUE(src.count("model.layers.0.self_attn.qkv_proj.weight"));
    EXPECT_TRUE(src.count("model.layers.1.mlp.gate_up_proj.weight"));
    for (auto& [t, raw] : src) EXPECT_TRUE(out[t] == raw) << t;
    json back = read_json(tmp / (name + "_back/config.json"));
    EXPECT_EQ(back["architectures"][0], "Phi3ForCausalLM");
    EXPECT_EQ(back["model_type"], "phi3");
    EXPECT_TRUE(back["sliding_window"].is_null());
  }
}

TEST(HfPhi3, ExportReadByReferenceKeepsTheWindow) {
  TempDir tmp("nk_hf_phi3");
  ModelConfig c = model_preset("phi3-tiny");
  c.vocab_size = 97;
  c.n_kv_head = 2;
  c.sliding_window = 4;
  c.init_std = 0.15;
  Transformer model(c, DType::F32, 3);
  save_model(tmp / "model", model);
  HfExportOptions opt;
  opt.dtype = DType::F32;
  export_hf(tmp / "model", tmp / "hf", opt);
  EXPECT_EQ(read_json(tmp / "hf/config.json")["sliding_window"], 4);
  write_nekton_results(model, tmp / "nekton.safetensors");
  expect_reference_agrees(tmp / "hf", tmp / "nekton.safetensors", "phi3", kTol);
  EXPECT_EQ(import_hf(tmp / "hf", tmp / "back").config.sliding_window, 4);
}

// LongRoPE factor lists of another length than the rotated values' pairs,
// and a partial rotary factor outside (0, 1], are refused, naming the key;
// nothing is written. (LongRoPE itself imports: hf_arch_test.cc checks it
// against the reference past the original context.)
TEST(HfPhi3, LongRopeOfTheWrongLengthAndABadPartialRotaryAreRefusedByName) {
  TempDir tmp("nk_hf_phi3");
  std::string hf = write_hf(tmp, "phi3_bad", phi3_spec(nullptr));
  json cfg = read_json(hf + "/config.json");
  json longrope = cfg;
  longrope["rope_scaling"] = {{"type", "longrope"},
                              {"short_factor", json::array({1.0, 1.0})},
                              {"long_factor", json::array({2.0, 2.0})}};
  write_json(hf + "/config.json", longrope);
  expect_import_error(hf, tmp / "out1",
                      {"config.json", "'rope_scaling.short_factor' has 2 factors"});
  json partial = cfg;
  partial["partial_rotary_factor"] = 1.5;
  write_json(hf + "/config.json", partial);
  expect_import_error(hf, tmp / "out2", {"partial_rotary_factor"});
}

// Phi-4-mini's partial rotary (0.75 of each head of 8: the first 6 values
// rotate) imports to the reference's logits (transformers' q_rot / q_pass)
// and exports the factor back.
TEST(HfPhi3, PartialRotaryMatchesReferenceAndExportsTheFactor) {
  TempDir tmp("nk_hf_phi3");
  json spec = phi3_spec(nullptr);
  spec["partial_rotary"] = 0.75;
  std::string hf = write_hf(tmp, "phi4", spec);
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.config.rotary_dim(), 6);
  expect_matches_reference(tmp, "phi4", tmp / "nk", kTol);
  RunResult r = run_nekton("export hf " + (tmp / "nk") + " " + (tmp / "back"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(read_json(tmp / "back/config.json")["partial_rotary_factor"], 0.75);
}

// GGUF in llama.cpp's phi3 layout: the fused attn_qkv and ffn_up (gate then
// up) whole, read back by Nekton's importer to the same logits; a window
// shorter than the context is refused (llama.cpp's phi3 graph ignores it).
TEST(HfPhi3, GgufRoundTripKeepsTheLogits) {
  TempDir tmp("nk_hf_phi3");
  ModelConfig c = model_preset("phi3-tiny");
  c.sliding_window = 0;
  c.n_kv_head = 2;
  c.init_std = 0.15;
  Transformer model(c, DType::F32, 5);
  save_model(tmp / "model", model);
  RunResult r = run_nekton("export gguf " + (tmp / "model") + " " + (tmp / "m.gguf") +
                           " --tokenizer bytes --type f32");
  ASSERT_EQ(r.code, 0) << r.out;
  GgufModel back = load_gguf_model(tmp / "m.gguf");
  EXPECT_EQ(back.model->config().arch, "phi3");
  Tensor tokens = Tensor::empty({1, 12}, DType::I32);
  for (int i = 0; i < 12; ++i) tokens.data<int32_t>()[i] = (i * 37 + 5) % 257;
  EXPECT_LT(max_rel_diff(logits_of(*back.model, tokens), logits_of(model, tokens)), 1e-6);

  ModelConfig w = model_preset("phi3-tiny");
  Transformer windowed(w, DType::F32, 1);
  save_model(tmp / "windowed", windowed);
  r = run_nekton("export gguf " + (tmp / "windowed") + " " + (tmp / "w.gguf") +
                 " --tokenizer bytes");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "sliding-window attention (127 positions)")) << r.out;
  EXPECT_FALSE(fs::exists(tmp / "w.gguf"));
}

}  // namespace
}  // namespace nk
