// How busy this host was with other work while a command's children ran:
// the timing runs of `nekton autoconfig` are only as good as the cores they
// got, and on a shared host the rest of the load is the main source of error.
//
//   HostCpuSample a = sample_host_cpu();
//   ... run_child(...) ...              // children waited for
//   HostCpuSample b = sample_host_cpu();
//   others_cpu_share(a, b)              // 0.3: others used 30 % of the cores
//
// The host's busy CPU time (/proc/stat's cpu line: user, nice, system, irq,
// softirq, steal) less this process's and its waited-for children's
// (getrusage), over the wall time times the cores /proc/stat lists.
#pragma once
#include <string>

namespace nk {

struct HostCpuSample {
  double busy_s = 0;  // all processes', since boot
  double own_s = 0;   // this process's and its waited-for descendants'
  double wall_s = 0;  // steady clock
  int cores = 1;      // cpuN lines of /proc/stat
  bool ok = false;    // /proc/stat was readable
};

HostCpuSample sample_host_cpu();
// In [0, 1]; 0 when either sample is not ok or no time passed.
double others_cpu_share(const HostCpuSample& a, const HostCpuSample& b);
// /proc/loadavg's 1, 5 and 15 minute averages ("1.94 1.83 1.77"; "" if unreadable).
std::string load_averages();

}  // namespace nk
