#include "apps/plot_chart.h"

#include <cairo-svg.h>
#include <cairo.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <memory>

#include "core/atomic_file.h"
#include "core/error.h"

namespace nk {
namespace {

namespace fs = std::filesystem;

struct Rgb {
  double r, g, b;
};
// Distinguishable colours for up to ten runs (then they repeat).
constexpr Rgb kPalette[] = {{0.12, 0.47, 0.71}, {1.00, 0.50, 0.05}, {0.17, 0.63, 0.17},
                            {0.84, 0.15, 0.16}, {0.58, 0.40, 0.74}, {0.55, 0.34, 0.29},
                            {0.89, 0.47, 0.76}, {0.50, 0.50, 0.50}, {0.74, 0.74, 0.13},
                            {0.09, 0.75, 0.81}};

struct Box {
  double x, y, w, h;
};

std::string tick_label(double v, double step) {
  if (v == 0) return "0";
  const double a = std::fabs(v);
  if (a >= 1e5 || a < 1e-3) return fmt::format("{:.2g}", v);
  // Enough decimals to tell neighbouring ticks apart.
  const int decimals = std::max(0, int(std::ceil(-std::log10(step) - 1e-9)));
  return fmt::format("{:.{}f}", v, decimals);
}

void text_at(cairo_t* cr, const std::string& s, double x, double y, double align_x,
             double align_y) {
  cairo_text_extents_t e;
  cairo_text_extents(cr, s.c_str(), &e);
  cairo_move_to(cr, x - align_x * e.width - e.x_bearing, y - align_y * e.height - e.y_bearing);
  cairo_show_text(cr, s.c_str());
}

void draw_panel(cairo_t* cr, const std::vector<RunMetrics>& runs, const std::string& metric,
                bool log_y, Box b) {
  // Data range over every run's curve of this metric.
  double x0 = std::numeric_limits<double>::infinity(), x1 = -x0, y0 = x0, y1 = -x0;
  auto fy = [&](double v) { return log_y ? std::log10(v) : v; };
  for (const RunMetrics& r : runs) {
    auto it = r.series.find(metric);
    if (it == r.series.end()) continue;
    for (auto [x, y] : it->second) {
      if (log_y && y <= 0) continue;
      x0 = std::min(x0, x), x1 = std::max(x1, x);
      y0 = std::min(y0, fy(y)), y1 = std::max(y1, fy(y));
    }
  }
  if (!std::isfinite(x0)) return;
  if (x1 == x0) x0 -= 1, x1 += 1;
  const double xpad = (x1 - x0) * 0.02;  // the first and last points' dots inside
  x0 -= xpad, x1 += xpad;
  if (y1 == y0)
    y0 -= std::max(1e-3, std::fabs(y0) * 0.05), y1 += std::max(1e-3, std::fabs(y1) * 0.05);
  const double pad = (y1 - y0) * 0.05;
  y0 -= pad, y1 += pad;

  const Box a{b.x + 72, b.y + 30, b.w - 72 - 16, b.h - 30 - 46};  // the plot area
  auto px = [&](double x) { return a.x + (x - x0) / (x1 - x0) * a.w; };
  auto py = [&](double y) { return a.y + a.h - (y - y0) / (y1 - y0) * a.h; };

  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_BOLD);
  cairo_set_font_size(cr, 14);
  cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
  text_at(cr, metric + (log_y ? " (log scale)" : ""), a.x + a.w / 2, b.y + 8, 0.5, 0);
  cairo_select_font_face(cr, "sans-serif", CAIRO_FONT_SLANT_NORMAL, CAIRO_FONT_WEIGHT_NORMAL);
  cairo_set_font_size(cr, 11);

  // Grid lines and tick labels.
  cairo_set_line_width(cr, 1);
  const std::vector<double> xt = nice_ticks(x0, x1, std::max(2, int(a.w / 90)));
  const std::vector<double> yt = nice_ticks(y0, y1, std::max(2, int(a.h / 50)));
  const double xstep = xt.size() > 1 ? xt[1] - xt[0] : 1, ystep = yt.size() > 1 ? yt[1] - yt[0] : 1;
  for (double t : xt) {
    cairo_set_source_rgb(cr, 0.90, 0.90, 0.90);
    cairo_move_to(cr, std::round(px(t)) + 0.5, a.y);
    cairo_line_to(cr, std::round(px(t)) + 0.5, a.y + a.h + 4);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    text_at(cr, tick_label(t, xstep), px(t), a.y + a.h + 8, 0.5, 0);
  }
  for (double t : yt) {
    cairo_set_source_rgb(cr, 0.90, 0.90, 0.90);
    cairo_move_to(cr, a.x - 4, std::round(py(t)) + 0.5);
    cairo_line_to(cr, a.x + a.w, std::round(py(t)) + 0.5);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
    const std::string label =
        log_y ? fmt::format("{:.3g}", std::pow(10.0, t)) : tick_label(t, ystep);
    text_at(cr, label, a.x - 7, py(t), 1, 0.5);
  }
  cairo_set_source_rgb(cr, 0.2, 0.2, 0.2);
  text_at(cr, "step", a.x + a.w / 2, b.y + b.h - 6, 0.5, 1);
  cairo_rectangle(cr, a.x + 0.5, a.y + 0.5, a.w, a.h);
  cairo_stroke(cr);

  // The curves, clipped to the plot area; sparse ones (validation) get dots.
  cairo_save(cr);
  cairo_rectangle(cr, a.x, a.y, a.w, a.h);
  cairo_clip(cr);
  cairo_set_line_width(cr, 1.8);
  cairo_set_line_join(cr, CAIRO_LINE_JOIN_ROUND);
  std::vector<std::pair<std::string, Rgb>> legend;
  for (size_t i = 0; i < runs.size(); ++i) {
    auto it = runs[i].series.find(metric);
    if (it == runs[i].series.end()) continue;
    const Rgb c = kPalette[i % std::size(kPalette)];
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    bool first = true;
    for (auto [x, y] : it->second) {
      if (log_y && y <= 0) continue;
      if (first)
        cairo_move_to(cr, px(x), py(fy(y)));
      else
        cairo_line_to(cr, px(x), py(fy(y)));
      first = false;
    }
    cairo_stroke(cr);
    if (it->second.size() <= 50)
      for (auto [x, y] : it->second) {
        if (log_y && y <= 0) continue;
        cairo_arc(cr, px(x), py(fy(y)), 3, 0, 2 * M_PI);
        cairo_fill(cr);
      }
    legend.emplace_back(runs[i].name, c);
  }
  cairo_restore(cr);

  // Legend: the top right corner of the plot area.
  double wmax = 0;
  for (const auto& [name, c] : legend) {
    cairo_text_extents_t e;
    cairo_text_extents(cr, name.c_str(), &e);
    wmax = std::max(wmax, e.x_advance);
  }
  const double lw = wmax + 40, lh = 18.0 * double(legend.size()) + 8;
  const double lx = a.x + a.w - lw - 8, ly = a.y + 8;
  cairo_set_source_rgba(cr, 1, 1, 1, 0.85);
  cairo_rectangle(cr, lx, ly, lw, lh);
  cairo_fill_preserve(cr);
  cairo_set_source_rgb(cr, 0.75, 0.75, 0.75);
  cairo_set_line_width(cr, 1);
  cairo_stroke(cr);
  for (size_t i = 0; i < legend.size(); ++i) {
    const double y = ly + 13 + 18.0 * double(i);
    const Rgb c = legend[i].second;
    cairo_set_source_rgb(cr, c.r, c.g, c.b);
    cairo_set_line_width(cr, 3);
    cairo_move_to(cr, lx + 6, y);
    cairo_line_to(cr, lx + 26, y);
    cairo_stroke(cr);
    cairo_set_source_rgb(cr, 0.1, 0.1, 0.1);
    text_at(cr, legend[i].first, lx + 32, y, 0, 0.5);
  }
}

}  // namespace

std::vector<double> nice_ticks(double lo, double hi, int target) {
  const double raw = (hi - lo) / std::max(1, target);
  if (!(raw > 0) || !std::isfinite(raw)) return {lo};
  const double mag = std::pow(10.0, std::floor(std::log10(raw)));
  double step = 10 * mag;
  for (double m : {1.0, 2.0, 5.0})
    if (m * mag >= raw) {
      step = m * mag;
      break;
    }
  std::vector<double> t;
  for (double v = std::ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step)
    t.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  return t;
}

namespace {

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s)
    o += c == '<'   ? "&lt;"
         : c == '>' ? "&gt;"
         : c == '&' ? "&amp;"
         : c == '"' ? "&quot;"
                    : std::string(1, c);
  return o;
}

// FILE.html: the SVG drawing inline in a page of its own (no script, no
// file beside it), titled with the metrics and listing the runs.
void write_html(const std::vector<RunMetrics>& runs, const ChartOptions& opt,
                const std::string& out) {
  const std::string svg_path = temporary_path(out) + ".svg";
  draw_chart(runs, opt, svg_path);
  std::ifstream f(svg_path, std::ios::binary);
  std::string svg((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::error_code ec;
  fs::remove(svg_path, ec);
  if (svg.rfind("<?xml", 0) == 0) svg.erase(0, svg.find("?>") + 2);  // not inside HTML
  std::string metrics, list;
  for (const std::string& m : opt.metrics) metrics += (metrics.empty() ? "" : ", ") + m;
  for (const RunMetrics& r : runs) list += "<li>" + html_escape(r.name) + "</li>\n";
  write_file_atomic(out, fmt::format("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta "
                                     "charset=\"utf-8\">\n<title>nekton plot: {}</title>\n"
                                     "</head>\n<body>\n<h1>{}</h1>\n{}\n<ul>\n{}</ul>\n"
                                     "</body>\n</html>\n",
                                     html_escape(metrics), html_escape(metrics), svg, list));
}

}  // namespace

void draw_chart(const std::vector<RunMetrics>& runs, const ChartOptions& opt,
                const std::string& out) {
  const std::string ext = fs::path(out).extension().string();
  if (ext == ".html") {
    if (opt.metrics.empty()) fail("nothing to plot: no metric given");
    return write_html(runs, opt, out);
  }
  if (ext != ".png" && ext != ".svg")
    fail("--out '{}': the image type comes from the extension, .png, .svg or .html", out);
  if (opt.metrics.empty()) fail("nothing to plot: no metric given");
  const std::string tmp = temporary_path(out);
  using Surface = std::unique_ptr<cairo_surface_t, decltype(&cairo_surface_destroy)>;
  Surface s(ext == ".png" ? cairo_image_surface_create(CAIRO_FORMAT_RGB24, opt.width, opt.height)
                          : cairo_svg_surface_create(tmp.c_str(), opt.width, opt.height),
            &cairo_surface_destroy);
  if (cairo_surface_status(s.get()) != CAIRO_STATUS_SUCCESS)
    fail("cannot write '{}': {}", out, cairo_status_to_string(cairo_surface_status(s.get())));
  cairo_t* cr = cairo_create(s.get());
  cairo_set_source_rgb(cr, 1, 1, 1);
  cairo_paint(cr);
  const int n = int(opt.metrics.size()), cols = std::min(n, 2), rows = (n + cols - 1) / cols;
  const double pw = double(opt.width) / cols, ph = double(opt.height) / rows;
  for (int i = 0; i < n; ++i)
    draw_panel(cr, runs, opt.metrics[size_t(i)], opt.log_y,
               {pw * (i % cols), ph * (i / cols), pw, ph});
  const cairo_status_t st = cairo_status(cr);
  cairo_destroy(cr);
  cairo_status_t written = st;
  if (st == CAIRO_STATUS_SUCCESS) {
    if (ext == ".png")
      written = cairo_surface_write_to_png(s.get(), tmp.c_str());
    else
      cairo_surface_finish(s.get()), written = cairo_surface_status(s.get());
  }
  s.reset();
  std::error_code ec;
  if (written != CAIRO_STATUS_SUCCESS) {
    fs::remove(tmp, ec);
    fail("cannot write '{}': {}", out, cairo_status_to_string(written));
  }
  fs::rename(tmp, out, ec);
  if (ec) {
    fs::remove(tmp, ec);
    fail("cannot write '{}': {}", out, ec.message());
  }
}

}  // namespace nk
