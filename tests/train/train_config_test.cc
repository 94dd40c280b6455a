// The training recipe's keys: bound once (TrainConfig::bind), saved in every
// checkpoint as config.yaml, so their names, order and rendering must not
// change (new keys may be added; they read back at their defaults).
#include "train/train_config.h"

#include <gtest/gtest.h>

#include <set>
#include <sstream>
#include <string>

#include "test_util.h"

namespace nk {
namespace {

// config.yaml as a checkpoint written before the keys were bound saved it.
const char* kSavedBefore =
    "model:\n"
    "  preset: \"llama-tiny\"\n"
    "  arch: \"\"\n"
    "  vocab_size: 0\n"
    "  max_seq_len: 0\n"
    "  n_layer: 4\n"
    "  n_head: 8\n"
    "  n_kv_head: 2\n"
    "  d_model: 256\n"
    "  d_ff: 704\n"
    "  norm_eps: 0.0\n"
    "  rope_theta: 0.0\n"
    "  sliding_window: -1\n"
    "  tied_embeddings: \"\"\n"
    "  rope_scaling:\n"
    "    type: \"\"\n"
    "    factor: 0.0\n"
    "    low_freq_factor: 0.0\n"
    "    high_freq_factor: 0.0\n"
    "    original_max_seq_len: 0\n"
    "    beta_fast: 0.0\n"
    "    beta_slow: 0.0\n"
    "    attention_factor: 0.0\n"
    "    mscale: 0.0\n"
    "    mscale_all_dim: 0.0\n"
    "data:\n"
    "  path: \"corpus.txt\"\n"
    "  prefix: \"\"\n"
    "  blend: \"\"\n"
    "  split: \"969,30,1\"\n"
    "  tokenizer: \"\"\n"
    "  cache_dir: \"\"\n"
    "  val_fraction: 0.05\n"
    "  max_bytes: 200000\n"
    "  invalid_utf8: \"replace\"\n"
    "train:\n"
    "  dtype: \"f32\"\n"
    "  micro_batch: 2\n"
    "  seq_len: 32\n"
    "  global_batch: 2\n"
    "  steps: 1\n"
    "  lr: 0.002\n"
    "  min_lr: 0.0002\n"
    "  warmup_steps: 20\n"
    "  decay_steps: 0\n"
    "  weight_decay: 0.1\n"
    "  beta1: 0.9\n"
    "  beta2: 0.95\n"
    "  eps: 1e-08\n"
    "  grad_clip: 1.0\n"
    "  freeze: \"\"\n"
    "  seed: 1234\n"
    "  threads: 2\n"
    "  val_every: 0\n"
    "  val_batches: 4\n"
    "  log_every: 10\n"
    "  out_dir: \"runs/old\"\n"
    "  resume_from: \"\"\n"
    "  resume: \"auto\"\n"
    "  save_every: 0\n"
    "  keep_checkpoints: 3\n"
    "  exit_at_step: 0\n"
    "  metrics_file: \"\"\n"
    "  peak_tflops: 1.0\n";

// The resolved config without the keys added after kSavedBefore was written
// (train.device; the parallel.* section of data-parallel training; fine-tuning's
// data.sft_* group and train.init_from; activation recompute's
// train.recompute*; model.make_vocab_size_divisible_by; model.head_dim;
// model.partial_rotary_factor and model.qk_norm;
// train.eval_*; train.tensorboard), which
// read back at their defaults: everything else must keep its text and order.
std::string without_newer_keys(const std::string& yaml) {
  std::string out, line, section;
  std::istringstream in(yaml);
  while (std::getline(in, line)) {
    if (!line.empty() && line[0] != ' ') section = line;
    static const std::set<std::string> fine_tuning = {
        "sft_path", "sft_valid_path", "chat_template", "loss_on",    "pack",      "overlong",
        "shuffle",  "messages_key",   "input_key",     "output_key", "system_key"};
    const std::string key = line.substr(2, line.find(':') - 2);
    if (section == "parallel:" || section == "peft:" || section == "optim:" ||
        (section == "train:" && line == "  device: \"cpu\"") ||
        (section == "model:" && key == "make_vocab_size_divisible_by") ||
        (section == "model:" &&
         (key.starts_with("moe_") || key == "num_experts" || key == "num_experts_per_tok" ||
          key == "norm_topk_prob" || key == "num_labels" || key == "labels" || key == "head_dim" ||
          key == "sliding_window_pattern" || key == "rope_local_theta" ||
          key == "query_pre_attn_scalar" || key.ends_with("_softcap") || key == "q_lora_rank" ||
          key == "kv_lora_rank" || key == "qk_rope_head_dim" || key == "v_head_dim" ||
          key == "partial_rotary_factor" || key == "qk_norm")) ||
        (section == "train:" &&
         (key == "init_from" || key == "recompute" || key == "recompute_layers" ||
          key.starts_with("eval_") || key == "tensorboard" || key == "profile" ||
          key == "save_final")) ||
        (section == "data:" && fine_tuning.count(key)))
      continue;
    out += line + "\n";
  }
  return out;
}

TEST(TrainConfig, AConfigSavedBeforeReadsBackToTheSameText) {
  test::TempDir dir("nk_train_config");
  test::write_file(dir / "config.yaml", kSavedBefore);
  Config c = Config::load(train_schema(), dir / "config.yaml", {});
  EXPECT_EQ(without_newer_keys(c.to_yaml()), kSavedBefore);
  TrainConfig t = train_config_from(c);
  EXPECT_EQ(t.config_yaml, c.to_yaml());
  EXPECT_EQ(t.device, parse_device("cpu", "train.device"));
  EXPECT_EQ(t.parallel.mesh.tp, 1);
  EXPECT_EQ(t.data.path, "corpus.txt");
  EXPECT_TRUE(t.data.replace_invalid_utf8);
  EXPECT_EQ(t.data.max_bytes, 200000);
  EXPECT_EQ(t.data.tokenizer, "bytes");  // data.path's default
  EXPECT_EQ(t.dtype, DType::F32);
  EXPECT_EQ(t.lr.decay_steps, 1);  // 0 = train.steps
  EXPECT_EQ(t.model.n_kv_head, 2);
  EXPECT_EQ(t.metrics_file, "runs/old/metrics.jsonl");
  EXPECT_TRUE(t.save_final);  // a config from before the key still saves at the end
}

TEST(TrainConfig, TheSchemaDefaultsAreTheStructsDefaults) {
  TrainConfig t = train_config_from(Config::load(train_schema(), "", {"data.path=x.txt"}));
  TrainConfig d;
  EXPECT_EQ(t.lr.lr, d.lr.lr);
  EXPECT_EQ(t.lr.lr, 6e-4);
  EXPECT_EQ(t.lr.min_lr, 6e-5);
  EXPECT_EQ(t.lr.warmup_steps, 10);
  EXPECT_EQ(t.adamw.beta2, 0.95);
  EXPECT_EQ(t.data.split, "969,30,1");
  EXPECT_EQ(t.data.val_fraction, 0.05);
  EXPECT_EQ(t.seed, 1234u);
  EXPECT_EQ(t.dtype, DType::BF16);
  EXPECT_EQ(t.out_dir, "runs/train");
  EXPECT_FALSE(t.data.replace_invalid_utf8);
}

}  // namespace
}  // namespace nk
