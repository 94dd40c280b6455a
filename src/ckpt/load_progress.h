// Progress of reading a model or checkpoint's tensors (issue 42, item 4:
// checkpoint loading): saved models and their safetensors, GGUF files and
// training checkpoints. On a terminal one updating line,
//   loading runs/a/model.safetensors [######....]  37.5%  120.0/320.0 MB  85.2 MB/s  ETA 0:02
// ended at 100 %; elsewhere (a pipe, a log) a plain "[info]" line every 10 s
// of a long load and none for a short one (core/progress.h).
//
// The mode is the process's (set_load_progress_mode): Auto unless a command
// or a rank that should stay quiet (not rank 0 of a run) sets it.
#pragma once
#include <optional>
#include <string>

#include "core/progress.h"

namespace nk {

void set_load_progress_mode(ProgressMode mode);
ProgressMode load_progress_mode();

class LoadProgress {
 public:
  // `what`: the file or folder read; `total_bytes`: the tensor bytes it will read.
  LoadProgress(const std::string& what, double total_bytes);
  void advance(double bytes);
  // All read: the bar's last line at 100 % (nothing in a pipe). Not called
  // when the load fails: the open line is ended and the error follows.
  void finish();

 private:
  std::optional<Progress> bar_;  // none when the mode is None
};

}  // namespace nk
