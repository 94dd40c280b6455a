#include "apps/host_load.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <sstream>

namespace nk {

namespace {

double rusage_s(int who) {
  rusage u{};
  ::getrusage(who, &u);
  return double(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * double(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

}  // namespace

HostCpuSample sample_host_cpu() {
  HostCpuSample s;
  s.wall_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
  s.own_s = rusage_s(RUSAGE_SELF) + rusage_s(RUSAGE_CHILDREN);
  std::ifstream f("/proc/stat");
  const double hz = double(std::max(1L, ::sysconf(_SC_CLK_TCK)));
  int cores = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("cpu ", 0) == 0) {
      // user nice system idle iowait irq softirq steal ...
      std::istringstream in(line.substr(4));
      double v[8] = {0};
      for (double& x : v) in >> x;
      if (!in.fail()) {
        s.busy_s = (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / hz;
        s.ok = true;
      }
    } else if (line.rfind("cpu", 0) == 0) {
      ++cores;
    }
  }
  s.cores = std::max(1, cores);
  return s;
}

double others_cpu_share(const HostCpuSample& a, const HostCpuSample& b) {
  const double wall = b.wall_s - a.wall_s;
  if (!a.ok || !b.ok || wall <= 0) return 0;
  const double others = (b.busy_s - a.busy_s) - (b.own_s - a.own_s);
  return std::clamp(others / (wall * double(b.cores)), 0.0, 1.0);
}

std::string load_averages() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "";
  return a + " " + b + " " + c;
}

}  // namespace nk
