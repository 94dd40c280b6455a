// `nekton finetune`: a model learns a synthetic instruction task (reversing
// words) from prompt/answer records, greedy answers checked before and after,
// with every weight trained or with LoRA adapters on a base that learned to
// copy words; --show-sample shows what the loss covers; a stopped run resumes
// to the same weights as an unbroken one; bad settings and records are clear
// errors.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>

#include "ckpt/model_io.h"
#include "ckpt/safetensors.h"
#include "core/rng.h"
#include "data/chat/chat_template.h"
#include "data/tokenizer/tokenizer.h"
#include "model/arch.h"
#include "model/transformer.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
namespace fs = std::filesystem;

class Finetune : public ::testing::Test {
 protected:
  void SetUp() override {
    save_random_model(base_, 128);
    store_tokenizer("bytes", base_);
    Rng rng(11);
    for (int i = 0; i < 40; ++i) words_.push_back(random_word(rng));
    std::ofstream f(data_);
    for (int e = 0; e < 10; ++e)
      for (const std::string& w : words_)
        f << json{{"input", fmt::format("reverse {}:", w)},
                  {"output", fmt::format(" {}", reversed(w))}}
                 .dump()
          << "\n";
    // Copying other random words: what the LoRA tests' base learns first.
    std::ofstream copies(copy_data_);
    for (int i = 0; i < 400; ++i) {
      const std::string w = random_word(rng);
      copies << json{{"input", "repeat " + w + ":"}, {"output", " " + w}}.dump() << "\n";
    }
  }
  static std::string reversed(std::string w) { return {w.rbegin(), w.rend()}; }
  // `nekton ARGS` fails with `message`, leaving no OUT/model.
  static void expect_failure(const std::string& args, const std::string& message,
                             const std::string& out) {
    auto r = test::run_nekton(args);
    EXPECT_EQ(r.code, 1) << args << "\n" << r.out;
    EXPECT_TRUE(contains(r.out, message)) << args << "\n" << r.out;
    EXPECT_FALSE(fs::exists(out + "/model")) << args;
  }
  static std::string random_word(Rng& rng) {
    std::string w;
    for (int k = 0; k < 4; ++k) w += char('a' + rng.below(26));
    return w;
  }
  // A randomly initialised 2-layer GPT-2-style model over bytes of width C.
  static void save_random_model(const std::string& dir, int64_t C) {
    ModelConfig c;
    c.arch = "gpt2";
    c.vocab_size = 257;
    c.max_seq_len = 64;
    c.n_layer = 2;
    c.n_head = 4;
    c.n_kv_head = 4;
    c.d_model = C;
    c.d_ff = 4 * C;
    Transformer m(c, DType::F32, 7);
    save_model(dir, m);
  }
  // Greedy answers of the model in `dir` to every word; how many are right.
  int correct_answers(const std::string& dir, const std::string& extra = "") {
    const std::string prompts = d_ / "prompts.jsonl";
    {
      std::ofstream f(prompts);
      for (const std::string& w : words_)
        f << json{{"prompt", "reverse " + w + ":"}}.dump() << "\n";
    }
    auto r =
        test::run_nekton("generate generate.model=" + dir + " generate.prompt_file=" + prompts +
                         " generate.temperature=0 generate.max_tokens=6 " + extra);
    EXPECT_EQ(r.code, 0) << r.out;
    last_answers_ = r.out.substr(0, r.out.rfind("\n["));  // without the timing line
    int right = 0;
    for (const std::string& w : words_)
      right += contains(r.out, "reverse " + w + ": " + reversed(w) + "\n");
    return right;
  }
  std::string finetune_args(const std::string& out) const {
    return "finetune train.init_from=" + base_ + " data.sft_path=" + data_ +
           " data.chat_template=plain data.pack=true train.seq_len=64 train.micro_batch=8 "
           "train.global_batch=8 train.dtype=f32 train.lr=3e-3 train.warmup_steps=5 "
           "train.val_every=0 train.peak_tflops=1 train.out_dir=" +
           out;
  }
  // The base of the LoRA tests: every weight trained to copy words (once per suite).
  std::string copying_base() {
    const std::string out = d_ / "copying";
    if (!fs::exists(out + "/model")) {
      auto r = test::run_nekton(finetune_args(out) + " data.sft_path=" + copy_data_ +
                                " train.steps=150");
      EXPECT_EQ(r.code, 0) << r.out;
    }
    return out + "/model";
  }
  // Every base weight of run OUT's model is the one in `base`, bit for bit.
  static void expect_base_untouched(const std::string& out, const std::string& base) {
    const SafetensorsFile tuned = SafetensorsFile::open(out + "/model/model.safetensors"),
                          orig = SafetensorsFile::open(base + "/model.safetensors");
    for (const SafetensorsEntry& e : orig.entries()) {
      Tensor a = tuned.get(e.name), b = orig.get(e.name);
      EXPECT_EQ(0, std::memcmp(a.raw(), b.raw(), a.nbytes())) << e.name << " changed";
    }
  }
  std::string lora_args(const std::string& base, const std::string& out) const {
    return "finetune train.init_from=" + base + " data.sft_path=" + data_ +
           " data.chat_template=plain data.pack=true train.seq_len=64 train.micro_batch=8 "
           "train.global_batch=8 train.dtype=f32 train.lr=3e-3 train.warmup_steps=5 "
           "train.val_every=0 train.peak_tflops=1 peft.method=lora peft.target_modules=all-linear "
           "peft.lora_rank=16 peft.lora_alpha=32 train.out_dir=" +
           out;
  }
  // lora_args(base, a) + args in one go, and for b stopped after step 3 and
  // run again, which must resume; `log`: the first run's output.
  void run_and_resume(const std::string& base, const std::string& a, const std::string& b,
                      const std::string& args, std::string* log = nullptr) const {
    auto r = test::run_nekton(lora_args(base, a) + args);
    ASSERT_EQ(r.code, 0) << r.out;
    if (log) *log = r.out;
    r = test::run_nekton(lora_args(base, b) + args + " train.exit_at_step=3");
    ASSERT_EQ(r.code, 0) << r.out;
    r = test::run_nekton(lora_args(base, b) + args);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "resuming from checkpoint")) << r.out;
  }
  test::TempDir d_{"nk_finetune"};
  const std::string base_ = d_ / "base", data_ = d_ / "reverse.jsonl",
                    copy_data_ = d_ / "copy.jsonl";
  std::vector<std::string> words_;
  std::string last_answers_;  // generate's output in correct_answers
};

// From (near) none right to most right under greedy decoding.
TEST_F(Finetune, LearnsToReverseWords) {
  const int before = correct_answers(base_);
  const std::string out = d_ / "run";
  auto r = test::run_nekton(finetune_args(out) + " train.steps=120");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "chat template plain; " + data_ + ": 400 samples")) << r.out;
  EXPECT_TRUE(contains(r.out, "starting from the weights of " + base_)) << r.out;
  const int after = correct_answers(out + "/model");
  EXPECT_LE(before, 2);
  EXPECT_GE(after, 30) << "of " << words_.size() << ":\n" << last_answers_ << "\n" << r.out;
}

// LoRA on a base that copies words: from none right to most right, the base
// weights untouched; the same answers from the run's model, from the base
// with the PEFT adapter (unmerged), and from the merged export read back
// from Hugging Face's format.
TEST_F(Finetune, LoraLearnsToReverseWords) {
  const std::string base = copying_base(), out = d_ / "lora";
  const int before = correct_answers(base);
  auto r = test::run_nekton(lora_args(base, out) + " train.steps=300");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "peft: LoRA r=16 alpha=32 on 8 modules (all-linear); base frozen"))
      << r.out;
  EXPECT_TRUE(contains(
      r.out, "saved the LoRA adapter in Hugging Face PEFT's format to " + out + "/adapter"))
      << r.out;
  const int after = correct_answers(out + "/model");
  const std::string answers = last_answers_;
  EXPECT_LE(before, 2);
  EXPECT_GE(after, 30) << "of " << words_.size() << ":\n" << answers << "\n" << r.out;

  expect_base_untouched(out, base);
  EXPECT_EQ(correct_answers(base, "generate.adapter=" + out + "/adapter"), after);
  EXPECT_EQ(last_answers_, answers);

  r = test::run_nekton("export hf " + out + "/model " + std::string(d_ / "hf"));
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "has LoRA adapters; pass --merge-lora")) << r.out;
  r = test::run_nekton("export hf " + out + "/model " + std::string(d_ / "hf") + " --merge-lora");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_nekton("import hf " + std::string(d_ / "hf") + " " + std::string(d_ / "merged"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(correct_answers(d_ / "merged", "generate.tokenizer=bytes"), after);
}

// A random 4-expert Mixtral over bytes, saved once per test in d_/moe_base.
std::string moe_base(const test::TempDir& d) {
  const std::string base = d / "moe_base";
  if (fs::exists(base)) return base;
  ModelConfig c = model_preset("mixtral-tiny");
  c.vocab_size = 257;
  c.max_seq_len = 64;
  c.init_std = 0.1;
  Transformer m(c, DType::F32, 3);
  save_model(base, m);
  store_tokenizer("bytes", base);
  return base;
}

// LoRA on a Mixture-of-Experts model (a random 4-expert Mixtral over
// bytes): each expert's w1/w2/w3 adapted, the routers trained
// (peft.train_router), the rest frozen; the loss falls, the experts stay
// the base's bit for bit while the routers move, and the base with the
// saved adapter (PEFT's names, the routers as modules_to_save) answers as
// the run's model does, before and after merging.
TEST_F(Finetune, MoeLoraLowersTheLossAndReloads) {
  const std::string base = moe_base(d_), out = d_ / "moe_lora";
  std::string args = lora_args(base, out) +
                     " peft.target_modules=q_proj,v_proj,w1,w2,w3 peft.train_router=true "
                     "train.steps=30 train.lr=1e-2 peft.lora_rank=8 peft.lora_alpha=16";
  auto r = test::run_nekton(args);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "peft: LoRA r=8 alpha=16 on 28 modules")) << r.out;
  const std::vector<double> losses = test::logged_losses(out + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 30u);
  double first = 0, last = 0;
  for (size_t i = 0; i < 5; ++i) {
    first += losses[i] / 5;
    last += losses[losses.size() - 1 - i] / 5;
  }
  std::cout << "[ moe lora ] mean loss of the first 5 steps " << first << ", of the last 5 " << last
            << "\n";
  EXPECT_LT(last, first * 0.8) << r.out;
  const SafetensorsFile tuned = SafetensorsFile::open(out + "/model/model.safetensors"),
                        orig = SafetensorsFile::open(base + "/model.safetensors");
  for (const SafetensorsEntry& e : orig.entries()) {
    Tensor a = tuned.get(e.name), b = orig.get(e.name);
    const bool same = std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
    EXPECT_EQ(same, !e.name.ends_with(".moe.router.weight")) << e.name;
  }
  const SafetensorsFile adapter = SafetensorsFile::open(out + "/adapter/adapter_model.safetensors");
  EXPECT_TRUE(
      adapter.has("base_model.model.model.layers.1.block_sparse_moe.experts.3.w2.lora_A.weight"));
  EXPECT_TRUE(adapter.has("base_model.model.model.layers.0.block_sparse_moe.gate.weight"));
  const json cfg = json::parse(test::read_file(out + "/adapter/adapter_config.json"));
  EXPECT_EQ(cfg["modules_to_save"], json::array({"block_sparse_moe.gate"})) << cfg.dump();

  const int right = correct_answers(out + "/model");
  const std::string answers = last_answers_;
  EXPECT_EQ(correct_answers(base, "generate.adapter=" + out + "/adapter"), right);
  EXPECT_EQ(last_answers_, answers);
  // f32: Mixtral's default export dtype is bf16, whose rounding may flip an answer.
  r = test::run_nekton("export hf " + out + "/model " + std::string(d_ / "moe_hf") +
                       " --merge-lora --dtype f32");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_nekton("import hf " + std::string(d_ / "moe_hf") + " " +
                       std::string(d_ / "moe_merged"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(correct_answers(d_ / "moe_merged", "generate.tokenizer=bytes"), right);
  EXPECT_EQ(last_answers_, answers);

  // What stays refused names its key.
  expect_failure(lora_args(base, d_ / "moe_ia3") + " peft.method=ia3 peft.target_modules=k_proj",
                 "IA3 adapters on a Mixture-of-Experts model", d_ / "moe_ia3");
  expect_failure(lora_args(base, d_ / "moe_gate") + " peft.target_modules=gate",
                 "peft.target_modules: 'gate' names a Mixture-of-Experts router", d_ / "moe_gate");
  expect_failure(lora_args(base_, d_ / "gpt2_router") + " peft.train_router=true",
                 "peft.train_router: the model has no Mixture-of-Experts router",
                 d_ / "gpt2_router");
}

// MoE LoRA over a bf16-only base with the routers trained and adapter
// dropout, stopped after step 3 and rerun: the same adapter (routers
// included) and model bytes as 6 steps in one go.
TEST_F(Finetune, MoeLoraResumesExactly) {
  const std::string base = moe_base(d_), a = d_ / "ma", b = d_ / "mb";
  const std::string args =
      " train.dtype=bf16 train.steps=6 peft.lora_dropout=0.1 peft.train_router=true "
      "peft.target_modules=q_proj,w1,w2,w3";
  ASSERT_NO_FATAL_FAILURE(run_and_resume(base, a, b, args));
  for (const char* f : {"/model/model.safetensors", "/adapter/adapter_model.safetensors"})
    EXPECT_EQ(test::read_file(a + f), test::read_file(b + f)) << f;
}

// QLoRA on the MoE base (each expert in NF4 on its own, the routers trained
// whole), stopped after step 3 and rerun: the resumed run quantises
// train.init_from again and ends with the same adapter (routers included)
// as 6 steps in one go; the result is the adapter alone.
TEST_F(Finetune, MoeQloraResumesExactly) {
  const std::string base = moe_base(d_), a = d_ / "mqa", b = d_ / "mqb";
  const std::string args =
      " train.dtype=bf16 train.steps=6 peft.method=qlora peft.lora_dropout=0.1 "
      "peft.train_router=true peft.target_modules=q_proj,w1,w2,w3";
  std::string log;
  ASSERT_NO_FATAL_FAILURE(run_and_resume(base, a, b, args, &log));
  EXPECT_TRUE(contains(log, "frozen base held as NF4 (QLoRA)")) << log;
  EXPECT_FALSE(fs::exists(a + "/model"));
  EXPECT_EQ(test::read_file(a + "/adapter/adapter_model.safetensors"),
            test::read_file(b + "/adapter/adapter_model.safetensors"));
}

// With adapter dropout, stopped after step 3 and rerun: the same weights as
// 6 steps in one go (the masks are drawn from the seed and step).
TEST_F(Finetune, LoraResumesExactly) {
  const std::string base = copying_base(), a = d_ / "la", b = d_ / "lb";
  const std::string args = " train.steps=6 peft.lora_dropout=0.1";
  ASSERT_NO_FATAL_FAILURE(run_and_resume(base, a, b, args));
  for (const char* f : {"/model/model.safetensors", "/adapter/adapter_model.safetensors"})
    EXPECT_EQ(test::read_file(a + f), test::read_file(b + f)) << f;
}

// QLoRA: LoRA over the copying base held in NF4 (its table, tied head and
// every linear layer) learns as LoRA does; the result is the adapter alone
// (no model/: the base is train.init_from's), which serves over the original
// base (not the NF4 one it trained over, so answers may differ a little).
TEST_F(Finetune, QloraLearnsToReverseWords) {
  const std::string base = copying_base(), out = d_ / "qlora";
  auto r = test::run_nekton(lora_args(base, out) + " peft.method=qlora train.steps=300");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "frozen base held as NF4 (QLoRA)")) << r.out;
  EXPECT_FALSE(fs::exists(out + "/model"));
  const int after = correct_answers(base, "generate.adapter=" + out + "/adapter");
  EXPECT_GE(after, 30) << "of " << words_.size() << ":\n" << last_answers_ << "\n" << r.out;
}

// Adapters over a base held without f32 masters (bf16 alone, or NF4): a
// checkpoint holds the adapters, a resumed run reads train.init_from again,
// and ends with the same adapter as an unbroken run.
TEST_F(Finetune, AdaptersOverALeanBaseResumeExactly) {
  const std::string base = copying_base();
  for (const char* method : {"lora", "qlora"}) {
    const std::string a = d_ / (std::string(method) + "_a"), b = d_ / (std::string(method) + "_b");
    const std::string args = std::string(
                                 " train.steps=6 train.dtype=bf16 peft.lora_dropout=0.1 "
                                 "peft.method=") +
                             method;
    auto r = test::run_nekton(lora_args(base, a) + args);
    ASSERT_EQ(r.code, 0) << r.out;
    r = test::run_nekton(lora_args(base, b) + args + " train.exit_at_step=3");
    ASSERT_EQ(r.code, 0) << r.out;
    // The checkpoint holds the adapters alone.
    const SafetensorsFile saved =
        SafetensorsFile::open(b + "/checkpoints/step_00000003/model.safetensors");
    EXPECT_EQ(saved.entries().size(), 16u) << method;  // A and B of 8 modules
    for (const SafetensorsEntry& e : saved.entries())
      EXPECT_TRUE(contains(e.name, ".lora_")) << method << ": " << e.name;
    r = test::run_nekton(lora_args(base, b) + args);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "resuming from checkpoint")) << r.out;
    EXPECT_EQ(test::read_file(a + "/adapter/adapter_model.safetensors"),
              test::read_file(b + "/adapter/adapter_model.safetensors"))
        << method;
  }
}

// A Hugging Face folder as train.init_from is imported into OUT_DIR/base on
// the fly: the same losses and adapter as from the Nekton folder it was
// exported from (f32: an f32 base; bf16: the base held in bf16 either way).
TEST_F(Finetune, StartsFromAHuggingFaceFolder) {
  const std::string base = copying_base(), hf = d_ / "copying_hf";
  auto r = test::run_nekton("export hf " + base + " " + hf);
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* dtype : {"f32", "bf16"}) {
    const std::string a = d_ / (std::string("from_nekton_") + dtype),
                      b = d_ / (std::string("from_hf_") + dtype);
    const std::string args = std::string(" train.steps=3 train.dtype=") + dtype;
    r = test::run_nekton(lora_args(base, a) + args);
    ASSERT_EQ(r.code, 0) << r.out;
    r = test::run_nekton(lora_args(hf, b) + args + " data.tokenizer=bytes");
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(contains(r.out, "imported the Hugging Face model " + hf)) << r.out;
    EXPECT_TRUE(fs::exists(b + "/base/model.safetensors")) << dtype;
    EXPECT_EQ(test::logged_losses(a + "/metrics.jsonl"), test::logged_losses(b + "/metrics.jsonl"))
        << dtype;
    EXPECT_EQ(test::read_file(a + "/adapter/adapter_model.safetensors"),
              test::read_file(b + "/adapter/adapter_model.safetensors"))
        << dtype;
  }
}

// A template named by data.chat_template is kept with the tuned model, so that
// generate and serve, whose template is auto, format chats as it was trained
// (the base has no template of its own here: serve would answer 400).
TEST_F(Finetune, KeepsTheChatTemplateItTrainedWith) {
  const std::string out = d_ / "keeps_template";
  auto r = test::run_nekton(finetune_args(out) + " train.steps=1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(test::read_file(out + "/model/chat_template.jinja"),
            find_chat_template("plain").jinja());
  EXPECT_EQ(chat_template_for("auto", out + "/model").get(), &find_chat_template("plain"));
  // Tuning it again needs no template named.
  r = test::run_nekton("finetune train.init_from=" + out + "/model data.sft_path=" + data_ +
                       " train.seq_len=64 train.steps=1 train.val_every=0 train.out_dir=" +
                       std::string(d_ / "keeps_template_2"));
  EXPECT_EQ(r.code, 0) << r.out;
}

// IA3 (PEFT's GPT-2 defaults: c_attn's output, mlp.c_proj's input): only the
// scales train, the loss falls, and the model, the base with the adapter and
// the merged export answer alike.
TEST_F(Finetune, Ia3TrainsOnlyItsScales) {
  const std::string base = copying_base(), out = d_ / "ia3";
  auto r = test::run_nekton(lora_args(base, out) +
                            " peft.method=ia3 peft.target_modules= train.steps=40 train.lr=2e-2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "peft: IA3 on 4 modules (c_attn,mlp.c_proj; feedforward: "
                       "mlp.c_proj); base frozen"))
      << r.out;
  const std::vector<double> losses = test::logged_losses(out + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 40u);
  EXPECT_LT(losses.back(), losses.front() * 0.9) << r.out;
  expect_base_untouched(out, base);
  const int right = correct_answers(out + "/model");
  const std::string answers = last_answers_;
  EXPECT_EQ(correct_answers(base, "generate.adapter=" + out + "/adapter"), right);
  EXPECT_EQ(last_answers_, answers);
  // Training on from the run's model without peft would train the base under the scales.
  std::string more = finetune_args(d_ / "ia3_more");
  more.replace(more.find(base_), base_.size(), out + "/model");
  expect_failure(more,
                 "train.init_from: the model has IA3 adapters, which train only over a frozen "
                 "base",
                 d_ / "ia3_more");
  r = test::run_nekton("export hf " + out + "/model " + std::string(d_ / "ia3_hf") +
                       " --merge-lora");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_nekton("import hf " + std::string(d_ / "ia3_hf") + " " +
                       std::string(d_ / "ia3_merged"));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(correct_answers(d_ / "ia3_merged", "generate.tokenizer=bytes"), right);
  EXPECT_EQ(last_answers_, answers);
}

// Bottleneck adapters (NeMo's canonical, after every linear layer here) on
// the copying base: from none right to most right, the base untouched; the
// run's model and the base with the adapter answer alike; they do not merge.
TEST_F(Finetune, BottleneckAdaptersLearnToReverseWords) {
  const std::string base = copying_base(), out = d_ / "adapter";
  auto r = test::run_nekton(lora_args(base, out) +
                            " peft.method=adapter train.steps=300 peft.target_modules=linear_qkv,"
                            "linear_proj,linear_fc1,linear_fc2");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "peft: bottleneck adapters of width 32 after 8 layers")) << r.out;
  EXPECT_TRUE(contains(r.out, "saved the bottleneck adapters in Nekton's format")) << r.out;
  const int after = correct_answers(out + "/model");
  const std::string answers = last_answers_;
  EXPECT_GE(after, 30) << "of " << words_.size() << ":\n" << answers << "\n" << r.out;
  expect_base_untouched(out, base);
  EXPECT_EQ(correct_answers(base, "generate.adapter=" + out + "/adapter"), after);
  EXPECT_EQ(last_answers_, answers);
  r = test::run_nekton("export hf " + out + "/model " + std::string(d_ / "adapter_hf") +
                       " --merge-lora");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "bottleneck adapters (a nonlinear branch) do not fold into the base"))
      << r.out;
}

// P-tuning: 8 virtual tokens from the prompt encoder, each sample after
// them. A frozen 2-layer model cannot learn to reverse words from a prompt,
// but the loss falls well below the start (the base alone is far worse);
// only the encoder trains; PEFT's file holds its output, with which the base
// answers as the run's model does; a stopped run resumes to the same prompt.
TEST_F(Finetune, PTuningTrainsItsPrompt) {
  const std::string base = copying_base(), out = d_ / "ptuning";
  const std::string args = lora_args(base, out) +
                           " peft.method=p_tuning peft.num_virtual_tokens=8 train.lr=1e-2 "
                           "data.pack=false peft.target_modules=";
  auto r = test::run_nekton(args + " train.steps=100");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "peft: p-tuning, 8 virtual tokens from an MLP prompt encoder of "
                       "width 128; base frozen"))
      << r.out;
  const std::vector<double> losses = test::logged_losses(out + "/metrics.jsonl");
  ASSERT_EQ(losses.size(), 100u);
  // The mean of the last ten steps: at lr 1e-2 single steps swing by ~0.1
  // with the hardware's rounding (AVX2 and AVX-512 kernels differ).
  double tail = 0;
  for (size_t i = 90; i < 100; ++i) tail += losses[i] / 10;
  EXPECT_LT(tail, 0.6 * losses.front()) << r.out;
  nlohmann::json cfg = json::parse(test::read_file(out + "/adapter/adapter_config.json"));
  EXPECT_EQ(cfg["peft_type"], "P_TUNING");
  EXPECT_EQ(cfg["num_virtual_tokens"], 8);
  EXPECT_EQ(cfg["token_dim"], 128);
  EXPECT_EQ(cfg["encoder_hidden_size"], 128);
  const SafetensorsFile adapter = SafetensorsFile::open(out + "/adapter/adapter_model.safetensors");
  ASSERT_EQ(adapter.entries().size(), 1u);
  EXPECT_EQ(adapter.entries()[0].name, "prompt_embeddings");
  EXPECT_EQ(adapter.entries()[0].shape, (Shape{8, 128}));
  expect_base_untouched(out, base);
  correct_answers(out + "/model");
  const std::string answers = last_answers_;
  correct_answers(base, "generate.adapter=" + out + "/adapter");
  EXPECT_EQ(last_answers_, answers);

  const std::string b = d_ / "ptuning_b";
  std::string again = args;
  again.replace(again.find(out), out.size(), b);
  r = test::run_nekton(again + " train.steps=6 train.exit_at_step=3");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_nekton(again + " train.steps=6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "resuming from checkpoint")) << r.out;
  const std::string c = d_ / "ptuning_c";
  std::string whole = args;
  whole.replace(whole.find(out), out.size(), c);
  r = test::run_nekton(whole + " train.steps=6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(test::read_file(b + "/adapter/adapter_model.safetensors"),
            test::read_file(c + "/adapter/adapter_model.safetensors"));
}

// Every recipe in configs/sft_*.yaml runs as written, shrunk to the test's
// model and a few steps, and leaves what its method writes.
TEST_F(Finetune, RecipesRun) {
  int recipes = 0;
  for (const auto& e : fs::directory_iterator(fs::path(NK_SOURCE_DIR) / "configs")) {
    const std::string name = e.path().filename().string();
    if (!name.starts_with("sft_")) continue;
    ++recipes;
    const std::string out = d_ / ("recipe_" + name);
    auto r = test::run_nekton("finetune --config " + e.path().string() +
                              " train.init_from=" + base_ + " data.sft_path=" + data_ +
                              " data.chat_template=plain train.seq_len=64 train.micro_batch=2 "
                              "train.global_batch=4 train.steps=2 train.peak_tflops=1 "
                              "train.out_dir=" +
                              out);
    ASSERT_EQ(r.code, 0) << name << "\n" << r.out;
    EXPECT_EQ(test::logged_losses(out + "/metrics.jsonl").size(), 2u) << name;
    EXPECT_EQ(fs::exists(out + "/adapter/adapter_config.json"), name != "sft_full.yaml") << name;
    EXPECT_EQ(fs::exists(out + "/model/model.safetensors"), name != "sft_qlora.yaml") << name;
  }
  EXPECT_EQ(recipes, 6);
}

TEST_F(Finetune, LoraBadSettingsAreClearErrors) {
  const std::string out = d_ / "bad";
  auto expect_error = [&](const std::string& args, const std::string& message) {
    expect_failure(args, message, out);
  };
  expect_error(lora_args(base_, out) + " peft.method=dora",
               "peft.method: expected none, lora, qlora, ia3, adapter or p_tuning, got 'dora'");
  expect_error(lora_args(base_, out) + " peft.method=p_tuning peft.target_modules=",
               "data.pack: p-tuning puts its virtual tokens before each sample");
  expect_error(lora_args(base_, out) +
                   " peft.method=p_tuning data.pack=false peft.target_modules= "
                   "peft.num_virtual_tokens=64",
               "peft.num_virtual_tokens: 64 leaves no room for text in train.seq_len = 64");
  expect_error(lora_args(base_, out) + " peft.method=p_tuning data.pack=false",
               "peft.target_modules: p-tuning adapts no module");
  expect_error(lora_args(base_, out) + " peft.method=adapter peft.adapter_dim=0",
               "peft.adapter_dim: must be positive, got 0");
  expect_error(lora_args(base_, out) +
                   " peft.method=ia3 peft.target_modules=c_attn "
                   "peft.feedforward_modules=c_fc",
               "peft.feedforward_modules: 'transformer.h.0.mlp.c_fc' is not among "
               "peft.target_modules");
  expect_error(lora_args(base_, out) + " peft.target_modules=q_proj",
               "peft.target_modules: 'q_proj' matches no linear layer of this GPT-2 model (its "
               "modules: c_attn, c_proj, c_fc, c_proj");
  expect_error(lora_args(base_, out) + " peft.lora_rank=0", "peft.lora_rank: must be positive");
  expect_error(lora_args(base_, out) + " peft.lora_dropout=1",
               "peft.lora_dropout: must be in [0, 1)");
  expect_error(lora_args(base_, out) + " train.freeze=wte",
               "train.freeze: not used with peft.method=lora");
  // An adapter for another base: the Llama-shaped tensors of a GPT-2 run do not fit.
  const std::string tiny_run = d_ / "tiny";
  auto r = test::run_nekton(lora_args(base_, tiny_run) + " train.steps=1 peft.lora_rank=2");
  ASSERT_EQ(r.code, 0) << r.out;
  save_random_model(d_ / "narrow", 64);
  r = test::run_nekton("generate generate.model=" + std::string(d_ / "narrow") +
                       " generate.tokenizer=bytes generate.prompt=x generate.adapter=" + tiny_run +
                       "/adapter");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "generate.adapter: ")) << r.out;
  EXPECT_TRUE(contains(r.out,
                       "c_attn.lora_A.weight' has shape [2, 128], this GPT-2 base model "
                       "needs [2, 64] (an adapter for another base shape?)"))
      << r.out;
}

TEST_F(Finetune, ShowSampleMarksTheTrainedTokens) {
  auto r = test::run_nekton(finetune_args(d_ / "x") + " --show-sample 2");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string& w = words_[2];
  EXPECT_TRUE(contains(r.out, "chat template plain")) << r.out;
  EXPECT_TRUE(contains(r.out, "reverse " + w + ":[[ " + reversed(w))) << r.out;
  EXPECT_FALSE(fs::exists(d_ / "x")) << "--show-sample writes nothing";
  r = test::run_nekton(finetune_args(d_ / "x") + " --show-sample 400");
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "holds 400 samples")) << r.out;
}

// Stopped after step 3 and rerun: the same weights as 6 steps in one go.
TEST_F(Finetune, ResumesExactly) {
  const std::string a = d_ / "a", b = d_ / "b";
  auto r = test::run_nekton(finetune_args(a) + " train.steps=6");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_nekton(finetune_args(b) + " train.steps=6 train.exit_at_step=3");
  ASSERT_EQ(r.code, 0) << r.out;
  r = test::run_nekton(finetune_args(b) + " train.steps=6");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "resuming from checkpoint")) << r.out;
  EXPECT_EQ(test::read_file(a + "/model/model.safetensors"),
            test::read_file(b + "/model/model.safetensors"));
}

TEST_F(Finetune, BadSettingsAndRecordsAreClearErrors) {
  const std::string out = d_ / "bad";
  auto expect_error = [&](const std::string& args, const std::string& message) {
    expect_failure(args, message, out);
  };
  expect_error("finetune train.init_from=" + base_ + " train.out_dir=" + out,
               "data.path: no training data given");
  expect_error(finetune_args(out) + " data.chat_template=vicuna",
               "unknown chat template 'vicuna' (known: chatml, llama3");
  expect_error(finetune_args(out) + " data.chat_template=auto",
               "/tokenizer/tokenizer_config.json exists, nor a chat_template.jinja");
  expect_error(finetune_args(out) + " data.loss_on=prompt",
               "data.loss_on: expected assistant or all, got 'prompt'");
  expect_error(finetune_args(out) + " data.path=" + data_,
               "give only one of data.path, data.prefix, data.blend and data.sft_path");
  expect_error("train --show-sample 1 data.path=" + data_,
               "--show-sample is an option of nekton finetune only");
  const std::string no_answer = d_ / "no_answer.jsonl";
  test::write_file(no_answer, R"({"input": "q", "output": "a"})"
                              "\n"
                              R"({"messages": [{"role": "user", "content": "only a question"}]})"
                              "\n");
  expect_error(finetune_args(out) + " data.sft_path=" + no_answer,
               no_answer + ":2: the conversation has no assistant message");
  // Gemma's template has no system role: refused with the record's line.
  const std::string with_system = d_ / "system.jsonl";
  test::write_file(with_system, R"({"system": "s", "input": "q", "output": "a"})"
                                "\n");
  expect_error(finetune_args(out) + " data.chat_template=gemma data.sft_path=" + with_system,
               with_system + ":1: chat template gemma: the system role is not supported");
}

}  // namespace
}  // namespace nk
