// Shared by the llama.cpp comparison tests (gguf_llama_cpp_test.cc: dense
// architectures and tokenizers; gguf_llama_cpp_moe_test.cc: Mixture of
// Experts): running a GGUF through llama.cpp (the npm node-llama-cpp library,
// tests/ckpt/llama_cpp_eval.mjs), Nekton's logits and greedy tokens on the
// same weights, their comparison, and the LlamaCpp fixture (skipped without
// the package).
#pragma once
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
#include "test_paths.h"

namespace nk::test {

inline std::string llama_cpp_modules() {
  return assets_dir() + "/llama-cpp/node_modules";
}

inline bool have_llama_cpp() {
  return std::filesystem::exists(llama_cpp_modules() + "/node-llama-cpp/package.json") &&
         std::filesystem::exists(llama_cpp_modules() + "/@node-llama-cpp/linux-x64");
}

struct LlamaCppRun {
  std::vector<std::vector<float>> logits;  // [prompt position][vocab]
  std::vector<int32_t> greedy;
  std::vector<int32_t> tokenized;
  std::string detokenized;
};

inline LlamaCppRun run_llama_cpp(const std::string& gguf, const std::vector<int32_t>& prompt,
                                 int64_t n_gen, const std::string& text) {
  std::string ids;
  for (int32_t t : prompt) {
    if (!ids.empty()) ids += ',';
    ids += std::to_string(t);  // (not "," + a temporary: GCC 12's -Wrestrict misfires once inlined)
  }
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
inline std::vector<std::vector<float>> nekton_logits(Transformer& m,
                                                     const std::vector<int32_t>& tokens) {
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

inline int32_t argmax(const std::vector<float>& v) {
  return int32_t(std::max_element(v.begin(), v.end()) - v.begin());
}

inline std::vector<int32_t> nekton_greedy(Transformer& m, std::vector<int32_t> tokens, int64_t n) {
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
inline std::vector<int32_t> generator_greedy(Transformer& m, const std::vector<int32_t>& prompt,
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
inline void round_matrices(Transformer& m, GgmlType type) {
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

inline double rms(const std::vector<std::vector<float>>& x) {
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

inline Compared compare_logits(const std::vector<std::vector<float>>& want,
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

// A prompt of the SentencePiece vocabulary: BOS and some text.
inline std::vector<int32_t> spm_prompt(const std::string& spm, const std::string& text) {
  auto tok = SentencePieceTokenizer::open(spm);
  std::vector<int32_t> prompt = {tok->bos_id()};
  for (int32_t t : tok->encode(text)) prompt.push_back(t);
  return prompt;
}

// Exports `model_dir` as f32 or f16 (with `flags` added) and runs `prompt` in
// llama.cpp: logits at every position within rel_tol of the logits' RMS (of
// Nekton's on the weights rounded as exported) and the same greedy
// continuation. With `tok`, llama.cpp also tokenizes `text` as `tok` does
// and spells it back. Returns Nekton's logits.
inline std::vector<std::vector<float>> expect_llama_cpp_agrees(
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

}  // namespace nk::test
