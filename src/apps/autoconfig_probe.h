// What autoconfig's probes share (apps/autoconfig_runs.cc, the compute,
// link, message and ring probes; apps/autoconfig_sharded.cc, the FSDP and
// ZeRO-2 ones): the recipe as a probe runs it and how its steps are read.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/estimate.h"
#include "train/train_config.h"

namespace nk::autoconfig {

// Steps of each probe run: the first warms up, the median of the rest counts.
inline constexpr int64_t kProbeSteps = 8;

// The median of v (0 when empty).
double median(std::vector<double> v);

// The largest divisor of n that is at most cap (at least 1).
int64_t divisor_at_most(int64_t n, int64_t cap);

// The recipe as a probe runs it: tp x cp x dp ranks, no pipeline, p2p
// (a2a+p2p's sizes would not fit every cp), no sequence parallelism or
// sharding, micro-batches of mb; and the same as nekton train's overrides
// (with the rank's threads).
TrainConfig probe_config(const TrainConfig& cfg, int tp, int cp, int dp, int64_t mb);
std::vector<std::string> probe_overrides(int tp, int cp, int dp, int64_t mb, int64_t threads);

// A multi-rank probe's layout on P ranks as the model sees it: checked as
// the trainer checks it (nk::Error when it cannot run), its rates measured.
TrainEstimate probe_estimate(const TrainConfig& c, int64_t P, MachineRates& rates);

}  // namespace nk::autoconfig
