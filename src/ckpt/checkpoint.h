// Native training checkpoints: everything a run needs to continue bit for bit.
//
// Layout under a run's checkpoint root (OUT/checkpoints):
//
//   step_00000200/
//     model.safetensors      f32 master weights, one tensor per parameter
//     optimizer.safetensors  optimizer state (AdamW: exp_avg.NAME, exp_avg_sq.NAME)
//     trainer_state.json     step, samples consumed, RNG and LR-schedule position
//     config.yaml            the resolved run config
//     manifest.json          written last: size and XXH3-64 of every file above,
//                            and per tensor its global shape and the slice this
//                            rank holds (offsets + shape; today rank 0 of 1),
//                            and for parameters their tensor-parallel split,
//                            fused parts and held ranges (nn/param_layout.h)
//   latest                   "step_00000200": the newest complete checkpoint
//
// Saving writes a hidden sibling folder (.tmp.step_N.PID), fsyncs its files and
// the folder, renames it to step_N, fsyncs the root and then replaces `latest`
// atomically; a kill at any moment leaves the previous checkpoints intact and
// never a half-written step_N. Loading verifies every checksum first and reads
// into fresh buffers, so a bad checkpoint loads nothing.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"
#include "nn/param_layout.h"

namespace nk {

// What one save writes. Tensors are written in order without copies (they must
// be contiguous CPU views and stay alive during the call).
struct CheckpointContents {
  int64_t step = 0;
  std::vector<std::pair<std::string, Tensor>> model, optimizer;
  std::map<std::string, std::string> optimizer_metadata;  // optimizer.safetensors __metadata__
  std::map<std::string, std::string> text_files;          // e.g. "config.yaml" -> YAML
  // The layout entry of each parameter-shaped tensor (weights, optimizer
  // moments), by file tensor name: the manifest records its tensor-parallel
  // split, its fused parts and the ranges this rank holds (shard_ranges), so
  // a later load can reshard it. Tensors without one are recorded whole.
  std::map<std::string, const ParamInfo*> params;
};

// "step_00000200".
std::string checkpoint_name(int64_t step);

// Writes ROOT/step_N atomically (replacing an existing step_N by an atomic
// exchange), points ROOT/latest at it, then removes all but the newest `keep`
// checkpoints and any temporary folders a killed save left. Returns the folder.
// nk::Error naming the file on any write failure (nothing else is touched then).
std::string save_checkpoint(const std::string& root, const CheckpointContents& c, int64_t keep);

// Removes what a killed save, prune or `latest` update left under ROOT
// (temporary and trash folders, latest.tmp.*). Only one process saves into a
// checkpoint root at a time, so all of them are stale. save_checkpoint and
// recover_checkpoint_root call it.
void remove_stale_temporaries(const std::string& root);

// The complete-looking checkpoint folders under ROOT (step_ + 8 digits), newest
// (highest step) first; temporary and trash folders are not listed.
std::vector<std::string> list_checkpoints(const std::string& root);
// The step a checkpoint folder's name carries; -1 if it is not step_NNNNNNNN.
int64_t checkpoint_step(const std::string& dir);
// What ROOT/latest names ("" if absent or unreadable).
std::string read_latest_pointer(const std::string& root);

// A verified checkpoint folder: manifest present and valid, every file present
// with its recorded size and checksum. nk::Error naming the folder and file.
class CheckpointReader {
 public:
  static CheckpointReader open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  int64_t step() const { return step_; }
  std::string path(const std::string& file) const;  // DIR/file
  std::string text(const std::string& file) const;  // a (verified) small file's contents
  SafetensorsFile model() const { return SafetensorsFile::open(path("model.safetensors")); }
  SafetensorsFile optimizer() const { return SafetensorsFile::open(path("optimizer.safetensors")); }

 private:
  std::string dir_;
  int64_t step_ = 0;
};

// The newest checkpoint under ROOT that verifies. Each newer one that does not
// (incomplete, corrupt, missing files) is skipped with a warning naming the
// problem. nk::Error if ROOT has checkpoints but none verifies (with the newest
// one's problem); "" if ROOT has none.
std::string find_latest_checkpoint(const std::string& root);

// What a resuming run calls on its own checkpoint root: removes stale
// temporaries, finds the newest checkpoint that verifies (as above), and points
// `latest` at it (a kill between installing step_N and updating `latest`
// leaves the pointer one behind). Returns that folder, "" if ROOT has none.
std::string recover_checkpoint_root(const std::string& root);

// Reads file tensors `prefix + p.name` for every parameter of `layout` into the
// matching views of `flat` (f32 [layout.total()]). Checks every tensor's
// presence, dtype and shape, and that the file holds no other `prefix` tensors,
// before reading any: nk::Error naming the file, the tensor and both shapes.
void read_flat_tensors(const SafetensorsFile& file, const ParamLayout& layout,
                       const std::string& prefix, Tensor& flat);

// The named views of `flat` (f32 [layout.total()]) as `prefix + name` tensors.
std::vector<std::pair<std::string, Tensor>> flat_tensors(const ParamLayout& layout,
                                                         const Tensor& flat,
                                                         const std::string& prefix);

// Records in c.params the layout entry of every `prefix + name` tensor that
// flat_tensors(layout, ..., prefix) names (the layout must outlive c).
void describe_flat_tensors(CheckpointContents& c, const ParamLayout& layout,
                           const std::string& prefix);

// XXH3-64 of a file's bytes, as 16 hex digits; nk::Error naming an unreadable file.
std::string file_checksum(const std::string& path);

}  // namespace nk
