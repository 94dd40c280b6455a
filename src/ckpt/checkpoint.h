// Native training checkpoints: everything a run needs to continue bit for bit.
//
// Layout under a run's checkpoint root (OUT/checkpoints):
//
//   step_00000200/
//     model.safetensors      f32 master weights, one tensor per parameter
//     optimizer.safetensors  optimizer state (AdamW: exp_avg.NAME, exp_avg_sq.NAME), or
//     optimizer.00000-of-00004.safetensors ...  a sharded run's state: each rank's
//                            file holds 1-D pieces of the same tensors (FlatPiece);
//     model.00000-of-00004.safetensors ...      and, with sharded weights (FSDP),
//                            pieces of the weights instead of model.safetensors
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
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "ckpt/safetensors.h"
#include "nn/param_layout.h"

namespace nk {

class LoadProgress;  // ckpt/load_progress.h

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

// Elements [begin, end) of a tensor of `global_shape`, flattened row-major:
// how a distributed optimizer's state shard cuts a parameter.
struct FlatPiece {
  Shape global_shape;
  int64_t begin = 0, end = 0;
};

// One rank's file of a sharded save: 1-D pieces, at most one per tensor.
struct CheckpointShard {
  std::string file;  // checkpoint_shard_file("optimizer" or "model", rank, world)
  std::vector<std::pair<std::string, Tensor>> tensors;
  std::map<std::string, FlatPiece> pieces;  // by tensor name: what each holds
  std::map<std::string, std::string> metadata;
};
// "optimizer.00001-of-00004.safetensors".
std::string checkpoint_shard_file(const std::string& stem, int64_t rank, int64_t world);

// A save by several processes (a sharded run), in this order:
//  1. every rank: tmp = shared_checkpoint_tmp(root, step, token), `token` the
//     same on every rank (rank 0's process id);
//  2. rank 0: prepare_shared_checkpoint(root, tmp); then every rank waits for it;
//  3. every rank: record = write_checkpoint_shard(tmp, shard): the file is
//     durable on return, and `record` (JSON text) describes it for the manifest;
//  4. rank 0, holding every rank's record (so every shard is durable):
//     finish_shared_checkpoint writes rank 0's CheckpointContents (its
//     `optimizer` left empty, and `model` too when there are model shards)
//     and the manifest over all files, then installs step_N and `latest` as
//     save_checkpoint does.
std::string shared_checkpoint_tmp(const std::string& root, int64_t step, int64_t token);
void prepare_shared_checkpoint(const std::string& root, const std::string& tmp);
std::string write_checkpoint_shard(const std::string& tmp, const CheckpointShard& shard);
std::string finish_shared_checkpoint(const std::string& root, const std::string& tmp,
                                     const CheckpointContents& c,
                                     const std::vector<std::string>& records, int64_t keep);

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
  // Ranks that wrote it: 1, or the world size of a sharded save.
  int64_t world_size() const { return world_; }
  // A sharded save's optimizer files (empty: optimizer.safetensors holds the
  // state whole) and, for sharded weights (FSDP), its model files (empty:
  // model.safetensors), each with the piece every tensor of it holds.
  struct Shard {
    std::string file;
    std::map<std::string, FlatPiece> pieces;
  };
  const std::vector<Shard>& optimizer_shards() const { return optimizer_shards_; }
  const std::vector<Shard>& model_shards() const { return model_shards_; }

 private:
  std::string dir_;
  int64_t step_ = 0, world_ = 1;
  std::vector<Shard> optimizer_shards_, model_shards_;
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
// matching views of `flat` (f32 [layout.total()]; f32 or bf16 tensors in the
// file, bf16 ones widened: optim.moment_dtype=bf16 moments). Checks every tensor's
// presence, dtype and shape, and that the file holds no other `prefix` tensors,
// before reading any: nk::Error naming the file, the tensor and both shapes.
// `progress` (optional) advances by each tensor's bytes (flat_tensor_read_bytes).
void read_flat_tensors(const SafetensorsFile& file, const ParamLayout& layout,
                       const std::string& prefix, Tensor& flat, LoadProgress* progress = nullptr);
// The same for rank `rank` of an n-way tensor-parallel model, or a pipeline
// stage: the file holds `layout`'s whole tensors (checked as above), `flat`
// is laid out by `local` (some of them, each split n ways:
// ParamLayout::subset, ParamLayout::shard), and only this rank's slices of
// those are read.
void read_flat_tensor_shards(const SafetensorsFile& file, const ParamLayout& layout,
                             const std::string& prefix, const ParamLayout& local, int64_t rank,
                             int64_t n, Tensor& flat, LoadProgress* progress = nullptr);
// The same, each tensor's slices handed to `target` (p: the local
// parameter): called first with an undefined tensor, it returns the f32
// tensor of p's shape to read into (a view of an arena), or an undefined one,
// and is then called again with a scratch f32 tensor holding the values,
// valid for that call only (to keep a base in another dtype or NF4,
// Transformer::set_param).
using ShardTarget = std::function<Tensor(const ParamInfo& p, const Tensor& values)>;
void read_tensor_shards(const SafetensorsFile& file, const ParamLayout& layout,
                        const std::string& prefix, const ParamLayout& local, int64_t rank,
                        int64_t n, const ShardTarget& target, LoadProgress* progress = nullptr);
// The file bytes the three above read for `local`'s tensors (a slice counts its
// share of its tensor's bytes; tensors the file lacks count nothing): the
// total of a load's progress line (ckpt/load_progress.h).
double flat_tensor_read_bytes(const SafetensorsFile& file, const ParamLayout& local,
                              const std::string& prefix);

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
