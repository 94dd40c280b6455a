#include "train/train_checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_io.h"
#include "ckpt/load_progress.h"
#include "ckpt/model_io.h"
#include "core/error.h"
#include "train/freeze.h"

namespace nk {

namespace {
constexpr const char* kExpAvg = "exp_avg.";
constexpr const char* kExpAvgSq = "exp_avg_sq.";
constexpr const char* kFrozen = "frozen";  // optimizer metadata; absent when nothing is frozen

// The trainable parameters alone: the layout of the optimizer state. Their
// offsets are those of the full layout, which puts them first.
ParamLayout trainable_layout(const ParamLayout& full) {
  ParamLayout t;
  for (const ParamInfo& p : full.params())
    if (p.trainable) t.add(p.name, p.shape, p.init, p.init_std, param_options(p));
  t.finalize();
  NK_CHECK(t.total() == full.trainable_end(), "trainable layout: {} elements, expected {}",
           t.total(), full.trainable_end());
  for (const ParamInfo& p : t.params())
    NK_CHECK(p.offset == full.find(p.name).offset, "trainable layout: '{}' moved", p.name);
  return t;
}
}  // namespace

std::string imported_base_dir(const TrainConfig& cfg) {
  return cfg.out_dir + "/base";
}

std::unique_ptr<Transformer> load_run_model(const TrainConfig& cfg, const std::string& from,
                                            const char* key, const nn::TensorParallel& tp,
                                            const PipelineStage& stage) {
  const std::string dir = is_hf_model_folder(from) ? imported_base_dir(cfg) : from;
  const ModelConfig saved = read_model_config(dir);
  // A base for this run's adapters gains them, initialised from the seed;
  // so does a causal LM made a sequence classifier (a reward model): its
  // score head replaces the LM head; so does a PPO policy's value head.
  const bool add_adapters = cfg.model.has_adapters() && !saved.has_adapters();
  const bool add_score = cfg.model.classifier() && !saved.classifier();
  const bool add_value = cfg.model.value_head && !saved.value_head;
  ModelConfig want = cfg.model;
  if (add_adapters) {
    want.lora = LoraConfig();
    want.ia3 = Ia3Config();
    want.bottleneck = BottleneckConfig();
    want.prompt = PromptConfig();
  }
  if (add_score) {
    want.num_labels = 0;
    want.labels.clear();
  }
  if (add_value) want.value_head = false;
  if (model_config_to_json(saved) != model_config_to_json(want))
    fail("{}: the model in '{}' has another configuration than model.* here", key, dir);
  const bool added = add_adapters || add_score || add_value;
  const bool pieces = tp.active() || !stage.whole(cfg.model);
  // (A score or value head this run adds is drawn whole from the seed on
  // the last stage's ranks, as on one process: it is whole on every
  // tensor-parallel rank.)
  if (pieces && add_score && (tp.experts_whole || tp.experts_narrower()))
    fail(
        "{}: the model in '{}' gains a score head in this run, which is not read under "
        "parallel.etp < parallel.tp yet (set parallel.etp to parallel.tp)",
        key, dir);
  auto m = std::make_unique<Transformer>(cfg.model, cfg.dtype, cfg.seed,
                                         added ? ParamInit::Added : ParamInit::Zeros, cfg.frozen,
                                         cfg.device, cfg.frozen_weights, QuantPlan(), tp, stage);
  if (!pieces) {
    load_weights(*m, dir, added);
    return m;
  }
  // Tensor or pipeline parallel: this rank's slices of its stage's tensors
  // (the file holds the whole ones), but the adapters this run adds (drawn
  // from the seed above). The file's tensors: this run's but what it adds,
  // and with a score head added, the LM head it replaces (laid out as the
  // saved model's).
  const auto in_file = [&](const ParamInfo& p) { return !(added && added_to_base(p)); };
  load_weight_pieces(
      *m, dir, (add_score ? Transformer::layout_for(want) : m->global_layout()).subset(in_file),
      in_file);
  return m;
}

namespace {

// Rank 0's part of a save: the weights, the optimizer moments when they are
// held whole, and the small files.
// m, v: AdamW's moments laid out as the trainable parameters (with_moments).
CheckpointContents checkpoint_contents(const TrainConfig& cfg, Transformer& model, const Tensor& m,
                                       const Tensor& v, int64_t optimizer_steps,
                                       const TrainerState& state, const ParamLayout& trainable,
                                       bool with_moments) {
  NK_CHECK(optimizer_steps == state.optimizer_steps,
           "save_train_checkpoint: optimizer at update {}, state says {}", optimizer_steps,
           state.optimizer_steps);
  const ParamLayout& layout = model.layout();
  CheckpointContents c;
  c.step = state.step;
  // The parameters with masters: all, or the trainable ones (see saved_layout).
  const bool whole = model.frozen_weights() == FrozenWeights::Master;
  c.model = flat_tensors(whole ? layout : trainable, model.params(), "");
  describe_flat_tensors(c, whole ? layout : trainable, "");
  if (with_moments) {
    NK_CHECK(m.numel() == layout.trainable_end() && v.numel() == layout.trainable_end(),
             "save_train_checkpoint: the optimizer state ({} elements) is not laid out like the "
             "model's {} trainable elements",
             m.numel(), layout.trainable_end());
    c.optimizer = flat_tensors(trainable, m, kExpAvg);
    for (auto& t : flat_tensors(trainable, v, kExpAvgSq)) c.optimizer.push_back(std::move(t));
    for (const char* prefix : {kExpAvg, kExpAvgSq}) describe_flat_tensors(c, trainable, prefix);
  }
  c.optimizer_metadata = {{"optimizer", "adamw"},
                          {"optimizer_steps", std::to_string(optimizer_steps)}};
  if (const std::string frozen = frozen_list(layout); !frozen.empty())
    c.optimizer_metadata[kFrozen] = frozen;
  c.text_files["trainer_state.json"] = trainer_state_to_json(state);
  c.text_files["config.yaml"] = cfg.config_yaml;
  c.text_files["config.json"] = model_config_to_json(model.config());
  return c;
}

// Every rank's text, in group-rank order, on every rank.
std::vector<std::string> all_gather_strings(dist::Communicator& g, const std::string& mine) {
  const int n = g.size();
  Tensor len = Tensor::empty({1}, DType::I64), lens = Tensor::empty({n}, DType::I64);
  *len.data<int64_t>() = int64_t(mine.size());
  g.all_gather(len, lens);
  int64_t longest = 0;
  for (int j = 0; j < n; ++j) longest = std::max(longest, lens.data<int64_t>()[j]);
  Tensor buf = Tensor::zeros({std::max<int64_t>(longest, 1)}, DType::U8);
  std::memcpy(buf.raw(), mine.data(), mine.size());
  Tensor all = Tensor::empty({n * buf.numel()}, DType::U8);
  g.all_gather(buf, all);
  std::vector<std::string> out;
  for (int j = 0; j < n; ++j)
    out.emplace_back(static_cast<const char*>(all.raw()) + j * buf.numel(),
                     size_t(lens.data<int64_t>()[j]));
  return out;
}

// A sharded save's pieces, whatever the number of ranks that wrote them, into
// whole arenas: `targets` maps a tensor-name prefix to the flat arena of
// `layout` it fills. Every piece is checked against the layout and the
// manifest, and every element of every parameter must be covered exactly once.
template <class CheckMeta>
void read_pieces(const CheckpointReader& r, const std::vector<CheckpointReader::Shard>& shards,
                 const ParamLayout& layout,
                 const std::vector<std::pair<std::string, Tensor*>>& targets,
                 const CheckMeta& check_meta) {
  std::map<std::string, std::vector<std::pair<int64_t, int64_t>>> covered;
  for (const CheckpointReader::Shard& sh : shards) {
    SafetensorsFile f = SafetensorsFile::open(r.path(sh.file));
    check_meta(f);
    for (const SafetensorsEntry& e : f.entries()) {
      Tensor* dst = nullptr;
      std::string name;
      for (const auto& [prefix, t] : targets)
        if (e.name.rfind(prefix, 0) == 0 && layout.has(e.name.substr(prefix.size()))) {
          dst = t;
          name = e.name.substr(prefix.size());
          break;
        }
      if (!dst)
        fail("{}: tensor '{}' is not part of this model (the checkpoint is of another model?)",
             f.path(), e.name);
      const ParamInfo& p = layout.find(name);
      auto it = sh.pieces.find(e.name);
      if (it == sh.pieces.end()) fail("{}: tensor '{}' is not in the manifest", f.path(), e.name);
      const FlatPiece& piece = it->second;
      if (piece.global_shape != p.shape)
        fail("{}: tensor '{}' is a piece of shape {} in the checkpoint, but this model's is {}",
             f.path(), e.name, shape_str(piece.global_shape), shape_str(p.shape));
      if (e.dtype != DType::F32 || e.shape != Shape{piece.end - piece.begin})
        fail("{}: tensor '{}' is {} {}, the manifest records f32 [{}]", f.path(), e.name,
             dtype_name(e.dtype), shape_str(e.shape), piece.end - piece.begin);
      f.read_into(e.name, dst->narrow0(p.offset + piece.begin, piece.end - piece.begin));
      covered[e.name].emplace_back(piece.begin, piece.end);
    }
  }
  for (const ParamInfo& p : layout.params())
    for (const auto& [prefix, t] : targets) {
      auto& ranges = covered[prefix + p.name];
      std::sort(ranges.begin(), ranges.end());
      int64_t next = 0;
      for (auto [b, e] : ranges) {
        if (b != next)
          fail("checkpoint '{}': the shards {} elements [{}, {}) of '{}{}'", r.dir(),
               b < next ? "hold twice" : "miss", std::min(b, next), std::max(b, next), prefix,
               p.name);
        next = e;
      }
      if (next != p.numel())
        fail("checkpoint '{}': the shards miss elements [{}, {}) of '{}{}'", r.dir(), next,
             p.numel(), prefix, p.name);
    }
}

}  // namespace

std::string save_train_checkpoint(const TrainConfig& cfg, Transformer& model, AdamW& opt,
                                  const TrainerState& state) {
  NK_CHECK(opt.state_mirrors_arenas(),
           "save_train_checkpoint: the optimizer state is not laid out like the model's");
  // bf16 moments are saved as they are (the file's dtype says so; a load widens them);
  // f16 ones, held scaled, as their f32 values (exact: f16 times a power of two).
  const bool as_stored = opt.m().dtype() != DType::F16;
  return save_train_checkpoint(cfg, model, as_stored ? opt.m() : opt.m_f32(),
                               as_stored ? opt.v() : opt.v_f32(), opt.steps_done(), state);
}

std::string save_train_checkpoint(const TrainConfig& cfg, Transformer& model, const Tensor& m,
                                  const Tensor& v, int64_t optimizer_steps,
                                  const TrainerState& state) {
  const ParamLayout trainable = trainable_layout(model.layout());
  return save_checkpoint(
      cfg.checkpoint_root(),
      checkpoint_contents(cfg, model, m, v, optimizer_steps, state, trainable, true),
      cfg.keep_checkpoints);
}

std::string save_sharded_train_checkpoint(const TrainConfig& cfg, Transformer& model, AdamW& opt,
                                          const TrainerState& state, dist::Communicator& group,
                                          bool shard_weights) {
  const ParamLayout trainable = trainable_layout(model.layout());
  const std::string root = cfg.checkpoint_root();
  // This rank's moments: for each trainable group's shard, its piece of every
  // parameter it meets.
  CheckpointShard shard, weights;
  shard.file = checkpoint_shard_file("optimizer", group.rank(), group.size());
  shard.metadata = {{"format", "nekton-checkpoint"},
                    {"step", std::to_string(state.step)},
                    {"optimizer", "adamw"},
                    {"optimizer_steps", std::to_string(opt.steps_done())}};
  if (const std::string frozen = frozen_list(model.layout()); !frozen.empty())
    shard.metadata[kFrozen] = frozen;
  weights.file = checkpoint_shard_file("model", group.rank(), group.size());
  weights.metadata = {{"format", "nekton-checkpoint"}, {"step", std::to_string(state.step)}};
  std::vector<std::pair<std::string, Tensor>> sq;
  // The pieces in f32, whatever optim.moment_dtype holds (read_pieces reads f32).
  const Tensor m = opt.m_f32(), v = opt.v_f32();
  for (size_t i = 0; i < opt.groups().size(); ++i) {
    const ParamGroup& g = opt.groups()[i];
    if (!g.trainable || g.shard_size() == 0) continue;
    for (const ParamInfo& p : trainable.params()) {
      const int64_t lo = std::max(g.shard_begin, p.offset);
      const int64_t hi = std::min(g.shard_end, p.offset + p.numel());
      if (hi <= lo) continue;
      const int64_t at = opt.state_offset(i) + (lo - g.shard_begin);
      NK_CHECK(!shard.pieces.count(kExpAvg + p.name),
               "save_sharded_train_checkpoint: two pieces of '{}' on one rank", p.name);
      FlatPiece piece{p.shape, lo - p.offset, hi - p.offset};
      shard.pieces[kExpAvg + p.name] = piece;
      shard.pieces[kExpAvgSq + p.name] = piece;
      shard.tensors.emplace_back(kExpAvg + p.name, m.narrow0(at, hi - lo));
      sq.emplace_back(kExpAvgSq + p.name, v.narrow0(at, hi - lo));
      weights.pieces[p.name] = piece;  // the master weights this rank updates
      weights.tensors.emplace_back(p.name, model.params().narrow0(lo, hi - lo));
    }
  }
  for (auto& t : sq) shard.tensors.push_back(std::move(t));
  // Frozen parameters: whole on every rank, written by rank 0; a base held
  // otherwise than as masters (LoRA's in bf16, QLoRA's NF4) is
  // train.init_from's, read from there again on resume, as checkpoint_contents
  // leaves it out.
  if (group.rank() == 0)
    for (const ParamInfo& p : model.layout().params())
      if (!p.trainable && model.frozen_weights() == FrozenWeights::Master) {
        weights.pieces[p.name] = FlatPiece{p.shape, 0, p.numel()};
        weights.tensors.emplace_back(p.name,
                                     ParamLayout::view(model.params(), p).view({p.numel()}));
      }

  Tensor token = Tensor::empty({1}, DType::I64);
  *token.data<int64_t>() = int64_t(::getpid());
  group.broadcast(token, 0);
  const std::string tmp = shared_checkpoint_tmp(root, state.step, *token.data<int64_t>());
  if (group.rank() == 0) prepare_shared_checkpoint(root, tmp);
  group.barrier();
  // Once rank 0 holds every record, every shard is durable.
  std::vector<std::string> records = all_gather_strings(group, write_checkpoint_shard(tmp, shard));
  if (shard_weights)
    for (auto& r : all_gather_strings(group, write_checkpoint_shard(tmp, weights)))
      records.push_back(std::move(r));
  std::string dir = (std::filesystem::path(root) / checkpoint_name(state.step)).string();
  if (group.rank() == 0) {
    CheckpointContents c = checkpoint_contents(cfg, model, Tensor(), Tensor(), opt.steps_done(),
                                               state, trainable, false);
    if (shard_weights) c.model.clear();  // in the model shards
    dir = finish_shared_checkpoint(root, tmp, c, records, cfg.keep_checkpoints);
  }
  group.barrier();  // installed before any rank goes on (or reads it back)
  return dir;
}

LoadedTrainCheckpoint load_train_checkpoint(const std::string& dir, const TrainConfig& cfg,
                                            const nn::TensorParallel& tp,
                                            const PipelineStage& stage) {
  CheckpointReader r = CheckpointReader::open(dir);
  LoadedTrainCheckpoint out;
  out.dir = dir;
  out.state = trainer_state_from_json(r.text("trainer_state.json"), r.path("trainer_state.json"));
  if (out.state.step != r.step())
    fail("checkpoint '{}': trainer_state.json is at step {}, the manifest at step {}", dir,
         out.state.step, r.step());

  // Fresh buffers; the caller swaps them in only once all of them are read.
  // A base held without masters is train.init_from's, read again (or the
  // random one the seed draws).
  const bool whole = cfg.frozen_weights == FrozenWeights::Master;
  out.model =
      !whole && !cfg.init_from.empty()
          ? load_run_model(cfg, cfg.init_from, "train.init_from", tp, stage)
          : std::make_unique<Transformer>(cfg.model, cfg.dtype, cfg.seed,
                                          whole ? ParamInit::Zeros : ParamInit::Random, cfg.frozen,
                                          cfg.device, cfg.frozen_weights, QuantPlan(), tp, stage);
  const ParamLayout& layout = out.model->layout();
  // Tensor or pipeline parallel: the checkpoint holds whole tensors
  // (whatever layout saved it); this rank reads its slices of its stage's.
  const ParamLayout& global = out.model->global_layout();
  const bool pieces = tp.active() || !stage.whole(cfg.model);
  if (pieces && (!r.model_shards().empty() || !r.optimizer_shards().empty()))
    fail(
        "checkpoint '{}' was saved with parallel.shard (its state in per-rank pieces); loading "
        "it under tensor or pipeline parallelism is not supported yet: resume it without them",
        dir);
  // The progress line's total: what this rank reads of model.safetensors
  // and optimizer.safetensors (a sharded save's per-rank files are read
  // without one).
  double load_bytes = 0;
  if (r.model_shards().empty())
    load_bytes +=
        flat_tensor_read_bytes(r.model(), pieces || whole ? layout : trainable_layout(layout), "");
  if (r.optimizer_shards().empty()) {
    const SafetensorsFile o = r.optimizer();
    const ParamLayout t = trainable_layout(layout);
    load_bytes += flat_tensor_read_bytes(o, t, kExpAvg) + flat_tensor_read_bytes(o, t, kExpAvgSq);
  }
  LoadProgress progress("checkpoint " + dir, load_bytes);
  if (pieces && !whole) {  // this rank's slices of the trainable ones
    const ParamLayout trainable = trainable_layout(layout);
    Tensor masters = out.model->params().narrow0(0, trainable.total());
    read_flat_tensor_shards(r.model(), trainable_layout(global), "", trainable, tp.rank(),
                            tp.size(), masters, &progress);
    for (const ParamInfo& p : trainable.params())
      check_finite(ParamLayout::view(masters, p), "checkpoint '" + dir + "'", p.name, false);
  } else if (pieces) {
    read_flat_tensor_shards(r.model(), global, "", layout, tp.rank(), tp.size(),
                            out.model->params(), &progress);
  } else if (!whole) {
    const ParamLayout trainable = trainable_layout(layout);
    Tensor masters = out.model->params().narrow0(0, trainable.total());
    if (r.model_shards().empty())
      read_flat_tensors(r.model(), trainable, "", masters, &progress);
    else  // FSDP's: each rank's blocks of the trainable ones
      read_pieces(r, r.model_shards(), trainable, {{"", &masters}}, [](const SafetensorsFile&) {});
    for (const ParamInfo& p : trainable.params())
      check_finite(ParamLayout::view(masters, p), "checkpoint '" + dir + "'", p.name, false);
  } else if (r.model_shards().empty()) {
    SafetensorsFile weights = r.model();
    read_flat_tensors(weights, layout, "", out.model->params(), &progress);
  } else {
    read_pieces(r, r.model_shards(), layout, {{"", &out.model->params()}},
                [](const SafetensorsFile&) {});
  }
  // NaN or Inf would resume into a non-finite loss: refuse them, naming the tensor.
  for (const ParamInfo& p : layout.params())
    if (whole)
      check_finite(ParamLayout::view(out.model->params(), p), "checkpoint '" + dir + "'", p.name,
                   false);
  auto check_meta = [&](const SafetensorsFile& opt) {
    auto meta = opt.metadata();
    if (meta["optimizer"] != "adamw")
      fail("{}: holds optimizer '{}', this run uses adamw", opt.path(), meta["optimizer"]);
    if (meta["optimizer_steps"] != std::to_string(out.state.optimizer_steps))
      fail("{}: optimizer_steps {} differs from trainer_state.json's {}", opt.path(),
           meta["optimizer_steps"], out.state.optimizer_steps);
    // Moments exist for the trainable parameters only: the same set must be frozen.
    const std::string saved_frozen = meta.count(kFrozen) ? meta[kFrozen] : "";
    if (saved_frozen != frozen_list(layout))
      fail(
          "train.freeze: checkpoint '{}' was trained with {} frozen, but this run freezes {}; a "
          "resumed run must freeze the same parameters",
          dir, saved_frozen.empty() ? "nothing" : saved_frozen,
          frozen_list(layout).empty() ? "nothing" : frozen_list(layout));
  };
  const ParamLayout trainable = trainable_layout(layout);
  out.exp_avg = Tensor::zeros({trainable.total()}, DType::F32, cfg.device);
  out.exp_avg_sq = Tensor::zeros({trainable.total()}, DType::F32, cfg.device);
  if (pieces) {
    SafetensorsFile opt = r.optimizer();
    check_meta(opt);
    const ParamLayout global_trainable = trainable_layout(global);
    read_flat_tensor_shards(opt, global_trainable, kExpAvg, trainable, tp.rank(), tp.size(),
                            out.exp_avg, &progress);
    read_flat_tensor_shards(opt, global_trainable, kExpAvgSq, trainable, tp.rank(), tp.size(),
                            out.exp_avg_sq, &progress);
  } else if (r.optimizer_shards().empty()) {
    SafetensorsFile opt = r.optimizer();
    check_meta(opt);
    read_flat_tensors(opt, trainable, kExpAvg, out.exp_avg, &progress);
    read_flat_tensors(opt, trainable, kExpAvgSq, out.exp_avg_sq, &progress);
  } else {
    read_pieces(r, r.optimizer_shards(), trainable,
                {{kExpAvg, &out.exp_avg}, {kExpAvgSq, &out.exp_avg_sq}}, check_meta);
  }
  progress.finish();

  check_finite(out.exp_avg, "checkpoint '" + dir + "'", "exp_avg", false);
  check_finite(out.exp_avg_sq, "checkpoint '" + dir + "'", "exp_avg_sq", false);

  // Same shapes, but maybe another norm_eps, rope_theta, ...: refuse those too.
  nlohmann::json saved = nlohmann::json::parse(r.text("config.json"), nullptr, false);
  nlohmann::json now = nlohmann::json::parse(model_config_to_json(cfg.model));
  for (const auto& [key, value] : now.items())
    if (!saved.is_object() || !saved.contains(key) || saved[key] != value)
      fail("checkpoint '{}': model {} is {} in {} but {} here (model.* must match)", dir, key,
           saved.is_object() && saved.contains(key) ? saved[key].dump() : "missing",
           r.path("config.json"), value.dump());
  // Keys written only when set (rope_scaling, sliding_window): one the
  // checkpoint has and this run lacks is a difference too.
  if (saved.is_object())
    for (const auto& [key, value] : saved.items())
      if (!now.contains(key))
        fail("checkpoint '{}': model {} is {} in {} but not set here (model.* must match)", dir,
             key, value.dump(), r.path("config.json"));
  // The bf16 copy the kernels read, rounded exactly as AdamW's fused copy rounds.
  out.model->sync_compute_params();
  return out;
}

}  // namespace nk
