// Shared by the GGUF export tests: tiny saved Llama and GPT-2 models with a
// tokenizer stored beside them, and the files the Python reader and llama.cpp use.
#pragma once
#include <fmt/format.h>

#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "ckpt/model_io.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_trainer.h"
#include "data/tokenizer/sentencepiece_tokenizer.h"
#include "data/tokenizer/tokenizer.h"
#include "test_util.h"

namespace nk::test {

inline ModelConfig tiny_llama(int64_t vocab, bool tied) {
  ModelConfig c;
  c.arch = "llama";
  c.vocab_size = vocab;
  c.max_seq_len = 64;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_kv_head = 2;  // grouped-query: k and v have their own head count
  c.d_model = 64;
  c.d_ff = 96;
  c.norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.tied_embeddings = tied;
  // Larger than training's 0.02 so that logits spread over several units and
  // greedy continuations are not decided by near-ties.
  c.init_std = 0.15;
  return c;
}

// A GPT-2 model of the same size (multi-head attention, MLP 4 d_model).
inline ModelConfig tiny_gpt2(int64_t vocab, bool tied) {
  ModelConfig c = tiny_llama(vocab, tied);
  c.arch = "gpt2";
  c.n_kv_head = c.n_head;
  c.d_ff = 4 * c.d_model;
  return c;
}

// Saves a model with random weights to `dir` (every 1-d parameter, norm
// weights and biases, random around 1, so one written under the wrong name
// shows) and stores `tokenizer_spec` with it unless it is empty.
inline void save_tiny_model(const std::string& dir, const ModelConfig& c, uint64_t seed,
                            const std::string& tokenizer_spec) {
  Transformer m(c, DType::F32, seed);
  std::mt19937 rng(uint32_t(seed) + 7);
  std::normal_distribution<float> nd(0.f, 0.2f);
  for (const ParamInfo& p : m.layout().params()) {
    if (p.shape.size() != 1) continue;
    float* w = ParamLayout::view(m.params(), p).data<float>();
    for (int64_t i = 0; i < p.numel(); ++i) w[i] = 1.f + nd(rng);
  }
  m.sync_compute_params();
  save_model(dir, m);
  if (!tokenizer_spec.empty()) store_tokenizer(tokenizer_spec, dir);
}

// Deterministic English-like text (about `bytes` long) for training a small
// SentencePiece model.
inline std::string sample_text(size_t bytes) {
  static const char* words[] = {
      "the",    "model",  "writes", "a",      "file",    "that",     "llama", "reads",
      "tensor", "weight", "of",     "and",    "to",      "in",       "is",    "it",
      "quick",  "brown",  "fox",    "jumps",  "over",    "lazy",     "dog",   "river",
      "stone",  "light",  "green",  "number", "seven",   "hundred",  "cats",  "sleep",
      "under",  "warm",   "sun",    "while",  "birds",   "sing",     "songs", "about",
      "winter", "spring", "rain",   "falls",  "softly",  "on",       "roofs", "town",
      "people", "walk",   "slowly", "home",   "evening", "quantize", "block", "scale",
      "café",   "naïve",  "über",   "Straße", "déjà",    "vu",       "12",    "2024"};
  std::mt19937 rng(1234);
  std::string t;
  while (t.size() < bytes) {
    int n = 4 + int(rng() % 10);
    for (int i = 0; i < n; ++i) {
      std::string w = words[rng() % std::size(words)];
      if (i == 0) w[0] = char(std::toupper(static_cast<unsigned char>(w[0])));
      t += (i ? " " : "") + w;
    }
    t += rng() % 3 ? ".\n" : ", and more.\n";
  }
  return t;
}

// A Llama-style SentencePiece model (BPE, byte fallback) trained on
// sample_text, written to DIR/spm.model; returns its path.
inline std::string train_small_spm(const TempDir& dir, int64_t vocab) {
  std::string corpus = dir / "spm_corpus.txt", path = dir / "spm.model";
  write_file(corpus, sample_text(200000));
  SentencePieceTrainOptions o;
  o.inputs = {corpus};
  o.vocab_size = vocab;
  // One thread: the model then cannot depend on how threads are scheduled,
  // and the prompts the tests tokenise with it are the same every run.
  o.num_threads = 1;
  write_file(path, train_sentencepiece(o));
  return path;
}

// A byte-level BPE vocabulary (as `nekton tokenizer train --type bpe` makes
// one: <|endoftext|> after the merges) trained on sample_text with OpenAI
// encoding `pattern`'s regex, saved to DIR/NAME; returns the folder.
inline std::string train_small_bpe(const TempDir& dir, int64_t vocab, const std::string& pattern,
                                   const std::string& name = "bpe") {
  std::string corpus = dir / "bpe_corpus.txt", out = dir / name;
  write_file(corpus, sample_text(100000));
  BpeTrainOptions o;
  o.vocab_size = vocab;
  o.pattern = openai_pattern(pattern);
  o.threads = 1;
  save_bpe_tokenizer(train_bpe_from_files({corpus}, o), out);
  return out;
}

inline std::string hex(const std::string& bytes) {
  std::string h;
  for (unsigned char b : bytes) h += fmt::format("{:02x}", b);
  return h;
}

}  // namespace nk::test
