// nekton plot: runs' metrics.jsonl drawn as a PNG (read back through cairo:
// its size, and each run's curve colour present) or an SVG of the size
// asked; a missing, empty or malformed metrics file is an error naming the
// file and line, and leaves no image behind.
#include <cairo.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "apps/plot_chart.h"
#include "test_util.h"

namespace nk {
namespace {

using test::contains;
using test::TempDir;
namespace fs = std::filesystem;

// A run folder with `steps` records: a decaying loss, val_loss every 5 steps.
std::string write_run(const TempDir& d, const std::string& name, int steps, double scale) {
  fs::create_directories(d / name);
  std::string text;
  for (int s = 1; s <= steps; ++s) {
    text += fmt::format(R"({{"step": {}, "loss": {}, "val_loss": {}, "lr": {}, "mfu": 0.5}})", s,
                        scale * (2 + std::exp(-0.1 * s)),
                        s % 5 ? "null" : fmt::format("{}", scale * (2.1 + std::exp(-0.1 * s))),
                        1e-3 * s / steps);
    text += "\n";
  }
  test::write_file(d / (name + "/metrics.jsonl"), text);
  return d / name;
}

// Pixels of `png` within a small distance of the colour (r, g, b), 0-255.
int64_t pixels_of(const std::string& png, int r, int g, int b, int* w = nullptr, int* h = nullptr) {
  cairo_surface_t* s = cairo_image_surface_create_from_png(png.c_str());
  EXPECT_EQ(cairo_surface_status(s), CAIRO_STATUS_SUCCESS) << png;
  const int width = cairo_image_surface_get_width(s), height = cairo_image_surface_get_height(s);
  if (w) *w = width;
  if (h) *h = height;
  const int stride = cairo_image_surface_get_stride(s);
  const unsigned char* data = cairo_image_surface_get_data(s);
  int64_t n = 0;
  for (int y = 0; data && y < height; ++y)
    for (int x = 0; x < width; ++x) {
      const uint32_t px = *reinterpret_cast<const uint32_t*>(data + y * stride + x * 4);
      const int pr = int(px >> 16 & 0xFF), pg = int(px >> 8 & 0xFF), pb = int(px & 0xFF);
      n += std::abs(pr - r) + std::abs(pg - g) + std::abs(pb - b) < 30;
    }
  cairo_surface_destroy(s);
  return n;
}

TEST(PlotCli, TwoRunsAsAPng) {
  TempDir d("nk_plot");
  const std::string a = write_run(d, "small-lr", 60, 1.0), b = write_run(d, "big-lr", 40, 1.3);
  const std::string png = d / "loss.png";
  auto r = test::run_nekton("plot " + a + " " + b + " --out " + png + " --width 800 --height 300");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_EQ(test::read_file(png).substr(0, 8), "\x89PNG\r\n\x1a\n");
  int w = 0, h = 0;
  // The first two colours of the palette: one curve per run.
  EXPECT_GT(pixels_of(png, 31, 120, 181, &w, &h), 200);
  EXPECT_GT(pixels_of(png, 255, 127, 13), 200);
  EXPECT_EQ(w, 800);
  EXPECT_EQ(h, 300);
  EXPECT_TRUE(test::leftover_files(d.path().string()).empty());

  // One run: its colour only.
  r = test::run_nekton("plot " + a + " --out " + png);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_GT(pixels_of(png, 31, 120, 181, &w, &h), 200);
  EXPECT_EQ(pixels_of(png, 255, 127, 13), 0);
  EXPECT_EQ(w, 1000);  // the default size
  EXPECT_EQ(h, 450);
}

TEST(PlotCli, NamedMetricsAsAnSvg) {
  TempDir d("nk_plot");
  const std::string a = write_run(d, "a", 30, 1.0);
  const std::string svg = d / "m.svg";
  auto r = test::run_nekton("plot " + a + " --metric lr,mfu --metric loss --out " + svg +
                            " --width 640 --height 480");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(contains(r.out, "plot: lr, mfu, loss of 1 run")) << r.out;
  const std::string text = test::read_file(svg);
  EXPECT_EQ(text.rfind("<?xml", 0), 0u);
  EXPECT_TRUE(contains(text, R"(width="640pt" height="480pt")")) << text.substr(0, 300);
  EXPECT_TRUE(contains(text, "</svg>"));
  EXPECT_TRUE(contains(text, "<path")) << "no curve drawn";
}

TEST(PlotCli, TwoRunsAsASelfContainedHtmlPage) {
  TempDir d("nk_plot");
  const std::string a = write_run(d, "run_a", 30, 1.0), b = write_run(d, "run_b<2>", 20, 2.0);
  const std::string html = d / "p.html";
  auto r = test::run_nekton("plot " + a + " '" + b + "' --out " + html);
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string text = test::read_file(html);
  EXPECT_EQ(text.rfind("<!DOCTYPE html>", 0), 0u) << text.substr(0, 200);
  EXPECT_TRUE(contains(text, "<title>nekton plot: loss, val_loss</title>"));
  EXPECT_TRUE(contains(text, "<svg")) << "the drawing is not inline";
  EXPECT_TRUE(contains(text, "</svg>"));
  EXPECT_TRUE(contains(text, "<path")) << "no curve drawn";
  EXPECT_FALSE(contains(text, "<?xml")) << "an XML prologue inside HTML";
  EXPECT_FALSE(contains(text, "<script")) << "a page that runs code";
  EXPECT_FALSE(contains(text, "src=\"")) << "a page that loads a file";
  EXPECT_TRUE(contains(text, "<li>run_a</li>"));
  EXPECT_TRUE(contains(text, "<li>run_b&lt;2&gt;</li>")) << "a run's name not escaped";
  EXPECT_TRUE(text.ends_with("</html>\n"));
  EXPECT_FALSE(fs::exists(html + ".svg"));
}

TEST(PlotCli, BadInputIsNamed) {
  TempDir d("nk_plot");
  const std::string out = d / "x.png";
  auto expect_error = [&](const std::string& args, const std::string& part) {
    auto r = test::run_nekton("plot " + args + " --out " + out);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_TRUE(contains(r.out, part)) << r.out;
    EXPECT_FALSE(fs::exists(out)) << args;
  };
  expect_error(d / "absent", fmt::format("'{}' not found", d / "absent"));
  fs::create_directories(d / "no_metrics");
  expect_error(d / "no_metrics", fmt::format("'{}' not found", d / "no_metrics/metrics.jsonl"));
  fs::create_directories(d / "empty");
  test::write_file(d / "empty/metrics.jsonl", "");
  expect_error(d / "empty", fmt::format("'{}' is empty", d / "empty/metrics.jsonl"));
  fs::create_directories(d / "bad");
  test::write_file(d / "bad/metrics.jsonl", "{\"step\": 1, \"loss\": 2}\n{\"step\": 2, loss\n");
  expect_error(d / "bad", fmt::format("{}:2: not a JSON object", d / "bad/metrics.jsonl"));
  test::write_file(d / "bad/metrics.jsonl", "{\"step\": 1, \"loss\": 2}\n\n{\"loss\": 2}\n");
  expect_error(d / "bad", fmt::format("{}:3: no numeric \"step\"", d / "bad/metrics.jsonl"));
  const std::string a = write_run(d, "a", 10, 1.0);
  expect_error(a + " --metric nope", "--metric nope: no run logged it (they log: loss, lr, mfu");
  auto r = test::run_nekton("plot " + a + " --out " + (d / "x.jpg"));
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, fmt::format("--out '{}': the image type", d / "x.jpg"))) << r.out;
  r = test::run_nekton("plot --out " + out);
  EXPECT_NE(r.code, 0);
  EXPECT_TRUE(contains(r.out, "plot: no RUN_DIR given")) << r.out;
}

TEST(PlotCli, ARecordStillBeingWrittenIsSkipped) {
  TempDir d("nk_plot");
  const std::string a = write_run(d, "live", 10, 1.0);
  test::write_file(a + "/metrics.jsonl",
                   test::read_file(a + "/metrics.jsonl") + "{\"step\": 11, \"lo");
  auto r = test::run_nekton("plot " + a + " --out " + (d / "p.png"));
  EXPECT_EQ(r.code, 0) << r.out;
}

TEST(PlotChart, NiceTicks) {
  EXPECT_EQ(nice_ticks(0, 100, 5), (std::vector<double>{0, 20, 40, 60, 80, 100}));
  EXPECT_EQ(nice_ticks(2.93, 5.61, 6), (std::vector<double>{3, 3.5, 4, 4.5, 5, 5.5}));
  EXPECT_EQ(nice_ticks(-1, 1, 4), (std::vector<double>{-1, -0.5, 0, 0.5, 1}));
}

}  // namespace
}  // namespace nk
