#include "ckpt/load_progress.h"

#include <atomic>

namespace nk {

namespace {
std::atomic<ProgressMode> g_load_progress_mode{ProgressMode::Auto};
}  // namespace

void set_load_progress_mode(ProgressMode mode) {
  g_load_progress_mode = mode;
}

ProgressMode load_progress_mode() {
  return g_load_progress_mode;
}

LoadProgress::LoadProgress(const std::string& what, double total_bytes) {
  if (load_progress_mode() == ProgressMode::None) return;
  bar_.emplace("loading " + what, load_progress_mode());
  bar_->start(total_bytes, "B");
}

void LoadProgress::advance(double bytes) {
  if (bar_) bar_->advance(bytes);
}

void LoadProgress::finish() {
  if (bar_) bar_->finish();
}

}  // namespace nk
