// nekton autoconfig's calibrated step time (train/step_calibration.h): the
// fit recovers the compute scale and per-micro-batch cost it was built
// from; ranks sharing the cores, context parallelism and interleaved stages
// scale the prediction as the model says; every sharding mode and layout
// counts its collectives; the search with cp and vp enumerates layouts the
// trainer accepts.
#include "train/step_calibration.h"

#include <gtest/gtest.h>

#include "train/layout_search.h"
#include "train/train_parallel.h"

namespace nk {
namespace {

TrainConfig load(std::vector<std::string> o = {}) {
  std::vector<std::string> base = {"model.preset=gpt-tiny", "model.n_layer=4",
                                   "train.seq_len=64",      "train.global_batch=8",
                                   "train.micro_batch=2",   "data.path=unused.txt"};
  base.insert(base.end(), o.begin(), o.end());
  return train_config_from(Config::load(train_schema(), "", base), false);
}

// Fixed rates: every GEMM, attention and copy at 1 GFLOP/s, 1 GB/s.
MachineRates rates_for(const TrainConfig& c) {
  MachineRates r;
  measure_missing_rates(c, r);  // fills the keys; the values are replaced
  for (auto& [k, v] : r.gemm) v = 1e9;
  for (auto& [k, v] : r.attention) v = 1e9;
  r.bandwidth = 1e9;
  return r;
}

TEST(StepCalibration, FitRecoversScaleAndPerMicroBatchCost) {
  StepCalibration cal;
  // m = 1.5 c + n x 2 ms.
  fit_compute(cal, 1, 0.100, 1.5 * 0.100 + 0.002, 8, 0.110, 1.5 * 0.110 + 8 * 0.002);
  EXPECT_NEAR(cal.compute_scale, 1.5, 1e-9);
  EXPECT_NEAR(cal.per_micro_batch_s, 0.002, 1e-9);
  // Noise that makes more micro-batches faster: no negative cost, the
  // compute scale from both runs.
  fit_compute(cal, 1, 0.100, 0.300, 8, 0.100, 0.250);
  EXPECT_EQ(cal.per_micro_batch_s, 0.0);
  EXPECT_NEAR(cal.compute_scale, 2.75, 1e-9);
}

TEST(StepCalibration, ThreeProbesSeparateThePerStepCost) {
  StepCalibration cal;
  // m = 1.5 c + n x 2 ms + 30 ms: one micro-batch, eight, half the batch.
  const double n[3] = {1, 8, 1}, c[3] = {0.100, 0.110, 0.050};
  double m[3];
  for (int i = 0; i < 3; ++i) m[i] = 1.5 * c[i] + 0.002 * n[i] + 0.030;
  EXPECT_TRUE(fit_step(cal, n, c, m));
  EXPECT_NEAR(cal.compute_scale, 1.5, 1e-9);
  EXPECT_NEAR(cal.per_micro_batch_s, 0.002, 1e-9);
  EXPECT_NEAR(cal.per_step_s, 0.030, 1e-9);
  // A per-step cost adds to every rank's step, whatever its layout.
  const TrainConfig t = load();
  MachineRates r = rates_for(t);
  StepCalibration none = cal;
  none.per_step_s = 0;
  EXPECT_NEAR(predict_step(t, estimate_training(t, 1, &r), cal).overhead_s -
                  predict_step(t, estimate_training(t, 1, &r), none).overhead_s,
              0.030, 1e-12);
  // Noise that makes half the batch slower: the two-probe fit, no per-step cost.
  m[2] = m[0] + 0.01;
  EXPECT_FALSE(fit_step(cal, n, c, m));
  EXPECT_EQ(cal.per_step_s, 0.0);
  EXPECT_NEAR(cal.per_micro_batch_s, 0.002, 1e-3);
}

TEST(StepCalibration, SharedCoresContextParallelAndVirtualStagesScaleTheStep) {
  TrainConfig c = load();
  MachineRates r = rates_for(c);
  StepCalibration cal;
  cal.cores = 2, cal.procs_per_node = 2, cal.threads = 1, cal.per_micro_batch_s = 0.001;
  const StepPrediction one = predict_step(c, estimate_training(c, 1, &r), cal);
  EXPECT_GT(one.compute_s, 0);
  EXPECT_NEAR(one.overhead_s, 4 * 0.001, 1e-12);  // 4 micro-batches of every layer
  EXPECT_EQ(one.comm_s, 0);
  cal.procs_per_node = 4;  // 4 ranks of 1 thread on 2 cores: everything twice as long
  const StepPrediction shared = predict_step(c, estimate_training(c, 1, &r), cal);
  EXPECT_NEAR(shared.compute_s, 2 * one.compute_s, 1e-12);
  EXPECT_NEAR(shared.overhead_s, 2 * one.overhead_s, 1e-12);
  cal.sharing = 3;  // measured sharing wins over the core count
  EXPECT_NEAR(predict_step(c, estimate_training(c, 1, &r), cal).compute_s, 3 * one.compute_s,
              1e-12);
  cal.sharing = 0, cal.procs_per_node = 2;

  TrainConfig cp = load({"parallel.cp=2"});
  const StepPrediction ctx = predict_step(cp, estimate_training(cp, 2, &r), cal);
  EXPECT_NEAR(ctx.compute_s, one.compute_s / 2, 0.05 * one.compute_s);
  EXPECT_GT(ctx.messages, 0);  // the ring's key/value passes and the gradients

  // pp 2 over 4 micro-batches: vp 2 halves the fill and drain.
  TrainConfig pp = load({"parallel.pp=2"}), vp = load({"parallel.pp=2", "parallel.vp=2"});
  const StepPrediction p1 = predict_step(pp, estimate_training(pp, 2, &r), cal);
  const StepPrediction p2 = predict_step(vp, estimate_training(vp, 2, &r), cal);
  EXPECT_NEAR(p1.overhead_s, 0.001 * (4 + 1) * 2 / 4, 1e-12);  // 2 of 4 layers
  EXPECT_NEAR(p2.overhead_s, 0.001 * (4 + 0.5) * 2 / 4, 1e-12);
  EXPECT_LT(p2.compute_s, p1.compute_s);
  EXPECT_NEAR(p2.messages, 2 * p1.messages, 1e-9);  // twice the chunk boundaries
}

TEST(StepCalibration, CountsEveryLayoutsCollectives) {
  MachineRates r = rates_for(load());
  StepCalibration cal;
  cal.procs_per_node = 2, cal.cores = 2, cal.link_latency_s = 1e-3;
  auto predict = [&](std::vector<std::string> o) {
    TrainConfig c = load(o);
    measure_missing_rates(c, r);
    return predict_step(c, estimate_training(c, 2, &r), cal);
  };
  const StepPrediction none = predict({"parallel.dp=2"});
  const StepPrediction zero1 = predict({"parallel.dp=2", "parallel.shard=optimizer"});
  const StepPrediction fsdp = predict({"parallel.dp=2", "parallel.shard=full"});
  EXPECT_NEAR(zero1.messages, 2 * none.messages, 1e-9);
  EXPECT_NEAR(zero1.comm_bytes, none.comm_bytes, 1e-6);
  // FSDP: a reduce-scatter and two gathers per micro-batch (2 of them here).
  EXPECT_NEAR(fsdp.messages, none.messages * (1 + 2 * 2), 1e-9);
  // Tensor parallel: 4 per layer and micro-batch, 3 for the loss.
  const StepPrediction tp = predict({"parallel.tp=2"});
  EXPECT_NEAR(tp.messages, 4 * (4 * 4 + 3), 1e-9);
  EXPECT_NEAR(tp.comm_s, tp.comm_bytes / cal.link_bytes_per_s + tp.messages * 1e-3, 1e-12);
  // Fully recomputed layers: 2 more all-reduces each, and a third more ops.
  const StepPrediction full = predict({"parallel.tp=2", "train.recompute=full"});
  EXPECT_NEAR(full.messages, 4 * (6 * 4 + 3), 1e-9);
  EXPECT_NEAR(recompute_overhead(load({"train.recompute=full"})), 4.0 / 3.0, 1e-12);
}

TEST(StepCalibration, SearchWithCpAndVpGivesLayoutsTheTrainerAccepts) {
  const TrainConfig c = load();
  MachineRates r = rates_for(c);
  StepCalibration cal;
  cal.procs_per_node = 4, cal.cores = 4;
  LayoutSearchOptions opt;
  opt.world = 4;
  opt.rates = &r;
  opt.search_cp = opt.search_vp = true;
  opt.calibration = &cal;
  bool cp = false, vp = false;
  double last = 0;
  for (const LayoutCandidate& k : search_layouts(c, opt)) {
    if (!k.accepted) continue;
    cp |= k.cp > 1, vp |= k.vp > 1;
    EXPECT_GE(k.step_s(), last);  // best first
    last = k.step_s();
    // The overrides give back a layout the trainer accepts, with cp and vp.
    std::vector<std::string> o = k.overrides;
    TrainConfig again = load(o);
    EXPECT_EQ(again.parallel.mesh.cp, k.cp);
    EXPECT_EQ(again.parallel.vp, k.vp);
    EXPECT_NO_THROW(train_mesh(again, 4, 0)) << k.to_json().dump();
  }
  EXPECT_TRUE(cp);
  EXPECT_TRUE(vp);
}

}  // namespace
}  // namespace nk
