// Mixture-of-Experts training (mixtral-tiny): `nekton train` lowers the loss,
// resume is exact (losses, gradient norms and weights bit for bit, f32 and
// bf16), activation recompute changes nothing, and the layouts MoE cannot
// run yet are refused naming their key.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dist/mesh.h"
#include "model/arch.h"
#include "test_util.h"
#include "train/train_parallel.h"
#include "train/trainer.h"

namespace nk {
namespace {

using test::contains;
using test::error_of;
using test::TempDir;
namespace fs = std::filesystem;

std::string corpus(const TempDir& dir) {
  std::string text;
  for (int i = 0; i < 300; ++i) text += "Line " + std::to_string(i * 7919 % 1000) + " of text.\n";
  test::write_file(dir / "c.txt", text);
  return dir / "c.txt";
}

std::vector<std::string> keys(const TempDir& dir, std::vector<std::string> extra) {
  std::vector<std::string> ov = {"model.preset=mixtral-tiny",
                                 "model.moe_z_loss_coeff=0.001",
                                 "data.path=" + corpus(dir),
                                 "train.micro_batch=2",
                                 "train.seq_len=16",
                                 "train.global_batch=4",
                                 "train.steps=24",
                                 "train.lr=3e-3",
                                 "train.min_lr=3e-4",
                                 "train.warmup_steps=4",
                                 "train.val_every=12",
                                 "train.val_batches=1",
                                 "train.log_every=1000",
                                 "train.peak_tflops=1"};
  ov.insert(ov.end(), extra.begin(), extra.end());
  return ov;
}

struct TrainRun {
  std::vector<StepStats> history;
  std::vector<float> params;
};

// The last line of a metrics.jsonl.
nlohmann::json last_metrics(const std::string& path) {
  std::istringstream in(test::read_file(path));
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return nlohmann::json::parse(last);
}

TrainRun run(const std::vector<std::string>& ov) {
  Trainer t(train_config_from(Config::load(train_schema(), "", ov)));
  t.run({});
  TrainRun r{t.history(), std::vector<float>(size_t(t.model().params().numel()))};
  std::memcpy(r.params.data(), t.model().params().raw(), r.params.size() * sizeof(float));
  return r;
}

TEST(MoeTrain, NektonTrainLowersTheLoss) {
  TempDir dir("nk_moe_train");
  std::string args = "train";
  for (const std::string& k : keys(dir, {"train.out_dir=" + (dir / "out")})) args += " " + k;
  test::RunResult r = test::run_nekton(args);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::vector<double> losses = test::logged_losses(dir / "out/metrics.jsonl");
  ASSERT_EQ(losses.size(), 24u);
  double first = 0, last = 0;
  for (size_t i = 0; i < 4; ++i) {
    first += losses[i] / 4;
    last += losses[losses.size() - 1 - i] / 4;
  }
  std::cout << "[ mixtral-tiny ] mean loss of the first 4 steps " << first << ", of the last 4 "
            << last << "\n";
  EXPECT_LT(last, first - 1.0);
  // The MoE figures of each step: the balancing loss (k = 2 at even load),
  // the busiest expert's load over the mean, nothing dropped.
  const nlohmann::json m = last_metrics(dir / "out/metrics.jsonl");
  EXPECT_GT(m["moe_aux"].get<double>(), 1.5) << m.dump();
  EXPECT_GT(m["moe_z"].get<double>(), 0.0) << m.dump();
  EXPECT_GE(m["moe_load_max"].get<double>(), 1.0) << m.dump();
  EXPECT_EQ(m["moe_dropped"].get<double>(), 0.0) << m.dump();
  EXPECT_TRUE(contains(r.out, "| moe_aux ")) << r.out;
  // At log steps (the last one here), each layer's tokens per expert over
  // the step: 4 x 16 tokens x 2 experts each, whose busiest over the mean is
  // the layer's moe_load_max; not in the step log line, nor in the records
  // of other steps.
  for (int l = 0; l < 2; ++l) {
    const nlohmann::json& n = m[fmt::format("moe_tokens.l{}", l)];
    ASSERT_TRUE(n.is_array()) << m.dump();
    ASSERT_EQ(n.size(), 4u) << m.dump();  // mixtral-tiny: 4 experts
    double sum = 0, most = 0;
    for (const nlohmann::json& v : n) {
      sum += v.get<double>();
      most = std::max(most, v.get<double>());
    }
    EXPECT_EQ(sum, 4 * 16 * 2) << m.dump();
    EXPECT_NEAR(most / (sum / 4), m[fmt::format("moe_load_max.l{}", l)].get<double>(), 1e-9);
  }
  EXPECT_FALSE(contains(r.out, "moe_tokens")) << r.out;
  const std::string text = test::read_file(dir / "out/metrics.jsonl");
  EXPECT_FALSE(contains(text.substr(0, text.find('\n')), "moe_tokens")) << text;
}

class MoeResume : public ::testing::TestWithParam<const char*> {};

TEST_P(MoeResume, IsExact) {
  TempDir dir("nk_moe_resume");
  const std::string dt = std::string("train.dtype=") + GetParam();
  TrainRun straight = run(keys(dir, {dt, "train.out_dir=" + (dir / "straight")}));
  ASSERT_EQ(straight.history.size(), 24u);
  std::vector<std::string> split = keys(dir, {dt, "train.out_dir=" + (dir / "split")});
  std::vector<std::string> head_keys = split;
  head_keys.push_back("train.exit_at_step=9");
  TrainRun head = run(head_keys);
  ASSERT_EQ(head.history.size(), 9u);
  TrainRun tail = run(split);
  ASSERT_EQ(tail.history.front().step, 10);
  std::vector<StepStats> joined = head.history;
  joined.insert(joined.end(), tail.history.begin(), tail.history.end());
  ASSERT_EQ(joined.size(), straight.history.size());
  for (size_t i = 0; i < joined.size(); ++i) {
    EXPECT_EQ(joined[i].loss, straight.history[i].loss) << "step " << i + 1;
    EXPECT_EQ(joined[i].grad_norm, straight.history[i].grad_norm) << "step " << i + 1;
  }
  EXPECT_TRUE(tail.params == straight.params);
}

INSTANTIATE_TEST_SUITE_P(Dtypes, MoeResume, ::testing::Values("f32", "bf16"));

// Recomputing the layers (full or selective) gives the same bits.
TEST(MoeTrain, RecomputeGivesTheSameBits) {
  TempDir dir("nk_moe_recompute");
  TrainRun plain = run(keys(dir, {"train.steps=6", "train.out_dir=" + (dir / "a")}));
  for (const char* policy : {"full", "selective"}) {
    TrainRun r = run(keys(dir, {"train.steps=6", std::string("train.recompute=") + policy,
                                "train.out_dir=" + (dir / policy)}));
    ASSERT_EQ(r.history.size(), plain.history.size());
    for (size_t i = 0; i < r.history.size(); ++i)
      EXPECT_EQ(r.history[i].loss, plain.history[i].loss) << policy << " step " << i + 1;
    EXPECT_TRUE(r.params == plain.params) << policy;
  }
}

// A capacity factor drops pairs (the losses differ from dropless ones) and
// the recomputed forward drops the same ones.
TEST(MoeTrain, CapacityFactorTrainsAndRecomputesTheSameBits) {
  TempDir dir("nk_moe_capacity");
  TrainRun dropless = run(keys(dir, {"train.steps=6", "train.out_dir=" + (dir / "a")}));
  TrainRun cap = run(keys(
      dir, {"train.steps=6", "model.moe_capacity_factor=1.0", "train.out_dir=" + (dir / "b")}));
  TrainRun cap_full = run(keys(dir, {"train.steps=6", "model.moe_capacity_factor=1.0",
                                     "train.recompute=full", "train.out_dir=" + (dir / "c")}));
  ASSERT_EQ(cap.history.size(), 6u);
  EXPECT_NE(cap.history[0].loss, dropless.history[0].loss);
  for (size_t i = 0; i < cap.history.size(); ++i)
    EXPECT_EQ(cap_full.history[i].loss, cap.history[i].loss) << "step " << i + 1;
  EXPECT_TRUE(cap_full.params == cap.params);
  EXPECT_LT(cap.history.back().loss, cap.history.front().loss);
  const double dropped = last_metrics(dir / "b/metrics.jsonl")["moe_dropped"].get<double>();
  EXPECT_GT(dropped, 0.0);
  EXPECT_LT(dropped, 0.5);
}

TEST(MoeTrain, ParallelLayoutsItCannotRunAreRefused) {
  TempDir dir("nk_moe_layout");
  auto layout_error = [&](std::vector<std::string> extra, int world) {
    TrainConfig cfg = train_config_from(Config::load(train_schema(), "", keys(dir, extra)));
    return error_of([&] { check_train_layout(cfg, dist::Mesh(world, 0, cfg.parallel.mesh)); });
  };
  // Context parallel: runs dropless, alone and with ep (carved out of dp ×
  // cp) or pp (tests/apps/mpi/moe_cp_ranks.sh); a capacity factor is named.
  EXPECT_EQ(layout_error({"parallel.cp=2"}, 2), "(no error)");
  EXPECT_EQ(layout_error({"parallel.cp=2", "parallel.ep=2"}, 2), "(no error)");
  std::string e = layout_error({"parallel.cp=2", "model.moe_capacity_factor=1.0"}, 2);
  EXPECT_TRUE(contains(e, "parallel.cp = 2: model.moe_capacity_factor")) << e;
  // Tensor parallel (each expert split over tp, etp = tp), with sp and ep:
  // runs (tests/apps/mpi/moe_tp_ranks.sh); whole experts (etp = 1) too,
  // alone, with sp, with ep over the tp ranks and with dp
  // (tests/apps/mpi/moe_etp_ranks.sh); other expert splits are named.
  EXPECT_EQ(layout_error({"parallel.tp=2"}, 2), "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=2", "parallel.sp=true"}, 2), "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=2", "parallel.ep=2"}, 4), "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=2", "parallel.etp=1"}, 2), "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=2", "parallel.etp=1", "parallel.sp=true"}, 2), "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=2", "parallel.etp=1", "parallel.ep=2"}, 2), "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=2", "parallel.etp=1", "parallel.ep=2"}, 4), "(no error)");
  // Experts split over etp < tp ranks (tests/apps/mpi/moe_etp_split_ranks.sh):
  // alone, with sp, with ep, with ZeRO-1; etp above tp, not dividing it, not
  // dividing the experts' units, and expert-tp groups that are not runs of
  // the tp groups are named.
  const std::string kv4 = "model.n_kv_head=4";
  EXPECT_EQ(layout_error({"parallel.tp=4", "parallel.etp=2", kv4}, 4), "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=4", "parallel.etp=2", "parallel.sp=true", kv4}, 4),
            "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=4", "parallel.etp=2", "parallel.ep=2", kv4}, 4),
            "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=4", "parallel.etp=2", "parallel.ep=2", kv4}, 8),
            "(no error)");
  EXPECT_EQ(layout_error({"parallel.tp=4", "parallel.etp=2", "parallel.shard=optimizer", kv4}, 8),
            "(no error)");
  e = layout_error({"parallel.tp=2", "parallel.etp=4"}, 4);
  EXPECT_TRUE(contains(e, "parallel.etp = 4 with parallel.tp = 2: only parallel.etp = parallel.tp"))
      << e;
  e = layout_error({"parallel.tp=4", "parallel.etp=3", kv4}, 12);
  EXPECT_TRUE(contains(e, "parallel.etp = 3 does not divide parallel.tp = 4")) << e;
  e = layout_error({"parallel.tp=4", "parallel.etp=2", "model.moe_d_ff=62", kv4}, 4);
  EXPECT_EQ(e, "(no error)");
  e = layout_error({"parallel.tp=4", "parallel.etp=2", "model.moe_d_ff=63", kv4}, 4);
  EXPECT_TRUE(contains(e, "model.moe_d_ff = 63 is not divisible by parallel.etp = 2")) << e;
  e = layout_error({"parallel.tp=4", "parallel.etp=2", "model.moe_capacity_factor=1.0", kv4}, 4);
  EXPECT_TRUE(contains(e, "parallel.etp = 2 with parallel.tp = 4: model.moe_capacity_factor")) << e;
  e = layout_error({"parallel.tp=4", "parallel.etp=2", "train.micro_batch=1", "train.seq_len=15",
                    "train.global_batch=1", kv4},
                   4);
  EXPECT_TRUE(contains(e, "1 × 15 is not a multiple of parallel.tp / parallel.etp = 2")) << e;
  e = layout_error(
      {"parallel.tp=4", "parallel.etp=2", "parallel.ep=2", "parallel.shard=optimizer", kv4}, 8);
  EXPECT_TRUE(contains(e,
                       "parallel.etp = 2 with parallel.tp = 4: parallel.shard (ZeRO-1 / FSDP) "
                       "with parallel.ep"))
      << e;
  e = layout_error(
      {"parallel.tp=4", "parallel.etp=2", "parallel.ep=2", "parallel.order=ep-tp-cp-dp-pp", kv4},
      8);
  EXPECT_TRUE(contains(e,
                       "parallel.order 'ep-tp-cp-dp-pp': the experts' tensor-parallel groups "
                       "(parallel.etp = 2) are not runs of consecutive ranks"))
      << e;
  e = layout_error({"parallel.tp=2", "parallel.etp=1", "model.moe_capacity_factor=1.0"}, 2);
  EXPECT_TRUE(contains(e, "parallel.etp = 1 with parallel.tp = 2: model.moe_capacity_factor")) << e;
  e = layout_error({"parallel.tp=2", "parallel.etp=1", "train.micro_batch=1", "train.seq_len=15",
                    "train.global_batch=2"},
                   2);
  EXPECT_TRUE(contains(e,
                       "train.micro_batch × train.seq_len = 1 × 15 is not a multiple of "
                       "parallel.tp"))
      << e;
  e = layout_error({"parallel.tp=2", "parallel.etp=1", "model.moe_aux_loss_type=seq"}, 2);
  EXPECT_TRUE(contains(e, "model.moe_aux_loss_type=seq")) << e;
  e = layout_error({"parallel.tp=2", "parallel.etp=1", "parallel.ep=2", "parallel.shard=optimizer"},
                   4);
  EXPECT_TRUE(contains(e, "parallel.shard (ZeRO-1 / FSDP) with parallel.ep")) << e;
  // ep groups that split a tp group (ep after dp in the order: ep groups {0, 2}, {1, 3}).
  e = layout_error(
      {"parallel.tp=2", "parallel.etp=1", "parallel.ep=2", "parallel.order=tp-cp-dp-ep-pp"}, 4);
  EXPECT_TRUE(contains(e, "is not inside one expert-parallel group")) << e;
  e = layout_error({"parallel.tp=2", "model.moe_d_ff=63"}, 2);
  EXPECT_TRUE(contains(e, "model.moe_d_ff = 63 is not divisible by parallel.tp = 2")) << e;
  e = layout_error({"parallel.tp=2", "parallel.ep=2", "parallel.order=ep-tp-cp-dp-pp"}, 4);
  EXPECT_TRUE(contains(e, "parallel.order 'ep-tp-cp-dp-pp': the experts' tensor-parallel groups"))
      << e;
  TrainConfig cfg;
  // Pipeline parallel: the 1F1B and the interleaved schedules run
  // (tests/apps/mpi/moe_ranks.sh).
  cfg = train_config_from(Config::load(train_schema(), "", keys(dir, {"parallel.pp=2"})));
  EXPECT_NO_THROW(check_train_layout(cfg, dist::Mesh(2, 0, cfg.parallel.mesh)));
  // Expert parallel: runs when ep divides the experts (and dp); else named.
  cfg = train_config_from(Config::load(train_schema(), "", keys(dir, {"parallel.ep=2"})));
  EXPECT_NO_THROW(check_train_layout(cfg, dist::Mesh(2, 0, cfg.parallel.mesh)));
  cfg = train_config_from(
      Config::load(train_schema(), "", keys(dir, {"parallel.ep=4", "model.num_experts=6"})));
  e = error_of([&] { check_train_layout(cfg, dist::Mesh(4, 0, cfg.parallel.mesh)); });
  EXPECT_TRUE(contains(e, "parallel.ep = 4: model.num_experts = 6 does not split")) << e;
  cfg = train_config_from(
      Config::load(train_schema(), "", keys(dir, {"parallel.ep=2", "parallel.etp=2"})));
  e = error_of([&] { check_train_layout(cfg, dist::Mesh(4, 0, cfg.parallel.mesh)); });
  EXPECT_TRUE(contains(e, "parallel.etp = 2 with parallel.tp = 1")) << e;
  // LoRA under expert parallelism: each rank its experts' adapters, so
  // every expert adapted alike.
  auto ep2 = [&](std::vector<std::string> extra) {
    extra.push_back("parallel.ep=2");
    return train_config_from(Config::load(train_schema(), "", keys(dir, extra)));
  };
  cfg = ep2({"peft.method=lora", "peft.target_modules=w1"});
  EXPECT_NO_THROW(check_train_layout(cfg, dist::Mesh(2, 0, cfg.parallel.mesh)));
  cfg = ep2({"peft.method=lora", "peft.target_modules=experts.1.w1"});
  e = error_of([&] { check_train_layout(cfg, dist::Mesh(2, 0, cfg.parallel.mesh)); });
  EXPECT_TRUE(contains(e,
                       "parallel.ep = 2: peft.target_modules adapts 1 of the 4 experts of a "
                       "layer (model.layers.0.block_sparse_moe.experts.1.w1)"))
      << e;
  cfg = ep2({"peft.method=lora", "peft.target_modules=w1,experts.2.w3"});
  e = error_of([&] { check_train_layout(cfg, dist::Mesh(2, 0, cfg.parallel.mesh)); });
  EXPECT_TRUE(contains(e, "adapts 1 modules of expert 0 but 2 of expert 2")) << e;
  cfg = ep2({"peft.method=qlora", "peft.target_modules=w1"});  // each rank its experts' NF4 runs
  EXPECT_NO_THROW(check_train_layout(cfg, dist::Mesh(2, 0, cfg.parallel.mesh)));
}

TEST(MoeTrain, UnsupportedModelsAreRefused) {
  TempDir dir("nk_moe_refuse");
  auto err = [&](std::vector<std::string> extra) {
    return error_of(
        [&] { Trainer t(train_config_from(Config::load(train_schema(), "", keys(dir, extra)))); });
  };
  // LoRA trains on MoE models (tests/ckpt/moe_lora_test.cc); the other adapters do not yet.
  std::string e = err({"peft.method=ia3", "peft.target_modules=k_proj"});
  EXPECT_TRUE(contains(e, "peft.method: IA3 adapters on a Mixture-of-Experts model")) << e;
  e = err({"peft.method=adapter"});
  EXPECT_TRUE(contains(e, "peft.method: bottleneck adapters on a Mixture-of-Experts model")) << e;
  e = err({"model.num_experts_per_tok=5"});
  EXPECT_TRUE(contains(e, "model.num_experts_per_tok")) << e;
  e = err({"model.arch=llama", "model.num_experts=4"});
  EXPECT_TRUE(contains(e, "model.num_experts")) << e;
  e = err({"model.moe_score_func=tanh"});
  EXPECT_TRUE(contains(e, "model.moe_score_func")) << e;
  // DeepSeek-style routing's keys, each checked by name.
  for (const char* bad :
       {"model.moe_n_group=3", "model.moe_topk_group=3", "model.moe_routed_scaling=-1",
        "model.moe_bias_update_rate=-0.1", "model.moe_aux_loss_type=token",
        "model.moe_first_dense_layers=2", "model.moe_score_bias=maybe"}) {
    std::vector<std::string> extra = {bad};
    if (std::string(bad).starts_with("model.moe_topk_group"))
      extra.push_back("model.moe_n_group=2");
    e = err(extra);
    const std::string key(bad, std::string(bad).find('='));
    EXPECT_TRUE(contains(e, key)) << bad << ": " << e;
  }
  // A group-limited top-k needs k experts in the kept groups.
  e = err({"model.moe_n_group=4", "model.moe_topk_group=1"});
  EXPECT_TRUE(contains(e, "model.num_experts_per_tok")) << e;
  // HF's Mixtral has none of DeepSeek's routing: export refuses it by key.
  {
    ModelConfig m = model_preset("mixtral-tiny");
    m.moe_score_func = "sigmoid";
    nlohmann::ordered_json j;
    e = error_of([&] { m.architecture().hf_write_config(m, j); });
    EXPECT_TRUE(contains(e, "model.moe_score_func")) << e;
    m = model_preset("mixtral-tiny");
    m.moe_bias_update_rate = 0.001;
    e = error_of([&] { m.architecture().hf_write_config(m, j); });
    EXPECT_TRUE(contains(e, "model.moe_score_bias")) << e;
  }
  // A MoE reward model (a score head) is HF's *ForSequenceClassification of
  // its architecture; dots1 has none in transformers: refused by key.
  {
    ModelConfig m = model_preset("mixtral-tiny");
    m.num_labels = 1;
    m.validate();
    EXPECT_EQ(m.architecture().hf_classifier_class(), "MixtralForSequenceClassification");
    m = model_preset("dots1-tiny");
    m.num_labels = 1;
    e = error_of([&] { m.validate(); });
    EXPECT_TRUE(contains(e, "model.num_labels: dots1 has no sequence classifier")) << e;
  }
  e = err({"model.moe_aux_loss_coeff=-2"});
  EXPECT_TRUE(contains(e, "model.moe_aux_loss_coeff")) << e;
  // Another device is refused by the model itself, before anything is
  // allocated; NF4 (QLoRA, tests/model/frozen_weights_test.cc) and
  // block-quantised weights (tests/model/quantized_moe_test.cc) are not.
  ModelConfig c = model_preset("mixtral-tiny");
  check_moe_support(c, 1, kHost);
  e = error_of([&] { Transformer m(c, DType::F32, 1, ParamInit::Zeros, {}, Device::CUDA); });
  EXPECT_TRUE(contains(e, "run on the CPU only for now")) << e;
}

}  // namespace
}  // namespace nk
