#include "core/progress.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>

#include "core/error.h"

namespace nk {

ProgressMode parse_progress_mode(const std::string& value, const std::string& key) {
  if (value == "auto") return ProgressMode::Auto;
  if (value == "bar") return ProgressMode::Bar;
  if (value == "log") return ProgressMode::Log;
  if (value == "none") return ProgressMode::None;
  fail("{}: expected auto, bar, log or none, got '{}'", key, value);
}

Progress::Progress(std::string label, ProgressMode mode, double log_every_s, FILE* out)
    : label_(std::move(label)), mode_(mode), out_(out ? out : stderr) {
  if (mode_ == ProgressMode::Auto)
    mode_ = ::isatty(::fileno(out_)) ? ProgressMode::Bar : ProgressMode::Log;
  every_s_ = mode_ == ProgressMode::Bar ? 0.25 : log_every_s;
}

Progress::~Progress() {
  end_line();
}

void Progress::end_line() {
  std::lock_guard<std::mutex> lock(mu_);
  if (open_) {
    std::fputs("\n", out_);
    std::fflush(out_);
    open_ = false;
  }
}

void Progress::start(double total, std::string unit) {
  std::lock_guard<std::mutex> lock(mu_);
  total_ = total;
  unit_ = std::move(unit);
  done_ = 0;
  t0_ = Clock::now();
  last_ = {};
}

void Progress::advance(double n) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ += n;
  maybe_draw();
}

void Progress::set_done(double done) {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = done;
  maybe_draw();
}

void Progress::maybe_draw() {
  if (mode_ == ProgressMode::None) return;
  const auto now = Clock::now();
  if (std::chrono::duration<double>(now - last_).count() < every_s_) return;
  // Log mode's first line waits a whole interval: short work prints nothing.
  if (mode_ == ProgressMode::Log && std::chrono::duration<double>(now - t0_).count() < every_s_)
    return;
  last_ = now;
  draw(counted_text(), false);
}

void Progress::finish() {
  std::lock_guard<std::mutex> lock(mu_);
  done_ = std::max(done_, total_);  // padding or rounding left out of the counts
  if (mode_ == ProgressMode::Bar && total_ > 0) draw(counted_text(), true);
}

void Progress::show(const std::string& text, bool final) {
  std::lock_guard<std::mutex> lock(mu_);
  if (mode_ == ProgressMode::None) return;
  const auto now = Clock::now();
  // Callers that pace themselves at every_s() are not dropped for a late tick.
  if (!final && std::chrono::duration<double>(now - last_).count() < 0.9 * every_s_) return;
  last_ = now;
  draw(text, final);
}

void Progress::draw(const std::string& text, bool final) {
  if (mode_ == ProgressMode::Bar) {
    // \x1b[K clears what a longer previous line left to the right.
    fmt::print(out_, "\r{} {}\x1b[K{}", label_, text, final ? "\n" : "");
    open_ = !final;
  } else if (mode_ == ProgressMode::Log) {
    fmt::print(out_, "[info] {} {}\n", label_, text);
  }
  std::fflush(out_);
}

std::string Progress::counted_text() const {
  const double secs = std::max(1e-9, std::chrono::duration<double>(Clock::now() - t0_).count());
  const double frac = total_ > 0 ? std::clamp(done_ / total_, 0.0, 1.0) : 0.0;
  const bool bytes = unit_ == "B";
  const double scale = bytes ? 1e-6 : 1.0;
  const std::string u = bytes ? "MB" : unit_;
  const std::string amount = bytes
                                 ? fmt::format("{:.1f}/{:.1f} {}", done_ * scale, total_ * scale, u)
                                 : fmt::format("{:.0f}/{:.0f} {}", done_, total_, u);
  const std::string eta = frac >= 1  ? "done"
                          : frac > 0 ? format_eta(secs * (1 - frac) / frac)
                                     : "?";
  return fmt::format("{} {:5.1f}%  {}  {:.1f} {}/s  ETA {}", progress_bar(frac, 24), 100 * frac,
                     amount, done_ * scale / secs, u, eta);
}

std::string progress_bar(double fraction, int width) {
  const int filled = int(std::clamp(fraction, 0.0, 1.0) * width + 0.5);
  std::string bar(size_t(width) + 2, '.');
  bar.front() = '[';
  bar.back() = ']';
  std::fill_n(bar.begin() + 1, filled, '#');
  return bar;
}

std::string format_eta(double seconds) {
  const int64_t t = int64_t(std::max(0.0, seconds) + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{}:{:02}", t / 60, t % 60);
}

}  // namespace nk
