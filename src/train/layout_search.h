// `nekton estimate --search`: the layouts of a recipe on N processes that
// `nekton train` accepts and that fit a memory budget per rank, ranked by
// predicted step time (compute from train/estimate.h plus a communication
// term), or by memory without rates. Every candidate goes through the
// trainer's own checks (ParallelConfig::check, train_mesh), so a refused
// layout carries the trainer's message.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/json.h"
#include "train/estimate.h"
#include "train/step_calibration.h"
#include "train/train_config.h"

namespace nk {

// The link the communication term divides by: 4 Gbit/s, the bus bandwidth
// of a 16 MiB all-reduce between two ranks over OpenMPI's shared memory on
// the 2-core box (BENCHMARKS.md, "All-reduce through dist's MPI
// communicator": 31 ms best).
inline constexpr double kDefaultLinkGbps = 4.0;

struct LayoutSearchOptions {
  int64_t world = 1;
  double budget_bytes = 0;  // per rank; 0: no limit
  double link_gbps = kDefaultLinkGbps;
  // Rates of this machine; null: no time, ranked by memory. Rates the
  // candidates need and `rates` lacks are measured and added.
  MachineRates* rates = nullptr;
  // nekton autoconfig: also enumerate parallel.cp (context parallel, out of
  // the data-parallel ranks) and parallel.vp (interleaved virtual stages,
  // every count that splits the layers evenly), and time each candidate
  // with the calibrated model (train/step_calibration.h; needs rates).
  bool search_cp = false, search_vp = false;
  // With search_cp: at every cp > 1 also parallel.cp_comm_type, each of
  // p2p, a2a, all_gather and a2a+p2p at every split a x p = cp with a, p >= 2
  // (parallel.hierarchical_context_parallel_sizes; a split with a 1 is p2p
  // or a2a again), put through the trainer's checks like every other key (a2a
  // with heads not divisible by tp x cp is rejected with its message). At
  // cp = 1, and without it, the recipe's type and sizes (nekton autoconfig
  // leaves them so when the user set either key).
  bool search_cp_comm = false;
  // With rates: a pipeline of one chunk per stage (vp 1) tries the splits of
  // pipeline_splits as parallel.pp_layout and keeps the fastest predicted
  // (the even split on a tie); nekton autoconfig sets it.
  bool search_pp_layout = false;
  const StepCalibration* calibration = nullptr;
};

struct LayoutCandidate {
  int64_t tp = 1, pp = 1, dp = 1, ep = 1, cp = 1, vp = 1, micro_batch = 1;
  bool sp = false;
  // parallel.cp_comm_type, and a2a+p2p's a2a and p2p group sizes (what
  // they are at cp 1 does not matter).
  std::string cp_comm = "p2p";
  std::vector<int64_t> hierarchical_cp_sizes;
  // parallel.pp_layout: layers per stage; empty: the even split (or, when the
  // search kept the recipe's pipeline, the recipe's).
  std::vector<int64_t> pp_layout;
  std::string shard = "none", recompute = "none";
  bool accepted = false;
  std::string reason;        // why it was rejected (names the key or --budget)
  int64_t memory_bytes = 0;  // the peak rank's (0 when refused before estimating)
  // Bytes one rank moves per step: DP gradient reduction, TP all-reduces,
  // PP activation sends, MoE all-to-alls (train/layout_search.cc).
  double comm_bytes = 0;
  double bubble = 0;                 // 1F1B: (pp - 1) / (m + pp - 1), already in compute_s
  double compute_s = 0, comm_s = 0;  // 0 without rates (calibrated: compute_s has the overhead)
  double comm_messages = 0;          // calibrated: collective calls and sends per step
  double step_s() const { return compute_s + comm_s; }
  double tokens_per_s = 0;
  // The key=value settings that give this layout on top of the recipe.
  std::vector<std::string> overrides;
  nlohmann::json to_json() const;
  // One line of a table: "tp1 cp2 a2a pp1 vp1 dp2 sp optimizer mb2 selective"
  // (the type after cp when cp > 1; a2a+p2p with its sizes, "a2a+p2p 2x2";
  // an uneven pipeline with its layers after pp, "pp2 [9,3]").
  std::string name() const;
};

// The parallel.pp_layout values search_pp_layout tries at pp stages (of
// one chunk each): the even split first (as empty, no key) where pp divides
// the layers, the recipe's own layout at its pp, then Megatron-style uneven
// ones (decoder_first/last_pipeline_num_layers): f layers on the first
// stage and l on the last, the middle ones the rest evenly (at least one
// each), f at least one, l possibly none (the head alone), f and l at most
// twice an even stage's. The first stage also holds the embedding and the
// last the head and the loss (GPT-2's 50257-way head costs about 5 of its
// 12 layers on the CPU), so the even split leaves the first stage waiting.
// None for pp < 2 or more stages than layers.
//
// Interleaved pipelines (vp > 1) are not split by the search: their chunks
// run in slots, rank 0's chunk c beside rank 1's, so the head's chunk sets
// the pace of its slot whatever the other chunks hold (GPT-2 124M at pp 2
// vp 3: 4,2,2,2,2,0 measured 5 % faster than even where the step model,
// which sums each rank's chunks, predicted 13 %; BENCHMARKS.md).
std::vector<std::vector<int64_t>> pipeline_splits(const TrainConfig& cfg, int64_t pp);

// All candidates: the accepted ones first, best first (step time, then
// memory; without rates memory, then communication bytes), then the
// rejected ones in enumeration order.
std::vector<LayoutCandidate> search_layouts(const TrainConfig& cfg, const LayoutSearchOptions& opt);

}  // namespace nk
