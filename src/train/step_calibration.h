// The step-time model of `nekton autoconfig`, calibrated on this machine.
// estimate_training's compute time (GEMM, attention and memory rates
// measured on one process at the threads a rank gets) is off on its own:
// it leaves out what every op costs beside its arithmetic (dispatch, OpenMP
// fork/join, small elementwise passes), ranks that share cores, and the
// link. The calibration holds those, each measured by a short probe:
//   compute_scale, per_micro_batch_s, per_step_s  three one-process
//       training runs of the recipe (one micro-batch per step, then several,
//       then one of 1 / d of the batch, d up to the ranks): measured step = compute_scale x
//       predicted compute + micro-batches x per_micro_batch_s + per_step_s
//       (what a step costs whatever it computes: the loss and norm
//       reductions, the metrics line, the step's bookkeeping; on a small
//       model most of the step);
//   cores, sharing                    this host's, shared by its ranks (the
//       slowdown of the several-micro-batch probe run by as many processes
//       at once as the host has ranks; a CPU loop's when that fails);
//   link_bytes_per_s, link_latency_s  an all-reduce of 4 KiB and of 4 MiB
//       between two ranks (or --link-gbps), refitted from a tensor- and a
//       data-parallel run of the recipe;
//   ring_attention_scale, ring_message_s  two context-parallel runs of
//       the recipe (one micro-batch per rank, then one sequence per
//       micro-batch): the ring's blocks over the causal kernel's tiles, and
//       what one of the ring's messages costs (fit_ring);
//   zero2_micro_batch_s               a ZeRO-2 run of the recipe (one
//       sequence per micro-batch): a micro-batch's reduction past its bytes;
//       zero2_pair_micro_batch_s a second, its sharding group of 2 (tp 2)
//       where the host has more ranks;
//   refault_s_per_byte, fsdp_step_s   three fully sharded (FSDP) runs of
//       the recipe (the most micro-batches, the fewest, the most of twice
//       the batch): what a byte its gathers write into released pages
//       costs, and what a step costs beside them;
//       fsdp_pair_refault_s_per_byte and fsdp_pair_step_s two more, their
//       sharding group of 2 (tp 2) where the host has more ranks.
// A rank's step is then
//   oversub x (compute_scale x (compute + (ring_attention_scale - 1) x
//                               its ring attention)
//              + per_micro_batch_s x micro-batches x its share of the
//                parameters (the busiest stage's tensor-parallel shards)
//              + per_step_s)
//   + the bytes it moves / link_bytes_per_s
//   + min(its messages x link_latency_s (the ring's at ring_message_s),
//         message_wait_share x the step so far)
// with compute estimate_training's (a rank's T / cp tokens, its ring
// blocks' tiles, the pipeline paced by its slowest stage) and the bytes on
// the wire (reductions in f32, gathers and sends in the compute dtype),
// with oversub = max(1, sharing) (ranks of one thread: at least ranks per
// host / cores), or without it max(1, ranks per host x threads per rank /
// cores), under pipelining taken slot by slot of the
// schedule for the stages that compute in it (pipeline_oversubscription:
// idle stages leave their cores, and their session's share of a loaded
// host, to the busy ones).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "core/json.h"
#include "train/estimate.h"
#include "train/train_config.h"

namespace nk {

struct StepCalibration {
  int64_t cores = 1;           // of one host
  int64_t procs_per_node = 1;  // ranks sharing them
  int64_t threads = 1;         // each rank's (train.threads, or cores / procs_per_node)
  // Measured: the median step of the recipe's probe run by procs_per_node
  // processes at once (each on `threads`) over its median step alone
  // (apps/autoconfig_runs.h), or a fixed CPU loop's wall time likewise; it
  // holds the ranks' sharing of the cores, of the memory bandwidth and
  // caches, and other load on the host. 0: not measured, procs_per_node x
  // threads / cores.
  double sharing = 0;
  double compute_scale = 1;
  double per_micro_batch_s = 0;
  double per_step_s = 0;
  // The share of per_micro_batch_s the probes' own recompute added
  // (recompute_overhead of their recipe): a candidate's is scaled by its own
  // over this.
  double probe_recompute = 1;
  // FSDP: what a byte of the weights its gathers write costs past the
  // link's bandwidth: the page handed back to the OS (madvise) after each
  // use faulted in again by the gather's copy, the release itself, the
  // waits at every gather. Measured by a fully sharded probe run of the
  // recipe (AutoconfigRuns::calibrate_fsdp), or else per byte of a plain
  // write after a release (measure_page_refault: on the Zen 5 VM 3.2-3.7 ns
  // a byte against the probe's 8.6); 0: not measured.
  double refault_s_per_byte = 0;
  // The page probe's figure (measure_page_refault): the least a gathered
  // byte can cost, which the fully sharded probes' fit must reach; 0: not
  // measured.
  double page_refault_s_per_byte = 0;
  // FSDP: what a step costs beside its gathered bytes (the fully sharded
  // probes' intercept: on the Zen 5 VM one rank of two slower by 20-40 ms
  // a step, the other waiting for it at the gathers), in a sharding group
  // of fsdp_group ranks; 0: not measured.
  double fsdp_step_s = 0;
  int64_t fsdp_group = 0;
  // The same in a group of 2 when fsdp_group is larger (a probe with tp 2:
  // on 4 ranks of 2 cores 20-34 % of the 4-rank group's for gpt-tiny, 8-22 %
  // for the test's smaller model, 2026-12-02), the cost of
  // groups in between on the line through both; negative: not measured
  // (fsdp_step_s at every size).
  double fsdp_pair_step_s = -1;
  // The cost per gathered byte likewise in a group of 2 (a pair of probes
  // with tp 2, the most and the fewest gathers: on 4 ranks of 2 cores a
  // gather waits for one peer, not three, and the 4-rank group's cost per
  // byte overcharged tp 2 x dp 2 with one sequence per micro-batch by
  // 24-40 %, 2026-12-04); negative: not measured (refault_s_per_byte at
  // every size).
  double fsdp_pair_refault_s_per_byte = -1;
  // FSDP's per-step cost and cost per gathered byte in a sharding group of
  // `ranks`: on the line through the pair's and fsdp_group's (at least 0).
  double fsdp_step_in(int64_t ranks) const;
  double refault_in(int64_t ranks) const;
  // ZeRO-2 (parallel.shard=grads): what each micro-batch's reduction costs
  // past its bytes, per unit of oversubscription: its buckets finished a
  // backward stage after they start (a rendezvous of the group at every
  // stage, which on ranks sharing cores waits for their turns) and the
  // released blocks written again. Measured by a probe at dp P, one
  // sequence per micro-batch (AutoconfigRuns::calibrate_zero2: on the Zen 5
  // VM, 4 ranks of 2 cores, gpt-tiny, 8-17 ms in most calibrations, times the
  // sharing of x2, where the bytes take 4 ms); in a group of zero2_group, a
  // smaller group's scaled by its share of the bytes (not measured apart).
  // 0: not measured.
  double zero2_micro_batch_s = 0;
  int64_t zero2_group = 0;
  // The same in a group of 2 when zero2_group is larger (a probe at tp 2 x
  // dp P/2: on 4 ranks of 2 cores the group of 4's scaled by the bytes put
  // tp 2 x dp 2 ZeRO-2 at 4 micro-batches a rank 44 % slow, 2026-12-04);
  // negative: not measured.
  double zero2_pair_micro_batch_s = -1;
  // ZeRO-2's per-micro-batch cost in a sharding group of `ranks`: on the
  // line through the pair's and zero2_group's when the pair's was
  // measured, else zero2_group's scaled by the share of the bytes a rank
  // sends ((ranks - 1) / ranks); 0 when not measured.
  double zero2_in(int64_t ranks) const;
  // Ring attention's time over the causal kernel's for the same tiles (a
  // context-parallel probe run of the recipe; 1 without one).
  double ring_attention_scale = 1;
  // One message of the ring's exchanges (p2p, and a2a+p2p's ring part): a
  // send and a receive that wait for the neighbour, which on ranks sharing
  // cores costs more than a collective's share. Negative: link_latency_s.
  double ring_message_s = -1;
  // Ranks of one host wait at a message for their peers to compute up to
  // it, which takes at most the compute between two messages: the
  // messages' cost is capped at this share of the step without them (the
  // tensor-parallel probe's messages' cost over its step without them, its
  // density of messages taken as where the cap starts). 0: no cap (several
  // nodes, where autoconfig runs no probe: the link's latency alone).
  double message_wait_share = 0;
  double link_bytes_per_s = 0.5e9;
  double link_latency_s = 30e-6;
  double oversubscription() const;  // >= 1
  nlohmann::json to_json() const;
  // to_json's object read back (oversubscription, derived, is not); a key
  // absent keeps its default (a file from before it was measured); nk::Error
  // naming `what` and the key for one that is not a number.
  static StepCalibration from_json(const nlohmann::json& j, const std::string& what);
};

// `sharing` on this host: the best of 3 rounds of a CPU loop on `threads`
// threads, then on `total` threads at once (each thread the same loop).
double measure_core_sharing(int64_t threads, int64_t total);

// Seconds per byte that writing pages handed back with
// madvise(MADV_DONTNEED) costs over writing resident ones (the page faults
// and zeroing FSDP's gathers pay after each release:
// parallel/sharded_weights.h): the best of `rounds` rounds over `bytes`
// (32 MiB, 5 by default, advised to huge pages as the arenas are), each a
// write of the resident pages, the release, and a write again. Also what it
// touched: the minor page faults of this thread during the writes of
// resident pages and during the writes after the releases (every round's;
// the latter at least one per page, or per huge page where the kernel maps
// those). nk::Error for bytes under a page or rounds under 1; zeros when the
// memory cannot be mapped.
struct PageRefault {
  double s_per_byte = 0;
  int64_t bytes = 0, rounds = 0;
  int64_t resident_faults = 0, refaults = 0;
};
PageRefault measure_page_refault(int64_t bytes = int64_t(32) << 20, int64_t rounds = 5);

// The calibration's two unknowns from the probes: a run with n1 micro-batches
// per step whose compute is predicted c1 and measured m1 seconds, and one
// with n2 != n1. Negative solutions (noise) are clamped: a scale of at least
// 0.25, an overhead of at least 0.
void fit_compute(StepCalibration& cal, double n1, double c1, double m1, double n2, double c2,
                 double m2);
// All three unknowns (per_step_s too) from three probes: n micro-batches per
// step, c predicted compute, m measured step (seconds) each; the first and
// the third with the same n and different c (a share of the batch), the second
// with other n. When noise gives a negative cost or a scale under 0.25, the
// two-probe fit of the first two (per_step_s 0). Returns whether all three
// were fitted.
bool fit_step(StepCalibration& cal, const double n[3], const double c[3], const double m[3]);

// A fully recomputed layer runs its forward's ops once more: the
// per-micro-batch cost of cfg's plan over that of no recompute (1 + a third
// of the fully recomputed share of the layers; the forward is about a third
// of a layer's ops).
double recompute_overhead(const TrainConfig& cfg);

struct StepPrediction {
  double compute_s = 0, overhead_s = 0, comm_s = 0;
  double comm_bytes = 0, messages = 0;
  double ring_messages = 0;  // of messages: the ring's (StepCalibration::ring_message_s)
  double total() const { return compute_s + overhead_s + comm_s; }
};

// A context-parallel probe run of the recipe against predict_step with
// ring_attention_scale 1 and free ring messages: extra_s = measured -
// predicted, per_scale_s = what one unit of ring_attention_scale adds to the
// prediction (its ring attention at the compute scale and sharing),
// ring_messages = its messages of the ring per step.
struct RingProbe {
  double extra_s = 0, per_scale_s = 0, ring_messages = 0;
};

// ring_attention_scale and ring_message_s from the context-parallel probes:
// `few` with one micro-batch per rank (few messages, so its extra time is
// mostly the ring's blocks), `many` (optional) with one sequence per
// micro-batch (the same tiles, several times the messages): extra_s =
// (scale - 1) x per_scale_s + ring_messages x per-message cost, solved for
// both. When that has no solution with a scale in [0.5, 10] and a cost >= 0
// (noise), or `many` is absent or carries no more messages than `few`: the
// messages at link_latency_s (ring_message_s stays negative) and the scale
// fitted to both probes by least squares (`few` alone without `many`),
// clamped to [0.5, 10]. Returns whether both were fitted.
bool fit_ring(StepCalibration& cal, const RingProbe& few, const RingProbe* many);

// A fully sharded probe run of the recipe against predict_step with FSDP's
// costs free: extra_s = measured - predicted, per_byte = what one unit of
// refault_s_per_byte adds to the prediction (its gathered bytes, at the
// cores' sharing), per_step = what one unit of the per-step cost adds.
struct FsdpProbeFit {
  double extra_s = 0, per_byte = 0, per_step = 0;
};

// FSDP's cost per gathered byte and per step from two or more such probes
// (extra_s = per byte x per_byte + per step x per_step, by least squares:
// with two, the exact solution), into cal.refault_s_per_byte and
// cal.fsdp_step_s when both are positive (the per-step one may be 0) and
// the per-byte one is at least `page` (the page probe's: every gather
// writes into released pages, so a fit under it is a probe slowed by the
// host). Returns whether it was taken (cal unchanged otherwise: fewer than
// two probes, or slopes in proportion).
bool fit_fsdp(StepCalibration& cal, const std::vector<FsdpProbeFit>& probes, double page);

// When fit_fsdp refuses for a negative per-step cost: the per-byte cost
// alone (per step 0), fitted to the probes by least squares, taken when it
// is at least `page`. Returns whether it was taken (cal unchanged
// otherwise). (The fit's per-step cost goes negative when the probes with
// the most gathers read more than their bytes' share of the others'
// excess: the per-byte cost then carries the whole excess.)
bool fit_fsdp_per_byte(StepCalibration& cal, const std::vector<FsdpProbeFit>& probes, double page);

// The fallback when both refuse: `page` per byte, and per step the
// least any probe leaves past it (a probe slowed by the host reads slow,
// never fast), at least 0.
void fit_fsdp_at_page(StepCalibration& cal, const std::vector<FsdpProbeFit>& probes, double page);

// The step of one rank of cfg's layout on `world` processes; `e` is
// estimate_training(cfg, world, rates) with the rates at cal.threads.
StepPrediction predict_step(const TrainConfig& cfg, const TrainEstimate& e,
                            const StepCalibration& cal);

// The layers of the busiest pipeline stage of `c` cut into pp stages (all
// of them without pipelining), and how many of those recompute fully.
std::pair<int64_t, int64_t> busiest_stage(const TrainConfig& c, int64_t pp);

// The slowdown a step of the 1F1B pipeline (pp stages of vp chunks, m
// micro-batches a rank) suffers from ranks sharing the cores, when every
// rank computing slows each by `oversub` (>= 1): in units of one chunk's
// work the step is m vp + pp - 1 slots, k_s = min(s + 1, pp, m vp,
// m vp + pp - 1 - s) stages busy in slot s (the fill's and drain's
// trapezoid), and while k of pp stages (so k / pp of the ranks) compute
// they are slowed max(1, oversub k / pp); the mean over the slots. oversub
// itself without pipelining (pp 1: every slot has all its stages busy).
double pipeline_oversubscription(double oversub, int64_t m, int64_t pp, int64_t vp);

}  // namespace nk
