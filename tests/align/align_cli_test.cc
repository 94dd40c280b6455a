// `nekton align` end to end: DPO on a synthetic preference set made here
// (chosen completions are a fixed marker, rejected ones random letters)
// raises held-out reward accuracy above 0.9 and the exported model then
// generates the marker; a run stopped by SIGTERM and rerun ends with the same
// weights bit for bit as an uninterrupted one, reading its precomputed
// reference log-probabilities back instead of computing them again; bad data
// stops before anything is written; --help lists the align.* keys.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "align/marker_pairs.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

std::string align_args(const TempDir& dir, const std::string& out, int steps) {
  return fmt::format(
      "align model.preset=llama-tiny train.dtype=f32 train.seq_len=16 train.micro_batch=16 "
      "train.global_batch=16 train.steps={} train.lr=3e-3 train.min_lr=3e-4 "
      "train.warmup_steps=0 train.peak_tflops=1 train.threads=2 train.val_every={} "
      "train.val_batches=2 align.method=dpo align.beta=0.1 align.data_path={} "
      "align.valid_path={} train.out_dir={}",
      steps, steps, dir / "train.jsonl", dir / "valid.jsonl", out);
}

double last_value(const std::string& metrics, const std::string& key) {
  const std::string text = test::read_file(metrics);
  const size_t at = text.rfind("\"" + key + "\": ");
  if (at == std::string::npos) return NAN;
  return std::stod(text.substr(at + key.size() + 4));
}

TEST(AlignCli, DpoLearnsThePreferenceAndGeneratesTheMarker) {
  TempDir dir("nk_align");
  test::write_marker_pairs(dir / "train.jsonl", 256, 1);
  test::write_marker_pairs(dir / "valid.jsonl", 32, 2);
  const std::string out = dir / "run";
  const test::RunResult r = test::run_nekton(align_args(dir, out, 60));
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "rewards/accuracies")) << r.out;
  EXPECT_TRUE(contains(r.out, "precomputing the reference log-probabilities of 576 sequences"))
      << r.out;
  const double acc = last_value(out + "/metrics.jsonl", "val_rewards/accuracies");
  EXPECT_GT(acc, 0.9) << r.out;
  EXPECT_GT(last_value(out + "/metrics.jsonl", "val_rewards/margins"), 0) << r.out;
  const test::RunResult g = test::run_nekton(
      "generate generate.model=" + out +
          "/model \"generate.prompt=say qrs:\" generate.max_tokens=6 generate.temperature=0",
      false);
  ASSERT_EQ(g.code, 0) << g.out;
  EXPECT_TRUE(contains(g.out, "say qrs: END")) << g.out;
}

TEST(AlignCli, SigtermAndRerunMatchAnUninterruptedRunBitForBit) {
  TempDir dir("nk_align_resume");
  test::write_marker_pairs(dir / "train.jsonl", 64, 3);
  test::write_marker_pairs(dir / "valid.jsonl", 8, 4);
  const int steps = 40;
  const std::string whole = dir / "whole", cut = dir / "cut";
  const test::RunResult w = test::run_nekton(align_args(dir, whole, steps));
  ASSERT_EQ(w.code, 0) << w.out;

  std::vector<std::string> args;
  {
    std::istringstream in(align_args(dir, cut, steps) + " train.save_every=1");
    for (std::string s; in >> s;) args.push_back(s);
  }
  const pid_t pid = test::spawn_nekton(args, dir / "cut.log");
  ASSERT_GT(pid, 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (test::logged_losses(cut + "/metrics.jsonl").size() < 5 &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  ::kill(pid, SIGTERM);
  int st = 0;
  ::waitpid(pid, &st, 0);
  const std::string log = test::read_file(dir / "cut.log");
  ASSERT_TRUE(WIFEXITED(st) && WEXITSTATUS(st) == 0) << log;
  ASSERT_TRUE(contains(log, "SIGTERM received")) << log;
  ASSERT_LT(test::logged_losses(cut + "/metrics.jsonl").size(), size_t(steps));
  const std::string ref = cut + "/reference_logps.json";
  const auto written = fs::last_write_time(ref);
  const std::string ref_bytes = test::read_file(ref);

  const test::RunResult again =
      test::run_nekton(align_args(dir, cut, steps) + " train.save_every=1");
  ASSERT_EQ(again.code, 0) << again.out;
  EXPECT_TRUE(contains(again.out, "resuming from checkpoint")) << again.out;
  EXPECT_TRUE(contains(again.out, "reusing the reference log-probabilities")) << again.out;
  EXPECT_FALSE(contains(again.out, "precomputing")) << again.out;
  EXPECT_EQ(fs::last_write_time(ref), written);
  EXPECT_EQ(test::read_file(ref), ref_bytes);
  EXPECT_EQ(test::read_file(cut + "/model/model.safetensors"),
            test::read_file(whole + "/model/model.safetensors"))
      << "final weights differ";
  EXPECT_EQ(test::logged_losses(cut + "/metrics.jsonl"),
            test::logged_losses(whole + "/metrics.jsonl"));
}

TEST(AlignCli, BadDataStopsBeforeWritingAnything) {
  TempDir dir("nk_align_bad");
  test::write_file(dir / "bad.jsonl", R"({"prompt": "a", "chosen": " x", "rejected": "y"})"
                                      "\n\n"
                                      R"({"prompt": "b", "rejected": "y"})"
                                      "\n");
  test::write_file(dir / "valid.jsonl", R"({"prompt": "a", "chosen": " x", "rejected": "y"})"
                                        "\n");
  const std::string out = dir / "run";
  const test::RunResult r = test::run_nekton(
      "align model.preset=llama-tiny train.seq_len=16 train.micro_batch=2 train.global_batch=2 "
      "align.data_path=" +
      (dir / "bad.jsonl") + " train.out_dir=" + out);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "bad.jsonl:3")) << r.out;
  EXPECT_TRUE(contains(r.out, "no \"chosen\"")) << r.out;
  EXPECT_FALSE(fs::exists(out));
  // An odd micro-batch cannot hold pairs.
  const test::RunResult odd = test::run_nekton(
      "align model.preset=llama-tiny train.seq_len=16 train.micro_batch=3 train.global_batch=3 "
      "align.data_path=" +
      (dir / "valid.jsonl") + " train.out_dir=" + out);
  EXPECT_NE(odd.code, 0);
  EXPECT_TRUE(contains(odd.out, "must be even")) << odd.out;
  EXPECT_FALSE(fs::exists(out));
}

// The record of `step` in a metrics.jsonl (null if none).
nlohmann::json metrics_at(const std::string& path, int step) {
  std::istringstream in(test::read_file(path));
  for (std::string line; std::getline(in, line);) {
    nlohmann::json j = nlohmann::json::parse(line);
    if (j.value("step", -1.0) == step) return j;
  }
  return nullptr;
}

// align.moe_losses on a Mixture of Experts model: the first step's loss is
// DPO's plus the balancing and z-losses with their coefficients (the
// logged moe_aux and moe_z of the same weights), and their gradient moved
// the routers: the second step's balancing loss differs from a run
// without's (the DPO loss alone moves them too, differently). On a dense
// model, or with rs (which fine-tunes: the losses are in already), refused
// naming the key, nothing written.
TEST(AlignCli, MoeLossesJoinTheObjectiveWhenAsked) {
  TempDir dir("nk_align_moe_losses");
  test::write_marker_pairs(dir / "train.jsonl", 16, 1);
  test::write_marker_pairs(dir / "valid.jsonl", 4, 2);
  auto args = [&](const std::string& out, const std::string& extra) {
    std::string a = align_args(dir, out, 2);
    const std::string dense = "model.preset=llama-tiny";
    return a.replace(
               a.find(dense), dense.size(),
               "model.preset=mixtral-tiny model.num_experts=4 model.moe_d_ff=32 "
               "model.moe_aux_loss_coeff=0.02 model.moe_z_loss_coeff=0.001 train.log_every=1") +
           " " + extra;
  };
  const std::string on = dir / "on", off = dir / "off";
  const test::RunResult a = test::run_nekton(args(on, "align.moe_losses=true"));
  ASSERT_EQ(a.code, 0) << a.out;
  const test::RunResult b = test::run_nekton(args(off, ""));
  ASSERT_EQ(b.code, 0) << b.out;
  const nlohmann::json m1 = metrics_at(on + "/metrics.jsonl", 1),
                       m0 = metrics_at(off + "/metrics.jsonl", 1);
  const double aux = m1.at("moe_aux").get<double>(), z = m1.at("moe_z").get<double>();
  EXPECT_GT(aux, 0.5);  // E sum_e f_e P_e: 1 when even
  EXPECT_GT(z, 0.0);
  EXPECT_DOUBLE_EQ(aux, m0.at("moe_aux").get<double>());
  EXPECT_NEAR(m1.at("loss").get<double>(), m0.at("loss").get<double>() + 0.02 * aux + 0.001 * z,
              1e-6);
  const nlohmann::json s1 = metrics_at(on + "/metrics.jsonl", 2),
                       s0 = metrics_at(off + "/metrics.jsonl", 2);
  ASSERT_FALSE(s1.is_null() || s0.is_null());
  EXPECT_GT(std::abs(s1.at("moe_aux").get<double>() - s0.at("moe_aux").get<double>()), 1e-6)
      << "the MoE losses' gradient moved no router";

  const std::string refused = dir / "refused";
  std::string dense = align_args(dir, refused, 1) + " align.moe_losses=true";
  const test::RunResult d = test::run_nekton(dense);
  EXPECT_NE(d.code, 0);
  EXPECT_TRUE(contains(d.out, "align.moe_losses: the model (llama) has no experts")) << d.out;
  const test::RunResult rs =
      test::run_nekton(args(refused, "align.moe_losses=true align.method=rs"));
  EXPECT_NE(rs.code, 0);
  EXPECT_TRUE(contains(rs.out, "align.moe_losses: align.method=rs fine-tunes")) << rs.out;
  EXPECT_FALSE(fs::exists(refused));
}

TEST(AlignCli, HelpListsTheAlignKeys) {
  const test::RunResult r = test::run_nekton("align --help");
  ASSERT_EQ(r.code, 0) << r.out;
  for (const char* key :
       {"align.method", "align.loss_type", "align.beta", "align.label_smoothing", "align.rpo_alpha",
        "align.simpo_gamma", "align.reference", "align.max_prompt_length", "peft.method",
        "train.init_from", "align.reward_funcs", "align.reward_weights",
        "align.reward_accuracy.extract", "align.reward_format.pattern",
        "align.reward_length.cache_tokens", "align.reward_command", "align.reward_url",
        "align.reward_timeout_s", "align.moe_losses"})
    EXPECT_TRUE(contains(r.out, key)) << key;
}

}  // namespace
}  // namespace nk
