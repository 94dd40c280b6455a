// Line charts of training metrics through cairo (Debian's libcairo2): one
// panel per metric in a grid of up to two columns, one curve per run in a
// colour of its own, axes with ticks, a legend of the runs' names. PNG or SVG
// by the output's extension; written atomically.
#pragma once
#include <string>
#include <vector>

#include "apps/metrics_series.h"

namespace nk {

struct ChartOptions {
  std::vector<std::string> metrics;  // a panel each, in order
  int width = 1000, height = 450;    // pixels (PNG) or points (SVG), the whole image
  bool log_y = false;                // logarithmic value axis (values <= 0 left out)
};

// Draws `runs` into `out` (FILE.png, FILE.svg, or FILE.html: the SVG inline
// in a self-contained page, no script); nk::Error naming `out` for another
// extension or a failed write.
void draw_chart(const std::vector<RunMetrics>& runs, const ChartOptions& opt,
                const std::string& out);

// Tick positions from lo to hi at a step of 1, 2 or 5 times a power of ten,
// about `target` of them.
std::vector<double> nice_ticks(double lo, double hi, int target);

}  // namespace nk
