// nekton plot RUN_DIR [RUN_DIR...]: loss curves (or any logged metric) of one
// or several training runs, side by side, as a PNG, an SVG or a self-contained
// HTML page (the SVG inline).
#include <fmt/format.h>

#include <set>
#include <sstream>

#include "apps/arg_parser.h"
#include "apps/commands.h"
#include "apps/metrics_series.h"
#include "apps/plot_chart.h"
#include "core/error.h"
#include "core/log.h"

namespace nk {
namespace {

constexpr const char* kUsage =
    "usage: nekton plot RUN_DIR [RUN_DIR...] [--metric NAME ...]\n"
    "                   [--out FILE.png|FILE.svg|FILE.html]\n\n"
    "Draws the curves of the runs' metrics.jsonl (train.out_dir/metrics.jsonl, or the\n"
    "file itself), one panel per metric, one colour per run named in the legend.\n"
    "Default metrics: loss, and val_loss where a run logged it. Any numeric field of\n"
    "metrics.jsonl can be named: lr, grad_norm, tokens_per_s, mfu, peak_mem_bytes, ...\n";

}  // namespace

int cmd_plot(const CommandArgs& a) {
  CommandLine cl("plot", a.args, 0);
  std::vector<std::string> metrics;
  ChartOptions opt;
  std::string out = "plot.png";
  cl.bind("--metric", metrics,
          "metrics to draw, a panel each (several after one --metric, or comma-separated); "
          "default: loss and val_loss");
  cl.bind("--out", out,
          "the image: FILE.png, FILE.svg, or FILE.html (a page of its own with the SVG inline)");
  cl.bind("--width", opt.width, "image width in pixels (SVG: points)");
  cl.bind("--height", opt.height, "image height in pixels (SVG: points)");
  cl.bind("--log-y", opt.log_y, "logarithmic value axis");
  if (cl.help()) {
    fmt::print("{}", cl.help_text(kUsage));
    return 0;
  }
  const std::vector<std::string> dirs = cl.finish();
  if (dirs.empty()) fail("plot: no RUN_DIR given\n{}", kUsage);
  if (opt.width < 200 || opt.width > 20000 || opt.height < 150 || opt.height > 20000)
    fail("plot: --width and --height: between 200x150 and 20000x20000, got {}x{}", opt.width,
         opt.height);
  std::vector<RunMetrics> runs;
  for (const std::string& d : dirs) runs.push_back(read_run_metrics(d));
  for (const std::string& m : metrics) {
    std::istringstream in(m);
    for (std::string one; std::getline(in, one, ',');)
      if (!one.empty()) opt.metrics.push_back(one);
  }
  auto logged = [&](const std::string& m) {
    for (const RunMetrics& r : runs)
      if (r.series.count(m)) return true;
    return false;
  };
  if (opt.metrics.empty()) {
    opt.metrics = {"loss"};
    if (logged("val_loss")) opt.metrics.push_back("val_loss");
  }
  for (const std::string& m : opt.metrics)
    if (!logged(m)) {
      std::set<std::string> names;
      for (const RunMetrics& r : runs)
        for (const auto& [k, v] : r.series) names.insert(k);
      fail("plot: --metric {}: no run logged it (they log: {})", m, fmt::join(names, ", "));
    }
  draw_chart(runs, opt, out);
  NK_INFO("plot: {} of {} run{} in {}", fmt::join(opt.metrics, ", "), runs.size(),
          runs.size() == 1 ? "" : "s", out);
  return 0;
}

}  // namespace nk
