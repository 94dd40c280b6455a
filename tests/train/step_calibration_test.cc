// nekton autoconfig's calibrated step time (train/step_calibration.h): the
// fit recovers the compute scale and per-micro-batch cost it was built
// from; ranks sharing the cores, context parallelism and interleaved stages
// scale the prediction as the model says (the ring's attention by its
// tiles, a pipeline by its slowest stage); every sharding mode and layout
// counts its collectives; the search with cp and vp enumerates layouts the
// trainer accepts.
#include "train/step_calibration.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <utility>

#include "core/error.h"
#include "test_util.h"
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

// A search of `world` ranks of one host, a core each, timed by `r` and `cal`.
LayoutSearchOptions calibrated_search(int64_t world, MachineRates& r, StepCalibration& cal) {
  cal.procs_per_node = world, cal.cores = world;
  LayoutSearchOptions opt;
  opt.world = world;
  opt.rates = &r;
  opt.calibration = &cal;
  return opt;
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

TEST(StepCalibration, TwoContextParallelProbesSeparateTheRingsBlocksFromItsMessages) {
  // The ring's messages on a rank of cp 2 (4 layers, global batch 8 of
  // micro-batches of 2 on one data-parallel rank: 4 micro-batches): one
  // pass forward and three backward (the keys and values on, their f32
  // gradients back) per layer; a2a+p2p's ring part likewise, a2a has none.
  const TrainConfig p2p = load({"parallel.cp=2"}),
                    a2a = load({"parallel.cp=2", "parallel.cp_comm_type=a2a"}),
                    full = load({"parallel.cp=2", "train.recompute=full"});
  MachineRates r = rates_for(p2p);
  StepCalibration cal;
  cal.link_bytes_per_s = 1e30, cal.link_latency_s = 1e-3;
  const StepPrediction p = predict_step(p2p, estimate_training(p2p, 2, &r), cal);
  EXPECT_NEAR(p.ring_messages, 4.0 * 4 * (1 + 3), 1e-9);
  EXPECT_EQ(predict_step(a2a, estimate_training(a2a, 2, &r), cal).ring_messages, 0.0);
  // A fully recomputed layer passes them on once more forward.
  EXPECT_NEAR(predict_step(full, estimate_training(full, 2, &r), cal).ring_messages,
              4.0 * 4 * (2 + 3), 1e-9);
  // The ring's messages at ring_message_s, the others at the link's latency.
  StepCalibration ring = cal;
  ring.ring_message_s = 5e-3;
  EXPECT_NEAR(predict_step(p2p, estimate_training(p2p, 2, &r), ring).comm_s - p.comm_s,
              p.ring_messages * 4e-3, 1e-12);

  // Ranks sharing a host wait at most the compute between messages: the
  // messages' cost is capped at message_wait_share of the step without them.
  StepCalibration capped = ring;
  const double without = p.compute_s + p.overhead_s,
               waits = p.comm_s - p.comm_bytes / cal.link_bytes_per_s + p.ring_messages * 4e-3;
  capped.message_wait_share = 0.5 * waits / without;
  const StepPrediction c = predict_step(p2p, estimate_training(p2p, 2, &r), capped);
  EXPECT_NEAR(c.comm_s - c.comm_bytes / cal.link_bytes_per_s, 0.5 * waits, 1e-12);
  capped.message_wait_share = 2 * waits / without;  // not reached: the messages' own cost
  EXPECT_NEAR(predict_step(p2p, estimate_training(p2p, 2, &r), capped).comm_s,
              predict_step(p2p, estimate_training(p2p, 2, &r), ring).comm_s, 1e-12);

  // Built from a scale of 2.5 and 0.4 ms a ring message: the probe with one
  // micro-batch per rank (16 messages) and the one with a sequence per
  // micro-batch (64, slightly more attention time predicted).
  const RingProbe few{1.5 * 0.040 + 16 * 0.4e-3, 0.040, 16},
      many{1.5 * 0.042 + 64 * 0.4e-3, 0.042, 64};
  StepCalibration fit = cal;
  EXPECT_TRUE(fit_ring(fit, few, &many));
  EXPECT_NEAR(fit.ring_attention_scale, 2.5, 1e-9);
  EXPECT_NEAR(fit.ring_message_s, 0.4e-3, 1e-12);
  // Noise that makes the many messages cheaper than the few: no negative
  // cost; the messages at the link's latency (1 ms) and the scale fitted to
  // both probes by least squares.
  const RingProbe cheaper{few.extra_s - 0.010, 0.042, 64};
  EXPECT_FALSE(fit_ring(fit, few, &cheaper));
  EXPECT_LT(fit.ring_message_s, 0);
  const double r1 = few.extra_s - 16 * 1e-3, r2 = cheaper.extra_s - 64 * 1e-3;
  EXPECT_NEAR(fit.ring_attention_scale,
              1.0 + (0.040 * r1 + 0.042 * r2) / (0.040 * 0.040 + 0.042 * 0.042), 1e-9);
  // One probe only (one sequence per rank): the scale from it alone.
  StepCalibration alone = cal;
  EXPECT_FALSE(fit_ring(alone, few, nullptr));
  EXPECT_NEAR(alone.ring_attention_scale, 1.0 + r1 / 0.040, 1e-9);
  // A scale out of [0.5, 10] is clamped (a probe faster than the model).
  EXPECT_FALSE(fit_ring(alone, RingProbe{-1.0, 0.040, 16}, nullptr));
  EXPECT_EQ(alone.ring_attention_scale, 0.5);
}

// FSDP's probes: per gathered byte and per step (least squares), the per-byte cost at
// least the page probe's (a gather writes into released pages), else the
// page probe's and the least per-step cost the probes leave past it.
TEST(StepCalibration, FsdpFitHeldToThePageProbe) {
  // Built from 6 ns a byte + 40 ms a step: the probe with one sequence per
  // micro-batch (4 micro-batches a rank: 4x the gathered bytes) and the
  // one with one micro-batch per rank, at a sharing of 2.
  const double page = 4e-9;
  const FsdpProbeFit most{6e-9 * 8e7 + 0.040 * 2, 8e7, 2}, fewest{6e-9 * 2e7 + 0.040 * 2, 2e7, 2};
  StepCalibration cal;
  EXPECT_TRUE(fit_fsdp(cal, {most, fewest}, page));
  EXPECT_NEAR(cal.refault_s_per_byte, 6e-9, 1e-18);
  EXPECT_NEAR(cal.fsdp_step_s, 0.040, 1e-12);
  // The fewest-gather probe slowed by the host (+200 ms): the fit's cost
  // per byte falls under the page probe's (and the per-step one jumps); it
  // is refused and cal left as it was.
  const FsdpProbeFit slowed{fewest.extra_s + 0.200, 2e7, 2};
  StepCalibration refused;
  refused.refault_s_per_byte = 1, refused.fsdp_step_s = 1;
  EXPECT_FALSE(fit_fsdp(refused, {most, slowed}, page));
  EXPECT_EQ(refused.refault_s_per_byte, 1);
  EXPECT_EQ(refused.fsdp_step_s, 1);
  // The fallback: the page probe per byte, per step the least either probe
  // leaves past it (the unslowed one's: (6 - 4) ns x 8e7 / 2 + 40 ms).
  fit_fsdp_at_page(refused, {most, slowed}, page);
  EXPECT_EQ(refused.refault_s_per_byte, page);
  EXPECT_NEAR(refused.fsdp_step_s, std::min(2e-9 * 8e7, 2e-9 * 2e7 + 0.200) / 2 + 0.040, 1e-12);
  // Probes faster than the pages alone: no negative per-step cost.
  fit_fsdp_at_page(refused, {FsdpProbeFit{0.010, 8e7, 2}}, page);
  EXPECT_EQ(refused.fsdp_step_s, 0);
  // The most-gathers probe reading more than its bytes' share of the
  // other's excess (per-step cost negative): the per-byte cost alone, by
  // least squares, when at least the page probe's; else refused.
  {
    const FsdpProbeFit heavy{0.074, 4e7, 2}, light{0.035, 2e7, 2};
    StepCalibration alone = cal;
    EXPECT_FALSE(fit_fsdp(alone, {heavy, light}, 0));  // 1.95 ns and a negative per step
    EXPECT_TRUE(fit_fsdp_per_byte(alone, {heavy, light}, 1e-9));
    EXPECT_NEAR(alone.refault_s_per_byte, (4e7 * 0.074 + 2e7 * 0.035) / (16e14 + 4e14), 1e-18);
    EXPECT_EQ(alone.fsdp_step_s, 0);
    StepCalibration floor = cal;
    floor.refault_s_per_byte = 7;
    EXPECT_FALSE(fit_fsdp_per_byte(floor, {heavy, light}, 2e-9));  // under the page probe's
    EXPECT_EQ(floor.refault_s_per_byte, 7);
  }
  // A negative cost (a probe faster than the model) or equal slopes: refused.
  EXPECT_FALSE(fit_fsdp(cal, {FsdpProbeFit{-0.1, 8e7, 2}, fewest}, page));
  EXPECT_FALSE(fit_fsdp(cal, {most, most}, page));
  EXPECT_FALSE(fit_fsdp(cal, {most}, page));  // one probe: two unknowns
  // Three probes (autoconfig's third: twice the batch, twice the most
  // gathers): exact ones give the costs they were built from; with noise,
  // the least-squares fit, whose residuals are orthogonal to both slopes.
  const FsdpProbeFit twice{6e-9 * 16e7 + 0.040 * 2, 16e7, 2};
  StepCalibration three;
  EXPECT_TRUE(fit_fsdp(three, {most, fewest, twice}, page));
  EXPECT_NEAR(three.refault_s_per_byte, 6e-9, 1e-18);
  EXPECT_NEAR(three.fsdp_step_s, 0.040, 1e-12);
  const std::vector<FsdpProbeFit> noisy = {FsdpProbeFit{most.extra_s + 0.030, 8e7, 2},
                                           FsdpProbeFit{fewest.extra_s - 0.010, 2e7, 2},
                                           FsdpProbeFit{twice.extra_s - 0.020, 16e7, 2}};
  EXPECT_TRUE(fit_fsdp(three, noisy, page));
  double along_bytes = 0, along_steps = 0, off = 0;
  for (const FsdpProbeFit& p : noisy) {
    const double r =
        p.extra_s - three.refault_s_per_byte * p.per_byte - three.fsdp_step_s * p.per_step;
    along_bytes += r * p.per_byte * 1e-9, along_steps += r * p.per_step, off += std::abs(r);
  }
  EXPECT_NEAR(along_bytes, 0, 1e-12);
  EXPECT_NEAR(along_steps, 0, 1e-12);
  EXPECT_GT(off, 0.01);  // the noise is not fitted away (three probes, two unknowns)
  EXPECT_NE(three.refault_s_per_byte, 6e-9);
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
  cal.sharing = 1.9;  // under the cores' bound (4 one-thread ranks on 2): the bound
  EXPECT_NEAR(cal.oversubscription(), 2.0, 1e-12);
  cal.threads = 2;  // ranks of 2 threads may be slower alone than their share: as measured
  EXPECT_NEAR(cal.oversubscription(), 1.9, 1e-12);
  cal.sharing = 0, cal.procs_per_node = 2, cal.threads = 1;

  TrainConfig cp = load({"parallel.cp=2"});
  const StepPrediction ctx = predict_step(cp, estimate_training(cp, 2, &r), cal);
  EXPECT_NEAR(ctx.compute_s, one.compute_s / 2, 0.05 * one.compute_s);
  EXPECT_GT(ctx.messages, 0);  // the ring's key/value passes and the gradients

  // The ring's attention on a rank: its blocks' 64 x 64 tiles not wholly in
  // the future. At 128 tokens, chunks of 32: 2 of the 3 tiles one process
  // computes; at 1024, chunks of 256: about half. The measured ring scale
  // multiplies that term only.
  for (const auto& [T, share, tol] :
       {std::tuple{"128", 2.0 / 3.0, 1e-12}, std::tuple{"1024", 0.5, 0.05}}) {
    TrainConfig a = load({std::string("train.seq_len=") + T, "model.max_seq_len=1024"}),
                b = load(
                    {std::string("train.seq_len=") + T, "model.max_seq_len=1024", "parallel.cp=2"});
    MachineRates rr = rates_for(a);
    measure_missing_rates(b, rr);
    EXPECT_NEAR(estimate_training(b, 2, &rr).step.attention_s /
                    estimate_training(a, 1, &rr).step.attention_s,
                share, tol)
        << T;
  }
  StepCalibration scaled = cal;
  scaled.ring_attention_scale = 2.5;
  const TrainEstimate ce = estimate_training(cp, 2, &r);
  EXPECT_NEAR(predict_step(cp, ce, scaled).compute_s - ctx.compute_s, 1.5 * ce.step.attention_s,
              1e-9 * ctx.compute_s);
  TrainConfig a2a = load({"parallel.cp=2", "parallel.cp_comm_type=a2a"});
  EXPECT_NEAR(predict_step(a2a, estimate_training(a2a, 2, &r), scaled).compute_s, ctx.compute_s,
              1e-9 * ctx.compute_s);  // heads over the whole row: no ring blocks

  // pp 2 over 4 micro-batches: vp 2 halves the fill and drain.
  TrainConfig pp = load({"parallel.pp=2"}), vp = load({"parallel.pp=2", "parallel.vp=2"});
  const TrainEstimate pe = estimate_training(pp, 2, &r);
  const StepPrediction p1 = predict_step(pp, pe, cal);
  const StepPrediction p2 = predict_step(vp, estimate_training(vp, 2, &r), cal);
  // The per-micro-batch cost by the busiest stage's share of the weights:
  // 2 of 4 layers and the embeddings or the head.
  const double held =
      double(std::max(pe.stages[0].params, pe.stages[1].params)) / double(pe.params);
  EXPECT_GT(held, 0.5);
  EXPECT_LT(held, 0.75);
  EXPECT_NEAR(p1.overhead_s, 0.001 * (4 + 1) * held, 1e-12);
  EXPECT_NEAR(p2.overhead_s, 0.001 * (4 + 0.5) * held, 1e-12);
  // And by its tensor-parallel shards: tp 2 holds about half of each
  // layer's weights (not the norms), each micro-batch costing that share.
  {
    TrainConfig tp = load({"parallel.tp=2"});
    measure_missing_rates(tp, r);
    const TrainEstimate te = estimate_training(tp, 2, &r);
    const double shard = double(te.stages[0].params) / double(te.params);
    EXPECT_GT(shard, 0.5);
    EXPECT_LT(shard, 0.6);
    EXPECT_NEAR(predict_step(tp, te, cal).overhead_s, cal.oversubscription() * 0.001 * 4 * shard,
                1e-12);
  }
  EXPECT_LT(p2.compute_s, p1.compute_s);
  EXPECT_NEAR(p2.messages, 2 * p1.messages, 1e-9);  // twice the chunk boundaries

  // The stage with the head sets the pipeline's pace: 4 micro-batches of it
  // and one of the other stage (g0 + g1 = one process's products, the
  // difference the head's).
  TrainConfig one_mb = load({"train.micro_batch=8"}), pp_mb = load({"parallel.pp=2"});
  measure_missing_rates(one_mb, r);
  for (auto& [k, v] : r.gemm) v = 1e9;
  const double all = estimate_training(one_mb, 1, &r).step.gemm_s / 4.0;  // mb 8: 4x the rows
  const double g4 = estimate_training(pp_mb, 2, &r).step.gemm_s;
  const double g1 = (g4 - estimate_training(load(), 1, &r).step.gemm_s / 4.0) / 3.0,
               g0 = estimate_training(load(), 1, &r).step.gemm_s / 4.0 - g1;
  const ModelConfig& m = pp_mb.model;
  EXPECT_NEAR(g1 - g0, 6.0 * 2 * 64 * double(m.d_model) * double(m.vocab_size) / 1e9, 1e-6 * g1);
  EXPECT_NEAR(all, g0 + g1, 1e-6 * all);
}

// Ranks sharing the cores slow each other only while they compute: slot by
// slot of the 1F1B schedule, by the stages busy in it.
TEST(StepCalibration, PipelineStagesShareTheCoresOnlyWhileTheyCompute) {
  // No pipeline: every rank always computes.
  EXPECT_DOUBLE_EQ(pipeline_oversubscription(2.0, 4, 1, 1), 2.0);
  EXPECT_DOUBLE_EQ(pipeline_oversubscription(1.0, 3, 4, 1), 1.0);
  // pp 4, one micro-batch: one stage at a time, on a quarter of the ranks.
  EXPECT_DOUBLE_EQ(pipeline_oversubscription(2.0, 1, 4, 1), 1.0);
  EXPECT_DOUBLE_EQ(pipeline_oversubscription(6.0, 1, 4, 1), 1.5);
  // pp 2, two micro-batches: slots of 1, 2, 1 busy stages (half the ranks
  // computing: 2.5 / 2).
  EXPECT_DOUBLE_EQ(pipeline_oversubscription(2.5, 2, 2, 1), (1.25 + 2.5 + 1.25) / 3.0);
  EXPECT_DOUBLE_EQ(pipeline_oversubscription(2.0, 2, 2, 1), (1 + 2 + 1) / 3.0);
  // pp 4 over 8: 1 2 3 4 4 4 4 4 3 2 1 busy stages.
  const double o = 2.0, want = (1 + 1 + 1.5 + 2 * 5 + 1.5 + 1 + 1) / 11.0;
  EXPECT_DOUBLE_EQ(pipeline_oversubscription(o, 8, 4, 1), want);
  // vp 2 over 2 micro-batches: 4 chunks a stage, a 1-chunk fill and drain
  // on pp 2: 1 2 2 2 1.
  EXPECT_DOUBLE_EQ(pipeline_oversubscription(3.0, 2, 2, 2), (1.5 + 3 + 3 + 3 + 1.5) / 5.0);

  // The prediction: 4 ranks of one thread on 2 cores, pp 4 at one
  // micro-batch a step computes as fast as with the cores to itself.
  TrainConfig c = load({"parallel.pp=4", "train.micro_batch=8", "model.n_layer=4"});
  MachineRates r = rates_for(c);
  StepCalibration alone, shared;
  alone.cores = shared.cores = 2;
  alone.procs_per_node = 2, shared.procs_per_node = 4;
  const TrainEstimate e = estimate_training(c, 4, &r);
  EXPECT_NEAR(predict_step(c, e, shared).compute_s, predict_step(c, e, alone).compute_s, 1e-12);
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
  const StepPrediction zero2 = predict({"parallel.dp=2", "parallel.shard=grads"});
  const StepPrediction fsdp = predict({"parallel.dp=2", "parallel.shard=full"});
  EXPECT_NEAR(zero1.messages, 2 * none.messages, 1e-9);
  EXPECT_NEAR(zero1.comm_bytes, none.comm_bytes, 1e-6);
  // ZeRO-2: a reduce-scatter per micro-batch (2 of them here), the weights'
  // gather once.
  EXPECT_NEAR(zero2.messages, 3 * none.messages, 1e-9);
  EXPECT_NEAR(zero2.comm_bytes, 1.5 * none.comm_bytes, 1e-6);
  // And each micro-batch's reduction past its bytes (calibrate_zero2's
  // probe): 2 micro-batches a rank here, at the cores' sharing; in a group
  // smaller than the probe's, by its share of the bytes (or on the line to
  // the pair's, measured); not for ZeRO-1.
  {
    StepCalibration z2 = cal;
    z2.zero2_micro_batch_s = 0.004, z2.zero2_group = 2;
    const TrainConfig c = load({"parallel.dp=2", "parallel.shard=grads"});
    const TrainEstimate e = estimate_training(c, 2, &r);
    EXPECT_NEAR(predict_step(c, e, z2).overhead_s - zero2.overhead_s,
                2 * 0.004 * cal.oversubscription(), 1e-12);
    z2.zero2_group = 4;  // measured over 4 ranks: a pair moves 1/2 where 4 move 3/4
    EXPECT_NEAR(predict_step(c, e, z2).overhead_s - zero2.overhead_s,
                2 * 0.004 * cal.oversubscription() * (0.5 / 0.75), 1e-12);
    // The pair's cost measured (a probe at tp 2 x dp 2): a pair's is it, a
    // group of 3 half-way to the group of 4's.
    z2.zero2_pair_micro_batch_s = 0.001;
    EXPECT_NEAR(predict_step(c, e, z2).overhead_s - zero2.overhead_s,
                2 * 0.001 * cal.oversubscription(), 1e-12);
    EXPECT_DOUBLE_EQ(z2.zero2_in(3), 0.0025);
    EXPECT_DOUBLE_EQ(z2.zero2_in(4), 0.004);
    EXPECT_EQ(z2.zero2_in(1), 0);
    // Full recompute hides the wait, up to the forwards it computes again
    // (the reductions finish meanwhile).
    {
      const TrainConfig fr =
          load({"parallel.dp=2", "parallel.shard=grads", "train.recompute=full"});
      measure_missing_rates(fr, r);
      const TrainEstimate ef = estimate_training(fr, 2, &r);
      StepCalibration zf = cal;
      zf.zero2_group = 2;
      const StepPrediction base = predict_step(fr, ef, zf);
      const double again =
          base.compute_s * ef.recompute_flops / (ef.flops_per_step + ef.recompute_flops);
      EXPECT_GT(again, 0);
      const double per = again / (2 * cal.oversubscription());  // the wait of 2 micro-batches
      zf.zero2_micro_batch_s = 0.5 * per;                       // hidden whole
      EXPECT_NEAR(predict_step(fr, ef, zf).overhead_s, base.overhead_s, 1e-12);
      zf.zero2_micro_batch_s = 3 * per;  // two thirds past the recompute
      EXPECT_NEAR(predict_step(fr, ef, zf).overhead_s - base.overhead_s, 2 * again, 1e-12);
    }
    const TrainConfig o = load({"parallel.dp=2", "parallel.shard=optimizer"});
    EXPECT_EQ(predict_step(o, estimate_training(o, 2, &r), z2).overhead_s, zero1.overhead_s);
  }
  // FSDP: a reduce-scatter and two gathers per micro-batch.
  EXPECT_NEAR(fsdp.messages, none.messages * (2 + 2 * 2), 1e-9);
  // Each gather faults the other rank's half of the compute weights in again.
  {
    TrainConfig c = load({"parallel.dp=2", "parallel.shard=full"});
    const TrainEstimate e = estimate_training(c, 2, &r);
    StepCalibration faults = cal;
    faults.refault_s_per_byte = 1e-9;
    const double bytes = 2.0 * 2 * 0.5 * double(e.stages[0].params) * double(dtype_size(c.dtype));
    EXPECT_NEAR(predict_step(c, e, faults).overhead_s - fsdp.overhead_s, bytes * 1e-9, 1e-15);
    EXPECT_EQ(predict_step(load({"parallel.dp=2"}),
                           estimate_training(load({"parallel.dp=2"}), 2, &r), faults)
                  .overhead_s,
              none.overhead_s);  // nothing is released without FSDP
    // FSDP's per-step cost: once a step whatever its micro-batches, as the
    // other overheads shared by the ranks on the cores; nothing without FSDP.
    StepCalibration step = cal;
    step.fsdp_step_s = 0.01;
    EXPECT_NEAR(predict_step(c, e, step).overhead_s - fsdp.overhead_s,
                0.01 * cal.oversubscription(), 1e-12);
    TrainConfig fewer = load({"parallel.dp=2", "parallel.shard=full", "train.micro_batch=4"});
    measure_missing_rates(fewer, r);
    const TrainEstimate ef = estimate_training(fewer, 2, &r);
    EXPECT_NEAR(predict_step(fewer, ef, step).overhead_s - predict_step(fewer, ef, cal).overhead_s,
                0.01 * cal.oversubscription(), 1e-12);
    const TrainConfig z = load({"parallel.dp=2", "parallel.shard=optimizer"});
    EXPECT_EQ(predict_step(z, estimate_training(z, 2, &r), step).overhead_s, zero1.overhead_s);
    // By the sharding group's size: measured in groups of 4 and of 2, a
    // group of 2 costs the pair's, one of 3 half-way, larger ones on the
    // same line; without the pair's, fsdp_step_s at every size.
    StepCalibration groups = step;
    groups.fsdp_group = 4, groups.fsdp_step_s = 0.03, groups.fsdp_pair_step_s = 0.01;
    EXPECT_DOUBLE_EQ(groups.fsdp_step_in(2), 0.01);
    EXPECT_DOUBLE_EQ(groups.fsdp_step_in(3), 0.02);
    EXPECT_DOUBLE_EQ(groups.fsdp_step_in(4), 0.03);
    EXPECT_DOUBLE_EQ(groups.fsdp_step_in(8), 0.07);
    groups.fsdp_pair_step_s = 0.05;  // a pair dearer than the group: never below 0
    EXPECT_DOUBLE_EQ(groups.fsdp_step_in(8), 0.0);
    groups.fsdp_pair_step_s = -1;
    EXPECT_DOUBLE_EQ(groups.fsdp_step_in(2), 0.03);
    groups.fsdp_pair_step_s = 0.01;  // this layout shards over 2 ranks: the pair's cost
    EXPECT_NEAR(predict_step(c, e, groups).overhead_s - fsdp.overhead_s,
                0.01 * cal.oversubscription(), 1e-12);
    // The cost per gathered byte likewise (the pair's measured by two tp 2
    // probes): this layout's bytes at the pair's, none measured: the
    // group's at every size.
    StepCalibration per_byte = faults;
    per_byte.fsdp_group = 4, per_byte.refault_s_per_byte = 3e-9;
    EXPECT_DOUBLE_EQ(per_byte.refault_in(2), 3e-9);
    per_byte.fsdp_pair_refault_s_per_byte = 1e-9;
    EXPECT_DOUBLE_EQ(per_byte.refault_in(2), 1e-9);
    EXPECT_DOUBLE_EQ(per_byte.refault_in(3), 2e-9);
    EXPECT_DOUBLE_EQ(per_byte.refault_in(4), 3e-9);
    EXPECT_NEAR(predict_step(c, e, per_byte).overhead_s - fsdp.overhead_s, bytes * 1e-9, 1e-15);
    // The probe releases and faults in what it says: every rewrite after a
    // release faults each page in again (at least one fault per 2 MiB,
    // where the kernel maps huge pages), the writes of resident pages
    // fault fewer. (What the faults cost is timing: only its sign here.)
    const int64_t MiB = 1 << 20;
    const PageRefault probe = measure_page_refault(4 * MiB, 3);
    EXPECT_EQ(probe.bytes, 4 * MiB);
    EXPECT_EQ(probe.rounds, 3);
    EXPECT_GE(probe.refaults, 3 * 4 * MiB / (2 * MiB)) << probe.refaults;
    EXPECT_LT(probe.resident_faults, probe.refaults);
    EXPECT_TRUE(std::isfinite(probe.s_per_byte) && probe.s_per_byte >= 0) << probe.s_per_byte;
    // Bad sizes are refused by name, not mapped.
    using Args = std::pair<int64_t, int64_t>;  // bytes, rounds
    for (const auto& [bytes, rounds] :
         {Args{0, 5}, Args{-1, 5}, Args{4 * MiB, 0}, Args{int64_t(1) << 40, 5}}) {
      try {
        (void)measure_page_refault(bytes, rounds);
        ADD_FAILURE() << bytes << " bytes, " << rounds << " rounds accepted";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("measure_page_refault"), std::string::npos);
      }
    }
  }
  // Tensor parallel: 4 per layer and micro-batch, 3 for the loss.
  const StepPrediction tp = predict({"parallel.tp=2"});
  EXPECT_NEAR(tp.messages, 4 * (4 * 4 + 3), 1e-9);
  EXPECT_NEAR(tp.comm_s, tp.comm_bytes / cal.link_bytes_per_s + tp.messages * 1e-3, 1e-12);
  // Sequence parallel: an all-gather and a reduce-scatter at each point,
  // half an all-reduce's bytes each, the gather's in the compute dtype and
  // the reduction's in f32 (as an all-reduce's).
  const StepPrediction sp = predict({"parallel.tp=2", "parallel.sp=true"});
  EXPECT_NEAR(sp.messages, 4 * (2 * 4 * 4 + 3), 1e-9);
  const double s = double(dtype_size(load().dtype));
  EXPECT_NEAR(sp.comm_bytes / tp.comm_bytes, (s + 4.0) / 8.0, 1e-9);
  // Fully recomputed layers: 2 more all-reduces each, and a third more ops.
  const StepPrediction full = predict({"parallel.tp=2", "train.recompute=full"});
  EXPECT_NEAR(full.messages, 4 * (6 * 4 + 3), 1e-9);
  EXPECT_NEAR(recompute_overhead(load({"train.recompute=full"})), 4.0 / 3.0, 1e-12);
}

TEST(StepCalibration, SearchWithCpAndVpGivesLayoutsTheTrainerAccepts) {
  const TrainConfig c = load();
  MachineRates r = rates_for(c);
  StepCalibration cal;
  LayoutSearchOptions opt = calibrated_search(4, r, cal);
  opt.search_cp = opt.search_vp = true;
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

// The search's cp_comm_type candidates are timed as the step model costs
// each type. At cp 4 on 4 ranks (tp 1, multi-head attention, so a rank's
// keys and values are twice its queries, q): the exchanges of a layer send
// (nn::cp_exchange_bytes) a2a 3/4 (qkv + out) forward and twice that
// backward, the least; a2a+p2p 2 x 2 half of that over its pairs plus a ring
// of 2; all_gather the ring's bytes less the gradients' last hop; p2p the
// most. Messages per layer (predict_step): all_gather 1 + 2, a2a 2 + 2,
// a2a+p2p (2 + 1) + (2 + 3), p2p 3 + 7. The compute is the same but for
// the attention: a2a's heads over the whole row with the plain kernel,
// every other type through the ring's block kernel (times its measured
// scale). So with a slow link the bytes order them, with a costly message
// the counts, with a free link the a2a's kernel wins; all_gather never
// loses to p2p (the same compute, fewer bytes and messages).
TEST(StepCalibration, SearchTimesEachContextParallelTypeAsTheModelCostsIt) {
  const TrainConfig c = load();
  MachineRates r = rates_for(c);
  StepCalibration cal;
  LayoutSearchOptions opt = calibrated_search(4, r, cal);
  opt.search_cp = opt.search_cp_comm = true;
  (void)search_layouts(c, opt);  // measures the rates of every layout's shapes
  for (auto& [k, v] : r.gemm) v = 1e9;
  for (auto& [k, v] : r.attention) v = 1e9;
  // The four types of tp 1 x cp 4, micro-batch 2, no recompute.
  auto at_cp4 = [&](const StepCalibration& k) {
    opt.calibration = &k;
    std::map<std::string, LayoutCandidate> by_type;
    std::vector<std::string> order;
    for (const LayoutCandidate& x : search_layouts(c, opt))
      if (x.accepted && x.tp == 1 && x.pp == 1 && x.cp == 4 && !x.sp && x.shard == "none" &&
          x.micro_batch == 2 && x.recompute == "none") {
        by_type[x.cp_comm] = x;
        order.push_back(x.cp_comm);
      }
    EXPECT_EQ(by_type.size(), 4u);
    return std::pair(by_type, order);
  };
  StepCalibration bytes = cal;  // 1 kB/s, no latency: the bytes decide
  bytes.link_bytes_per_s = 1e3, bytes.link_latency_s = 0;
  auto [b, b_order] = at_cp4(bytes);
  EXPECT_LT(b["a2a"].comm_bytes, b["a2a+p2p"].comm_bytes);
  EXPECT_LT(b["a2a+p2p"].comm_bytes, b["all_gather"].comm_bytes);
  EXPECT_LT(b["all_gather"].comm_bytes, b["p2p"].comm_bytes);
  // Ranked so, best first.
  EXPECT_EQ(b_order, (std::vector<std::string>{"a2a", "a2a+p2p", "all_gather", "p2p"}));
  EXPECT_EQ(b["a2a+p2p"].overrides.back(), "parallel.hierarchical_context_parallel_sizes=2,2");

  StepCalibration messages = cal;  // free bytes, 1 s a message
  messages.link_bytes_per_s = 1e30, messages.link_latency_s = 1;
  auto [m, m_order] = at_cp4(messages);
  // The gradients' buckets are the same for every type: the differences
  // are the counts above x 4 layers x 4 micro-batches (global batch 8 of 2).
  const double per = 4.0 * 4.0;
  EXPECT_NEAR(m["a2a"].comm_messages - m["all_gather"].comm_messages, per * (4 - 3), 1e-9);
  EXPECT_NEAR(m["a2a+p2p"].comm_messages - m["all_gather"].comm_messages, per * (8 - 3), 1e-9);
  EXPECT_NEAR(m["p2p"].comm_messages - m["all_gather"].comm_messages, per * (10 - 3), 1e-9);
  EXPECT_EQ(m_order, (std::vector<std::string>{"all_gather", "a2a", "a2a+p2p", "p2p"}));

  StepCalibration link = cal;  // a free link; the ring's blocks cost 3x the causal kernel's
  link.link_bytes_per_s = 1e30, link.link_latency_s = 0, link.ring_attention_scale = 3;
  auto [f, f_order] = at_cp4(link);
  EXPECT_EQ(f_order.front(), "a2a");
  EXPECT_DOUBLE_EQ(f["all_gather"].compute_s, f["p2p"].compute_s);
  for (const auto& x : {"a2a+p2p", "all_gather", "p2p"})
    EXPECT_LT(f["a2a"].step_s(), f[x].step_s());
  for (const StepCalibration* k : {&cal, &bytes, &messages, &link}) {
    auto [t, order] = at_cp4(*k);
    EXPECT_LE(t["all_gather"].step_s(), t["p2p"].step_s());
  }
}

// parallel.pp_layout's candidates: every split adds up to the layers with
// at least one a stage but the last (the head alone), none twice, the even
// one first (as no key); the recipe's own split is among them at its pp;
// none past a stage a layer.
TEST(StepCalibration, PipelineSplitsCoverTheUnevenLayouts) {
  using Splits = std::vector<std::vector<int64_t>>;
  const TrainConfig c = load();  // 4 layers
  EXPECT_EQ(pipeline_splits(c, 2), (Splits{{}, {1, 3}, {3, 1}}));
  // By the first stage's layers, then the last's.
  EXPECT_EQ(pipeline_splits(c, 3), (Splits{{1, 3, 0}, {1, 2, 1}, {1, 1, 2}, {2, 2, 0}, {2, 1, 1}}));
  EXPECT_EQ(pipeline_splits(c, 4), (Splits{{}}));
  EXPECT_TRUE(pipeline_splits(c, 5).empty());
  EXPECT_TRUE(pipeline_splits(c, 1).empty());
  const TrainConfig own = load({"parallel.pp=3", "parallel.pp_layout=2,1,1"});
  EXPECT_EQ(pipeline_splits(own, 3),
            (Splits{{2, 1, 1}, {1, 3, 0}, {1, 2, 1}, {1, 1, 2}, {2, 2, 0}}));
  const TrainConfig deep = load({"model.n_layer=12"});
  for (int64_t pp : {2, 3, 4, 6}) {
    const Splits v = pipeline_splits(deep, pp);
    ASSERT_GT(v.size(), 1u) << pp;
    EXPECT_TRUE(v.front().empty()) << "the even split first";
    std::set<std::vector<int64_t>> seen;
    for (const std::vector<int64_t>& s : v) {
      EXPECT_TRUE(seen.insert(s).second) << fmt::format("{} twice", fmt::join(s, ","));
      if (s.empty()) continue;
      ASSERT_EQ(int64_t(s.size()), pp);
      int64_t sum = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        EXPECT_GE(s[i], i + 1 < s.size() ? 1 : 0);
        sum += s[i];
      }
      EXPECT_EQ(sum, 12);
      EXPECT_LE(std::max(s.front(), s.back()), 2 * 12 / pp);
      // Megatron's form: the middle stages even.
      for (size_t i = 2; i + 1 < s.size(); ++i) EXPECT_EQ(s[i], s[1]);
      // The trainer takes it.
      TrainConfig t = deep;
      t.parallel.mesh.pp = int(pp), t.parallel.pp_layout = s;
      EXPECT_NO_THROW(train_mesh(t, int(pp), 0)) << fmt::format("{}", fmt::join(s, ","));
    }
  }
}

// A head that costs more than a stage's layers (a 16384-way vocabulary at
// width 256: about 5 layers' products): the search moves layers off the
// last stage, predicted faster than the even split; the overrides give that
// split back to the trainer. Without the option, or interleaved (vp > 1),
// the splits stay even.
TEST(StepCalibration, SearchSplitsAPipelineToBalanceItsHead) {
  const TrainConfig c = load({"model.vocab_size=16384"});
  MachineRates r = rates_for(c);
  StepCalibration cal;
  LayoutSearchOptions opt = calibrated_search(2, r, cal);
  opt.search_vp = true;
  auto pipelines = [&] {
    std::map<std::pair<int64_t, std::string>, LayoutCandidate> by;  // (mb, recompute)
    for (const LayoutCandidate& k : search_layouts(c, opt))
      if (k.accepted && k.pp == 2 && k.vp == 1) by[{k.micro_batch, k.recompute}] = k;
    return by;
  };
  const auto even = pipelines();
  opt.search_pp_layout = true;
  const auto split = pipelines();
  ASSERT_FALSE(even.empty());
  ASSERT_EQ(split.size(), even.size());
  bool faster = false;
  for (const auto& [key, k] : split) {
    const LayoutCandidate& e = even.at(key);
    EXPECT_TRUE(e.pp_layout.empty());
    EXPECT_LE(k.step_s(), e.step_s()) << k.name();
    if (k.pp_layout.empty()) continue;
    faster |= k.step_s() < 0.95 * e.step_s();
    EXPECT_GT(k.pp_layout.front(), k.pp_layout.back()) << k.name();
    EXPECT_TRUE(test::contains(k.name(), fmt::format("pp2 [{}]", fmt::join(k.pp_layout, ","))));
    EXPECT_EQ(k.to_json().at("pp_layout").get<std::vector<int64_t>>(), k.pp_layout);
    // Its overrides: the trainer's config and mesh take them, and the
    // estimate with them predicts the candidate's step.
    std::vector<std::string> o = k.overrides;
    o.push_back("model.vocab_size=16384");
    const TrainConfig again = load(o);
    EXPECT_EQ(again.parallel.pp_layout, k.pp_layout);
    EXPECT_NO_THROW(train_mesh(again, 2, 0));
    const StepPrediction p = predict_step(again, estimate_training(again, 2, &r), cal);
    EXPECT_NEAR(p.total(), k.step_s(), 1e-9 * k.step_s());
    // No other split of this layout is predicted faster.
    for (const std::vector<int64_t>& other : pipeline_splits(again, 2)) {
      TrainConfig t = again;
      t.parallel.pp_layout = other;
      const double step = predict_step(t, estimate_training(t, 2, &r), cal).total();
      EXPECT_LE(k.step_s(), step * (1 + 1e-12))
          << k.name() << " against " << fmt::format("{}", fmt::join(other, ","));
    }
  }
  EXPECT_TRUE(faster);
  // Interleaved (8 layers over pp 2 x vp 2): even.
  const TrainConfig eight = load({"model.vocab_size=16384", "model.n_layer=8"});
  MachineRates r8 = rates_for(eight);
  opt.rates = &r8;
  bool interleaved = false;
  for (const LayoutCandidate& k : search_layouts(eight, opt))
    if (k.accepted && k.vp > 1) {
      interleaved = true;
      EXPECT_TRUE(k.pp_layout.empty()) << k.name();
    }
  EXPECT_TRUE(interleaved);
  opt.rates = &r;
  // 3 stages of 4 layers: trained with an uneven split, not refused.
  opt.world = 3;
  cal.procs_per_node = 3, cal.cores = 3;
  bool three = false;
  for (const LayoutCandidate& k : search_layouts(c, opt))
    if (k.accepted && k.pp == 3) {
      three = true;
      ASSERT_EQ(k.pp_layout.size(), 3u) << k.name();
      EXPECT_EQ(k.pp_layout[0] + k.pp_layout[1] + k.pp_layout[2], 4);
    }
  EXPECT_TRUE(three);
}

}  // namespace
}  // namespace nk
