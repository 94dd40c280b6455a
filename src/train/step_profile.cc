#include "train/step_profile.h"

#include <fmt/format.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/log.h"
#include "ops/cpu_isa.h"

namespace nk {

StepProfile::StepProfile(bool on, Device device) : on_(on), device_(device) {
  if (on_) ops::set_kernel_profiling(true);
}

StepProfile::~StepProfile() {
  if (on_) ops::set_kernel_profiling(false);
}

void StepProfile::begin_step() {
  if (on_) ops::reset_kernel_profile();
}

void StepProfile::end_step(double seconds) {
  if (!on_) return;
  if (std::exchange(first_, false)) return;
  ++steps_;
  seconds_ += seconds;
  for (const ops::KernelTime& k : ops::kernel_profile()) {
    auto it =
        std::find_if(rows_.begin(), rows_.end(), [&](const Row& r) { return r.name == k.name; });
    if (it == rows_.end()) it = rows_.insert(rows_.end(), Row{std::string(k.name)});
    it->calls += double(k.calls);
    it->seconds += k.seconds;
  }
  std::sort(rows_.begin(), rows_.end(),
            [](const Row& a, const Row& b) { return a.seconds > b.seconds; });
}

void StepProfile::report(const std::string& path, int64_t rank, int64_t world,
                         const Gather& gather) const {
  if (!on_ || steps_ == 0) return;
  const double n = double(steps_), step_ms = seconds_ / n * 1e3;
  double kernels_s = 0;
  for (const Row& r : rows_) kernels_s += r.seconds;
  const double outside_ms = (seconds_ - kernels_s) / n * 1e3;
  const char* isa = ops::cpu_isa_name(ops::active_cpu_isa());
  const bool cpu = device_ == kHost;
  const std::string who = world > 1 ? fmt::format("rank {} of {}, ", rank, world) : "";
  const std::string head =
      fmt::format("profile ({}{} kernels): mean of {} step(s) after the first, {:.1f} ms per step",
                  who, cpu ? isa : device_name(device_), steps_, step_ms);
  // One process: the heading in the log. Several: each rank's heading in
  // its table (the log speaks for rank 0 alone).
  if (world == 1) NK_INFO("{}", head);
  std::string table = (world == 1 ? "" : head + "\n") +
                      fmt::format("  {:<32} {:>10} {:>10} {:>7}\n",
                                  cpu ? "kernel (self time)" : "kernel (device time)", "calls/step",
                                  "ms/step", "share");
  nlohmann::json kernels = nlohmann::json::array();
  for (const Row& r : rows_) {
    const double ms = r.seconds / n * 1e3;
    table += fmt::format("  {:<32} {:>10.1f} {:>10.2f} {:>6.1f}%\n", r.name, r.calls / n, ms,
                         100 * ms / step_ms);
    kernels.push_back({{"name", r.name},
                       {"calls_per_step", r.calls / n},
                       {"ms_per_step", ms},
                       {"share", ms / step_ms}});
  }
  table += fmt::format("  {:<32} {:>10} {:>10.2f} {:>6.1f}%", "outside kernels", "", outside_ms,
                       100 * outside_ms / step_ms);
  if (gather) {
    const std::vector<std::string> tables = gather(table);
    if (rank == 0)
      for (const std::string& t : tables) fmt::print("{}\n", t);
  } else {
    fmt::print("{}\n", table);
  }
  std::fflush(stdout);
  if (path.empty()) return;
  nlohmann::json j = {{"device", device_name(device_)},
                      {"cpu_isa", isa},
                      {"steps", steps_},
                      {"step_ms", step_ms},
                      {"kernels", kernels},
                      {"outside_kernels_ms", outside_ms}};
  if (world > 1) j["rank"] = rank, j["world"] = world;
  write_file_atomic(path, j.dump(1) + "\n");
}

}  // namespace nk
