#include "train/trainer.h"

#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_io.h"
#include "ckpt/model_io.h"
#include "ckpt/peft_adapter.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/stop_signal.h"
#include "data/dataset/dp_slice.h"
#include "data/tokenizer/tokenizer.h"
#include "parallel/model_parallel.h"
#include "train/metrics.h"
#include "train/train_checkpoint.h"

namespace nk {

namespace {
using Clock = std::chrono::steady_clock;
// Seconds a step may have run before a stop signal drops it (see Trainer::run).
constexpr double kDropStepAfter = 5.0;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// One micro-batch, i32 [B, T]: the loader fills host memory and the model
// reads `tokens` and `targets` on its device. On a CPU run they are the host
// tensors themselves and upload() copies nothing. Rows of packed samples
// (fine-tuning, S = the most segments in a row > 0) also carry positions
// [B, T] and segment starts [B, S + 1]: the model's PackedBatchInfo.
struct DeviceBatch {
  DeviceBatch(int64_t B, int64_t T, Device device, int64_t S = 0)
      : host_tokens(Tensor::empty({B, T}, DType::I32)),
        host_targets(Tensor::empty({B, T}, DType::I32)),
        tokens(ops::to_device(host_tokens, device)),
        targets(ops::to_device(host_targets, device)) {
    if (S == 0) return;
    host_positions = Tensor::empty({B, T}, DType::I32);
    host_cu = Tensor::empty({B, S + 1}, DType::I32);
    packed.position_ids = ops::to_device(host_positions, device);
    packed.cu_seqlens = ops::to_device(host_cu, device);
  }
  void load(DataLoader& loader) { loader.next(host_tokens, host_targets, host_positions, host_cu); }
  void upload() {
    ops::upload(tokens, host_tokens);
    ops::upload(targets, host_targets);
    if (!host_cu.defined()) return;
    ops::upload(packed.position_ids, host_positions);
    ops::upload(packed.cu_seqlens, host_cu);
  }
  const PackedBatchInfo* packing() const { return host_cu.defined() ? &packed : nullptr; }
  Tensor host_tokens, host_targets, tokens, targets;
  Tensor host_positions, host_cu;
  PackedBatchInfo packed;
};

// Each data-parallel rank's blocks of the trainable f32 weights `blocks`
// (the groups' shards: ZeRO-1, FSDP), summed over `group` into the whole
// arena on every rank; the frozen ones, whole everywhere, are copied.
Tensor join_blocks(const Tensor& blocks, const std::vector<ParamGroup>& groups,
                   int64_t trainable_end, dist::Communicator& group) {
  Tensor out = Tensor::zeros({blocks.numel()}, DType::F32);
  for (const ParamGroup& g : groups)
    if (g.trainable && g.shard_size() > 0)
      ops::convert(out.narrow0(g.shard_begin, g.shard_size()),
                   blocks.narrow0(g.shard_begin, g.shard_size()));
  group.all_reduce(out);
  const int64_t frozen = out.numel() - trainable_end;
  if (frozen > 0)
    ops::convert(out.narrow0(trainable_end, frozen), blocks.narrow0(trainable_end, frozen));
  return out;
}

}  // namespace

double measure_gemm_peak(DType dtype, Device device) {
  // Large enough to fill a GPU (8192^3: 1.1 TFLOP), small enough for a CPU
  // to finish in well under a second (2048^3). Non-zero inputs: zeros run
  // faster than real data on some GPUs.
  const int64_t n = device == Device::CPU ? 2048 : 8192;
  Tensor a = Tensor::empty({n, n}, dtype, device), b = Tensor::empty({n, n}, dtype, device);
  Tensor c = Tensor::empty({n, n}, dtype, device);
  ops::fill(a, 0.5f);
  ops::fill(b, 0.25f);
  ops::linear_forward(c, a, b, Tensor());  // warm-up: primitive creation
  ops::synchronize(device);
  double best = 1e30;
  for (int i = 0; i < 8; ++i) {
    auto t0 = Clock::now();
    ops::linear_forward(c, a, b, Tensor());
    ops::synchronize(device);
    best = std::min(best, seconds_since(t0));
  }
  return 2.0 * double(n) * double(n) * double(n) / best;
}

Trainer::Trainer(const TrainConfig& cfg, TrainParallel par) : cfg_(cfg), par_(par) {
  if (par_.mesh) check_train_layout(cfg_, *par_.mesh);
  if (cfg_.threads > 0) set_num_threads(int(cfg_.threads));
  if (par_.writes()) {
    out_lock_.emplace(cfg_.out_dir, LockAt::Inside);
    // Only the lock holder may take these for a killed run's: they look the
    // same as a live writer's. The other ranks write nothing until the first
    // save, long after this.
    remove_stale_temporaries_of(cfg_.out_dir + "/model", true);
    remove_stale_temporaries_of(cfg_.out_dir + "/adapter", true);
    remove_stale_temporaries_of(cfg_.out_dir + "/base", true);
    remove_stale_temporaries_of(cfg_.metrics_file);
    if (std::filesystem::is_directory(cfg_.checkpoint_root()))
      remove_stale_temporaries(cfg_.checkpoint_root());
  }
  data_ = build_train_data(cfg_);
  state_.data = data_signature(cfg_);
  state_.lr = cfg_.lr;
  state_.rng = rng_streams(cfg_, 0);
  if (par_.active() && cfg_.model.has_adapters())
    fail(
        "peft.method: adapters train on one process for now (its data-parallel equivalence is not "
        "tested yet)");
  if (par_.active() && data_.train->max_segments() > 0)
    fail(
        "data.sft_path: fine-tuning runs on one process for now (data parallel over packed rows "
        "is not there yet)");
  import_hf_base();
  resume();
  if (!model_ && !cfg_.init_from.empty()) {
    model_ = load_run_model(cfg_, cfg_.init_from, "train.init_from");
    NK_INFO("starting from the weights of {}", cfg_.init_from);
  }
  if (!model_)
    model_ = std::make_unique<Transformer>(cfg_.model, cfg_.dtype, cfg_.seed, ParamInit::Random,
                                           cfg_.frozen, cfg_.device, cfg_.frozen_weights,
                                           QuantPlan(), tensor_parallel(), pipeline_stage());
  if (cfg_.adamw.precision.grads != DType::F32) {
    // Data parallelism reduces the bf16 buckets as they are (MPI sums them
    // widened to f32 and rounds once); the model-parallel layouts: not yet.
    if (model_parallel())
      fail(
          "optim.grad_dtype=bf16 runs without tensor and pipeline parallelism for now "
          "(parallel.* asks for {} processes with them); use optim.grad_dtype=f32",
          par_.world());
    model_->set_grad_dtype(cfg_.adamw.precision.grads);
    const double f32 = 4.0 * double(model_->layout().trainable_end());
    if (double(model_->grad_bytes()) >= f32)
      NK_WARN(
          "optim.grad_dtype=bf16 saves nothing on this model: its bf16 gradients with the f32 "
          "staging of its largest backward stage take {:.1f} MiB, "
          "f32 gradients {:.1f} MiB",
          double(model_->grad_bytes()) / 1048576.0, f32 / 1048576.0);
  }
  if (model_parallel()) {
    const PipelineStage& st = model_->stage();
    std::string layers;
    for (const auto& [first, last] : st.ranges(cfg_.model))
      layers += fmt::format("{}[{}, {})", layers.empty() ? "" : " ", first, last);
    NK_INFO("model parallel: {}{}{}; this rank holds {:.2f}M of the {:.2f}M parameters",
            par_.mesh->describe(), tensor_parallel().sp() ? ", sequence parallel" : "",
            par_.pp() > 1
                ? fmt::format(", pipeline stage {} of {}: layers {}{}{} ({})",
                              par_.mesh->rank_in("pp"), par_.pp(), layers,
                              st.embedding ? ", embedding" : "", st.head ? ", head and loss" : "",
                              st.ranges(cfg_.model).size() > 1 ? "interleaved 1F1B" : "1F1B")
                : "",
            double(model_->layout().count()) / 1e6, double(model_->global_layout().count()) / 1e6);
  }
  if (par_.pp() > 1)
    pipe_ = std::make_unique<parallel::PipelineParallel>(
        *model_, par_.groups->get("pp"), par_.group("embedding"), cfg_.micro_batch, cfg_.seq_len,
        recompute_plan(cfg_.recompute, cfg_.recompute_layers, cfg_.model.n_layer));
  // Data parallel over whole replicas (a pure model-parallel run has none);
  // under pipelining the gradients are summed after the step instead.
  if (par_.active() && par_.dp() > 1 && !pipe_) {
    ddp_ = std::make_unique<parallel::DistributedDataParallel>(*model_, par_.groups->get("dp-cp"),
                                                               cfg_.ddp);
    NK_INFO("data parallel: {}; gradients in {} ({}){}", par_.mesh->describe(),
            parallel::describe_buckets(ddp_->buckets()),
            cfg_.ddp.overlap_grad_reduce ? "overlapped with the backward" : "after the backward",
            ddp_->shards_weights() ? "; weights, gradients and optimizer state sharded (FSDP)"
            : ddp_->sharded()      ? "; optimizer state sharded (ZeRO-1)"
                                   : "");
  }
  if (!opt_) make_optimizer();
  if (!cfg_.data.tokenizer.empty()) {
    std::unique_ptr<Tokenizer> tok;
    try {
      tok = load_tokenizer(cfg_.data.tokenizer);
    } catch (const Error& e) {
      throw e.with_context("data.tokenizer");
    }
    if (tok->vocab_size() > cfg_.model.vocab_size)
      fail("model.vocab_size: {} is smaller than the vocabulary of data.tokenizer '{}' ({})",
           cfg_.model.vocab_size, cfg_.data.tokenizer, tok->vocab_size());
  }
  // Token ids beyond the vocabulary (data made with another tokenizer) are
  // caught here on the first micro-batch, before anything is written; the
  // loader checks every later sample as it reads it.
  if (state_.consumed_samples + cfg_.micro_batch <= data_.train->size()) {
    DataLoader probe(data_.train, cfg_.micro_batch, cfg_.model.vocab_size);
    probe.set_consumed_samples(state_.consumed_samples);
    DeviceBatch(cfg_.micro_batch, cfg_.seq_len, kHost, data_.train->max_segments()).load(probe);
  }
}

void Trainer::import_hf_base() {
  if (cfg_.init_from.empty() || !is_hf_model_folder(cfg_.init_from)) return;
  const std::string base = imported_base_dir(cfg_);
  if (par_.writes() && !std::filesystem::exists(base + "/config.json")) {
    // A base held in bf16 alone (or NF4) needs no more than bf16 on disk.
    HfImportOptions o;
    o.storage = cfg_.dtype == DType::BF16 && cfg_.frozen_weights != FrozenWeights::Master
                    ? DType::BF16
                    : DType::F32;
    const HfImportReport r = import_hf(cfg_.init_from, base, o);
    NK_INFO(
        "train.init_from: imported the Hugging Face model {} ({}, {:.2f}M parameters, {}) into {}",
        cfg_.init_from, r.architecture, double(r.n_params) / 1e6, dtype_name(o.storage), base);
  }
  if (par_.active()) par_.groups->get("world").barrier();
}

void Trainer::resume() {
  namespace fs = std::filesystem;
  const std::string own_root = cfg_.checkpoint_root();
  const bool own_has = !list_checkpoints(own_root).empty();
  if (cfg_.resume_from.empty()) {
    if (!own_has) return;
    if (cfg_.resume == "never")
      fail(
          "train.resume=never: train.out_dir already holds checkpoints in '{}'; choose another "
          "train.out_dir, remove that folder, or set train.resume=auto to continue from it",
          own_root);
    // Rank 0 repairs what a killed save left; the others then find the same
    // newest checkpoint (never two processes removing each other's files).
    std::string dir;
    if (par_.writes()) dir = recover_checkpoint_root(own_root);
    if (par_.active()) par_.groups->get("world").barrier();
    if (!par_.writes()) dir = find_latest_checkpoint(own_root);
    resume_checkpoint(dir);
    saved_step_ = state_.step;
    return;
  }
  // train.resume_from: a checkpoint folder, a run's OUT_DIR with checkpoints,
  // or (runs from before full checkpoints) an OUT_DIR or model/ folder.
  const fs::path from(cfg_.resume_from);
  std::string dir;
  if (fs::exists(from / "manifest.json") || checkpoint_step(from.string()) >= 0) {
    dir = from.string();
    CheckpointReader::open(dir);  // an explicit folder must verify: no fallback
  } else if (!list_checkpoints((from / "checkpoints").string()).empty()) {
    dir = find_latest_checkpoint((from / "checkpoints").string());
  }
  std::error_code ec;
  bool same_root = !dir.empty() && fs::equivalent(fs::path(dir).parent_path(), own_root, ec) && !ec;
  if (own_has && !same_root)
    fail(
        "train.resume_from: train.out_dir already holds checkpoints of another run in '{}'; "
        "resuming '{}' into it would mix two runs: choose a fresh train.out_dir",
        own_root, cfg_.resume_from);
  if (dir.empty()) return resume_legacy();
  resume_checkpoint(dir);
  if (same_root) saved_step_ = state_.step;
}

void Trainer::resume_checkpoint(const std::string& dir) {
  LoadedTrainCheckpoint c = load_train_checkpoint(dir, cfg_, tensor_parallel(), pipeline_stage());
  const TrainerState& saved = c.state;
  check_resume_data(saved, cfg_, "checkpoint '" + dir + "'");
  if (saved.step > cfg_.steps)
    fail("checkpoint '{}' is at step {}, beyond train.steps = {}", dir, saved.step, cfg_.steps);
  for (const auto& [name, value] : rng_streams(cfg_, saved.consumed_samples)) {
    auto it = saved.rng.find(name);
    if (it == saved.rng.end() || it->second != value)
      fail("checkpoint '{}': random stream {} is {} there but {} here", dir, name,
           it == saved.rng.end() ? std::string("missing") : std::to_string(it->second), value);
  }
  const LrSchedule &a = saved.lr, &b = cfg_.lr;
  if (a.lr != b.lr || a.min_lr != b.min_lr || a.warmup_steps != b.warmup_steps ||
      a.decay_steps != b.decay_steps)
    NK_WARN(
        "checkpoint '{}': the LR schedule changed (lr {} -> {}, min_lr {} -> {}, warmup {} -> "
        "{}, decay_steps {} -> {}); the run continues on the new one",
        dir, a.lr, b.lr, a.min_lr, b.min_lr, a.warmup_steps, b.warmup_steps, a.decay_steps,
        b.decay_steps);
  // Everything read and checked: swap it in (the moments once the optimizer
  // exists, which under parallel.shard=optimizer needs the data-parallel plan).
  model_ = std::move(c.model);
  opt_.reset();
  state_.step = saved.step;
  state_.consumed_samples = saved.consumed_samples;
  state_.optimizer_steps = saved.optimizer_steps;
  state_.last_lr = saved.last_lr;
  state_.rng = rng_streams(cfg_, saved.consumed_samples);
  NK_INFO("resuming from checkpoint {} at step {} ({} samples consumed)", dir, state_.step,
          state_.consumed_samples);
  resumed_ = std::move(c);
}

void Trainer::make_optimizer() {
  std::vector<ParamGroup> groups =
      default_param_groups(model_->layout(), cfg_.adamw.weight_decay, model_->params().numel());
  if (ddp_ && ddp_->sharded()) groups = shard_param_groups(groups, ddp_->optimizer_pieces());
  // Plain data parallelism keeps the whole optimizer on every rank, each
  // updating its bf16 master alike from the same all-reduced gradients;
  // ZeRO-1 and FSDP split it, each rank's optimizer holding the remainders
  // of its blocks. Model-parallel layouts: not yet.
  if (cfg_.adamw.precision.master != DType::F32 && model_parallel())
    fail(
        "optim.master_dtype=bf16 runs without tensor and pipeline parallelism for now "
        "(parallel.* asks for {} processes with them); use optim.master_dtype=f32",
        par_.world());
  opt_ = std::make_unique<AdamW>(model_arenas(*model_), std::move(groups), cfg_.adamw);
  // A bf16 master: the compute weights and the optimizer's remainder hold it now.
  if (opt_->master_in_compute()) {
    model_->release_masters();
    // ZeRO-1: each block's bf16 part as its owner split it (rounded to nearest,
    // ties away), where the others rounded their f32 copy to nearest even.
    if (ddp_ && ddp_->sharded()) {
      ddp_->gather_params();
      ddp_->finish_param_gathers();
    }
  }
  if (resumed_) {
    opt_->load_arena_state(resumed_->exp_avg, resumed_->exp_avg_sq, state_.optimizer_steps);
    resumed_.reset();
  }
}

Trainer::MastersOnLoan::MastersOnLoan(Transformer& model, const AdamW* opt,
                                      dist::Communicator* join)
    : model_(opt && opt->master_in_compute() ? &model : nullptr) {
  if (!model_) return;
  Tensor masters = opt->masters_f32();
  if (join) masters = join_blocks(masters, opt->groups(), model.layout().trainable_end(), *join);
  model_->adopt_masters(std::move(masters));
}

Trainer::MastersOnLoan::~MastersOnLoan() {
  if (model_) model_->release_masters();
}

void Trainer::resume_legacy() {
  // train.resume_from names a run's OUT_DIR, or its model folder directly.
  namespace fs = std::filesystem;
  std::string model_dir = cfg_.resume_from;
  if (!fs::exists(trainer_state_path(model_dir)) && fs::exists(fs::path(model_dir) / "model"))
    model_dir = (fs::path(model_dir) / "model").string();
  std::string state_path = trainer_state_path(model_dir);
  if (!fs::exists(state_path))
    fail("train.resume_from: no trainer state in '{}' (expected {} or a checkpoints/ folder)",
         cfg_.resume_from, state_path);
  TrainerState saved = load_trainer_state(state_path);
  check_resume_data(saved, cfg_, "train.resume_from '" + state_path + "'");
  if (saved.step > cfg_.steps)
    fail("train.resume_from: the saved run is at step {}, beyond train.steps = {}", saved.step,
         cfg_.steps);
  if (model_parallel())
    fail(
        "train.resume_from: '{}' is an exported model, not a checkpoint; resuming it under "
        "parallel.tp or parallel.pp > 1 is not supported (resume a checkpoint folder)",
        cfg_.resume_from);
  model_ = load_run_model(cfg_, model_dir, "train.resume_from");
  state_.step = saved.step;
  state_.consumed_samples = saved.consumed_samples;
  state_.rng = rng_streams(cfg_, saved.consumed_samples);
  NK_WARN(
      "resuming from the exported model {} at step {} ({} samples consumed): it holds no "
      "optimizer state, so AdamW starts from zero moments and the run will not match an "
      "uninterrupted one",
      model_dir, state_.step, state_.consumed_samples);
}

void Trainer::check_weights_finite() const {
  // A bf16 master is the compute copy (its remainder cannot make it non-finite).
  const Tensor& w = opt_ && opt_->master_in_compute() ? model_->compute_params() : model_->params();
  const int64_t bad = ops::count_nonfinite(w);
  const bool any = max_over_ranks(bad > 0 ? 1 : 0) > 0;
  if (!any) return;
  std::string where = "on another rank";
  for (const ParamInfo& p : model_->layout().params()) {
    if (p.offset + p.numel() > w.numel()) continue;  // held apart from the arena
    if (int64_t n = ops::count_nonfinite(ParamLayout::view(w, p)); n > 0) {
      where = fmt::format("{} of this rank's {} in '{}'", n, bad, p.name);
      break;
    }
  }
  std::string last = find_latest_checkpoint(cfg_.checkpoint_root());
  fail(
      "step {}: the update left non-finite weights (NaN or Inf; {}), so nothing was saved; the "
      "last good checkpoint is {} (lower train.lr or set train.grad_clip, then resume)",
      state_.step, where, last.empty() ? "none" : "'" + last + "'");
}

void Trainer::save_checkpoint_now() {
  auto t0 = Clock::now();
  if (ddp_) ddp_->finish_param_gathers();  // the weights it writes
  check_weights_finite();
  std::string dir;
  if (model_parallel()) {  // the whole model, gathered from the ranks' pieces
    std::unique_ptr<Transformer> whole = gather_whole_model();
    const Tensor m =
        parallel::gather_model(*model_, replica_state(opt_->m_f32()), par_.group("pp"));
    const Tensor v =
        parallel::gather_model(*model_, replica_state(opt_->v_f32()), par_.group("pp"));
    if (par_.writes()) dir = save_train_checkpoint(cfg_, *whole, m, v, opt_->steps_done(), state_);
    par_.groups->get("world").barrier();  // installed before any rank goes on
    saved_step_ = state_.step;
    if (par_.writes()) NK_INFO("saved checkpoint {} ({:.2f} s)", dir, seconds_since(t0));
    return;
  }
  if (ddp_ && ddp_->sharded()) {                 // every rank writes its optimizer shard
    MastersOnLoan masters(*model_, opt_.get());  // the blocks it writes are its own
    dir = save_sharded_train_checkpoint(cfg_, *model_, *opt_, state_, ddp_->group(),
                                        ddp_->shards_master());
  } else if (par_.writes()) {  // the rest is replicated: rank 0 writes it
    MastersOnLoan masters(*model_, opt_.get());
    dir = save_train_checkpoint(cfg_, *model_, *opt_, state_);
  } else {
    saved_step_ = state_.step;
    return;
  }
  saved_step_ = state_.step;
  if (!par_.writes()) return;
  NK_INFO("saved checkpoint {} ({:.2f} s)", dir, seconds_since(t0));
}

Trainer::~Trainer() = default;

double Trainer::model_parallel_grad_norm_squared() {
  if (!ddp_ || !ddp_->sharded())
    return parallel::model_parallel_grad_norm_squared(*model_, model_->grads(),
                                                      par_.group("tp-pp"));
  // A distributed optimizer: this rank's blocks, summed over the replicas too.
  std::vector<std::pair<int64_t, int64_t>> owned;
  for (const parallel::ShardPiece& p : ddp_->optimizer_pieces())
    if (p.own_end > p.own_begin) owned.emplace_back(p.own_begin, p.own_end);
  return parallel::model_parallel_grad_norm_squared(*model_, model_->grads(), par_.group("tp-pp"),
                                                    &owned, &ddp_->group());
}

nn::TensorParallel Trainer::tensor_parallel() const {
  return par_.tensor_parallel(cfg_.parallel.sequence_parallel);
}

PipelineStage Trainer::pipeline_stage() const {
  if (par_.pp() == 1) return {};
  return parallel::pipeline_stage(cfg_.model, par_.pp(), par_.mesh->rank_in("pp"),
                                  cfg_.parallel.pp_layout, cfg_.parallel.vp);
}

int Trainer::max_over_ranks(int v) const {
  if (!par_.active()) return v;
  Tensor t = Tensor::empty({1}, DType::I32);
  *t.data<int32_t>() = v;
  par_.groups->get("world").all_reduce(t, dist::ReduceOp::Max);
  return *t.data<int32_t>();
}

Tensor Trainer::replica_state(const Tensor& state) {
  if (!ddp_ || !ddp_->sharded()) return state;
  // Each data-parallel rank holds its blocks of every trainable group; the
  // blocks tile the arena, so a sum over the ranks puts them together.
  Tensor out = Tensor::zeros({model_->layout().trainable_end()}, DType::F32);
  for (size_t i = 0; i < opt_->groups().size(); ++i) {
    const ParamGroup& g = opt_->groups()[i];
    if (!g.trainable || g.shard_size() == 0) continue;
    ops::convert(out.narrow0(g.shard_begin, g.shard_size()),
                 state.narrow0(opt_->state_offset(i), g.shard_size()));
  }
  ddp_->group().all_reduce(out);
  return out;
}

Tensor Trainer::replica_weights() {
  if (!ddp_ || !ddp_->shards_master()) return model_->params();
  return join_blocks(model_->params(), opt_->groups(), model_->layout().trainable_end(),
                     ddp_->group());
}

std::unique_ptr<Transformer> Trainer::gather_whole_model() {
  const Tensor params = parallel::gather_model(*model_, replica_weights(), par_.group("pp"));
  if (!par_.writes()) return nullptr;
  auto whole = std::make_unique<Transformer>(cfg_.model, cfg_.dtype, cfg_.seed, ParamInit::Zeros,
                                             cfg_.frozen);
  ops::convert(whole->params(), params);
  whole->sync_compute_params();
  return whole;
}

double Trainer::evaluate() {
  if (!data_.valid) return NAN;
  std::optional<Activations> acts;  // pipeline parallel: the schedule's
  if (!pipe_) acts.emplace(*model_, cfg_.micro_batch, cfg_.seq_len, false);
  // The same valid samples at every validation, so the figures compare.
  DataLoader loader(data_.valid, cfg_.micro_batch, cfg_.model.vocab_size);
  DeviceBatch batch(cfg_.micro_batch, cfg_.seq_len, model_->device(), data_.valid->max_segments());
  double sum = 0;
  for (int64_t i = 0; i < cfg_.val_batches; ++i) {
    batch.load(loader);
    batch.upload();
    sum += pipe_  ? pipe_->forward_loss(batch.tokens, batch.targets)
           : ddp_ ? ddp_->forward_loss(*acts, batch.tokens, batch.targets)
                  : model_->forward_loss(*acts, batch.tokens, batch.targets, batch.packing());
  }
  return sum / double(cfg_.val_batches);
}

void Trainer::run(const std::function<void(const StepStats&)>& on_step) {
  // The run's end (finished, stopped or failed) frees OUT_DIR: a finished
  // Trainer kept for its history must not block a rerun in this process.
  struct ReleaseLock {
    std::optional<OutputLock>& lock;
    ~ReleaseLock() { lock.reset(); }
  } release{out_lock_};
  const int64_t B = cfg_.micro_batch, T = cfg_.seq_len, accum = cfg_.grad_accum();
  std::filesystem::create_directories(cfg_.out_dir);
  // A run killed after its last checkpoint logged steps it will now redo.
  if (state_.step > 0 && par_.writes()) keep_metrics_through_step(cfg_.metrics_file, state_.step);
  std::optional<MetricsWriter> metrics;
  if (par_.writes()) metrics.emplace(cfg_.metrics_file, state_.step > 0);
  double peak = cfg_.peak_tflops > 0 ? cfg_.peak_tflops * 1e12
                                     : measure_gemm_peak(cfg_.dtype, model_->device());
  NK_INFO("model {}, {} layers: {:.2f}M parameters, {} compute, peak {:.0f} GFLOP/s{}",
          cfg_.model.arch, cfg_.model.n_layer, double(model_->layout().count()) / 1e6,
          dtype_name(cfg_.dtype), peak / 1e9, cfg_.peak_tflops > 0 ? "" : " (measured GEMM)");
  if (!cfg_.frozen.empty()) {
    int64_t trainable = 0;
    for (const ParamInfo& p : model_->layout().params()) trainable += p.trainable ? p.numel() : 0;
    const LoraConfig& l = cfg_.model.lora;
    if (l.enabled())
      NK_INFO(
          "peft: LoRA r={} alpha={}{}{} on {} modules ({}); base frozen, {:.2f}M parameters "
          "trainable ({:.2f}%)",
          l.rank, l.alpha, l.rslora ? " (rsLoRA)" : "",
          l.dropout > 0 ? fmt::format(" dropout {}", l.dropout) : "",
          lora_targets(cfg_.model).size(), fmt::join(l.target_modules, ","),
          double(trainable) / 1e6, 100.0 * double(trainable) / double(model_->layout().count()));
    else if (const Ia3Config& a = cfg_.model.ia3; a.enabled())
      NK_INFO(
          "peft: IA3 on {} modules ({}; feedforward: {}); base frozen, {:.4f}M parameters "
          "trainable ({:.3f}%)",
          ia3_targets(cfg_.model).size(), fmt::join(a.target_modules, ","),
          a.feedforward_modules.empty() ? "none"
                                        : fmt::format("{}", fmt::join(a.feedforward_modules, ",")),
          double(trainable) / 1e6, 100.0 * double(trainable) / double(model_->layout().count()));
    else if (const BottleneckConfig& a = cfg_.model.bottleneck; a.enabled())
      NK_INFO(
          "peft: bottleneck adapters of width {} after {} layers ({}); base frozen, {:.4f}M "
          "parameters trainable ({:.3f}%)",
          a.dim, bottleneck_targets(cfg_.model).size(), fmt::join(a.target_modules, ","),
          double(trainable) / 1e6, 100.0 * double(trainable) / double(model_->layout().count()));
    else if (const PromptConfig& p = cfg_.model.prompt; p.enabled())
      NK_INFO(
          "peft: p-tuning, {} virtual tokens from an MLP prompt encoder of width {}; base "
          "frozen, {:.4f}M parameters trainable ({:.3f}%)",
          p.virtual_tokens, p.encoder_hidden, double(trainable) / 1e6,
          100.0 * double(trainable) / double(model_->layout().count()));
    else
      NK_INFO("train.freeze: {} parameter tensors frozen, {:.2f}M parameters trainable",
              cfg_.frozen.size(), double(trainable) / 1e6);
  }
  NK_INFO("data {}; {} x {} tokens per micro-batch, {} micro-batches per step", data_.summary, B, T,
          accum);
  {  // what this rank holds: resident weight pages (FSDP releases the other ranks'), the
     // gradient and optimizer arenas (bytes per parameter: see BENCHMARKS.md)
    Transformer& m = *model_;
    const bool copy = m.compute_params().raw() != m.params().raw();
    double weights = double(parallel::resident_bytes(m.params())) +
                     (copy ? double(parallel::resident_bytes(m.compute_params())) : 0.0);
    if (m.frozen_weights() != FrozenWeights::Master) {
      weights = double(m.weight_bytes());
      NK_INFO(
          "frozen base held as {}: {:.1f} MiB of weights in all",
          m.frozen_weights() == FrozenWeights::Nf4 ? "NF4 (QLoRA)" : dtype_name(m.compute_dtype()),
          weights / 1048576.0);
    }
    const double grads = double(m.grad_bytes()), state = double(opt_->state_bytes());
    NK_INFO(
        "memory per rank: weights {:.1f} MiB resident, gradients {:.1f} MiB, optimizer state "
        "{:.1f} MiB ({:.2f} bytes per parameter)",
        weights / 1048576.0, grads / 1048576.0, state / 1048576.0,
        (weights + grads + state) / double(m.layout().count()));
  }
  // Pipeline parallel: the schedule holds its stage's activations, one set
  // per micro-batch in flight.
  std::optional<Activations> acts;
  if (!pipe_)
    acts.emplace(*model_, B, T, true,
                 recompute_plan(cfg_.recompute, cfg_.recompute_layers, cfg_.model.n_layer));
  const std::string recompute_note =
      cfg_.recompute == "none"
          ? ""
          : fmt::format(" ({} recompute of {} layers)", cfg_.recompute,
                        cfg_.recompute_layers ? cfg_.recompute_layers : cfg_.model.n_layer);
  if (pipe_)
    NK_INFO(
        "activations {:.1f} MiB per micro-batch and model chunk; this stage holds at most {} "
        "at once{}",
        double(pipe_->activation_bytes()) / double(pipe_->chunks()) / 1048576.0,
        pipe_->max_in_flight(accum / par_.dp()), recompute_note);
  else
    NK_INFO("activations {:.1f} MiB per micro-batch{}", double(acts->bytes()) / 1048576.0,
            recompute_note);
  AdamW& opt = *opt_;
  DataLoader loader(data_.train, B, cfg_.model.vocab_size);
  loader.set_consumed_samples(state_.consumed_samples);
  const int64_t last_step = cfg_.exit_at_step > 0 ? cfg_.exit_at_step : cfg_.steps;
  DeviceBatch batch(B, T, model_->device(), data_.train->max_segments());
  const double flops_per_step = cfg_.model.train_flops(B * T * accum, T);
  // Data parallel: this rank runs accum / dp of the step's micro-batches.
  const int64_t dp = par_.dp(), dp_rank = par_.dp_rank(), local_accum = accum / dp;
  // Pipeline parallel: all of them, loaded before the step's schedule runs.
  std::vector<DeviceBatch> pp_batches;
  std::vector<Tensor> pp_tokens, pp_targets;
  for (int64_t m = 0; pipe_ && m < local_accum; ++m) {
    pp_batches.emplace_back(B, T, model_->device());
    pp_tokens.push_back(pp_batches.back().tokens);
    pp_targets.push_back(pp_batches.back().targets);
  }
  auto t_start = Clock::now();
  const int64_t first_step = state_.step;
  stopped_by_ = 0;
  StopSignalScope signals;  // SIGTERM/SIGINT: stop_signal() (core/stop_signal.h)
  auto stop = [&](int sig, const std::string& when) {
    if (saved_step_ != state_.step) save_checkpoint_now();
    stopped_by_ = sig;
    NK_INFO("{} received: stopped cleanly {} with the checkpoint of step {}; rerun to resume",
            sig == SIGINT ? "SIGINT" : "SIGTERM", when, state_.step);
  };

  for (int64_t step = state_.step; step < last_step; ++step) {
    auto t0 = Clock::now();
    model_->zero_grads();
    double loss = 0, comm_s = 0, pp_wait_s = 0;
    const int64_t step_first = loader.consumed_samples();
    if (pipe_) {
      // The stages run this rank's micro-batches in one 1F1B schedule
      // (signals are agreed on after the step); then the tied table's two
      // copies and the data-parallel replicas sum their gradients.
      for (int64_t m = 0; m < local_accum; ++m) {
        if (dp > 1)
          loader.set_consumed_samples(dp_micro_batch_first_sample(step_first, m, dp, dp_rank, B));
        pp_batches[size_t(m)].load(loader);
        if (on_batch_)
          on_batch_(step + 1, pp_batches[size_t(m)].host_tokens,
                    pp_batches[size_t(m)].host_targets);
        pp_batches[size_t(m)].upload();
      }
      loss = pipe_->forward_backward(pp_tokens, pp_targets, 1.f / float(accum)) / double(accum);
      pp_wait_s = pipe_->take_wait_seconds();
      pipe_->reduce_embedding_grads();
      if (dp > 1) {
        dist::Communicator& replicas = par_.groups->get("dp-cp");
        const auto t_comm = Clock::now();
        replicas.all_reduce(model_->grads());
        comm_s = seconds_since(t_comm);
        Tensor sum = Tensor::empty({1}, DType::F64);
        *sum.data<double>() = loss;
        replicas.all_reduce(sum);
        loss = *sum.data<double>();
        loader.set_consumed_samples(step_first + B * accum);
      }
    }
    for (int64_t m = 0; !pipe_ && m < local_accum; ++m) {
      // A step of many micro-batches (a huge train.global_batch) does not
      // hold a signal for long: once it has run kDropStepAfter, the signal
      // stops it after the current micro-batch, and the unfinished step is
      // redone on resume. Shorter steps finish first, as before.
      // Under data parallelism every rank takes part in the agreement at
      // every micro-batch, whatever its own clock says.
      if (m > 0) {
        const int want = seconds_since(t0) >= kDropStepAfter ? stop_signal() : 0;
        if (const int sig = max_over_ranks(want); sig != 0) {
          loader.set_consumed_samples(step_first);
          return stop(sig,
                      fmt::format("during step {} (dropped: it is redone on resume)", step + 1));
        }
      }
      if (ddp_)
        loader.set_consumed_samples(dp_micro_batch_first_sample(step_first, m, dp, dp_rank, B));
      batch.load(loader);
      if (on_batch_) on_batch_(step + 1, batch.host_tokens, batch.host_targets);
      batch.upload();
      // The single process's weighting: the mean over all `accum` micro-batches
      // of each one's token-mean loss (the dp ranks' parts are summed below).
      const float scale = 1.f / float(accum);
      // Dropout masks (LoRA's) from the seed, step and micro-batch: a resumed run redraws them.
      model_->set_dropout_seed(cfg_.seed * 0x9E3779B97F4A7C15ull + uint64_t(step) * 65537u +
                               uint64_t(m));
      loss += (ddp_ ? ddp_->forward_backward(*acts, batch.tokens, batch.targets, scale,
                                             m == local_accum - 1)
                    : model_->forward_backward(*acts, batch.tokens, batch.targets, scale,
                                               batch.packing())) /
              double(accum);
    }
    if (ddp_) {
      comm_s = ddp_->wait_grads();
      loss = ddp_->sum_over_group(loss);
      loader.set_consumed_samples(step_first + B * accum);
    }
    // Sequence parallel: the norms' gradients are sums over each rank's rows.
    parallel::reduce_sequence_parallel_grads(*model_);
    // The grads arena holds the trainable parameters only: frozen ones neither
    // count towards the norm nor get clipped. Model parallel: each rank's
    // pieces, the replicated parameters and the tied table once.
    double norm = std::sqrt(model_parallel() ? model_parallel_grad_norm_squared()
                            : ddp_           ? ddp_->grad_norm_squared()
                                             : ops::sum_squares(model_->grads()));
    if (!std::isfinite(loss) || !std::isfinite(norm))
      fail("step {}: non-finite {} ({}); stopping without saving", step + 1,
           std::isfinite(loss) ? "gradient norm" : "loss", std::isfinite(loss) ? norm : loss);
    float clip = cfg_.grad_clip > 0 && norm > cfg_.grad_clip ? float(cfg_.grad_clip / norm) : 1.f;
    double lr = cfg_.lr.at(step);
    opt.step(lr, clip);
    if (ddp_) ddp_->gather_params();  // ZeRO-1: waited for by the next forward

    StepStats s;
    s.step = step + 1;
    s.loss = loss;
    s.lr = lr;
    s.grad_norm = norm;
    double dt = seconds_since(t0);
    s.step_ms = dt * 1e3;
    s.tokens_per_s = double(B * T * accum) / dt;
    s.mfu = flops_per_step / dt / (peak * double(par_.world()));
    s.comm_ms = comm_s * 1e3;
    s.peak_bytes = Allocator::get(model_->device()).peak_bytes();
    if (cfg_.val_every > 0 && (s.step % cfg_.val_every == 0 || s.step == cfg_.steps))
      s.val_loss = evaluate();
    history_.push_back(s);
    state_.step = s.step;
    state_.consumed_samples = loader.consumed_samples();
    state_.optimizer_steps = opt.steps_done();
    state_.last_lr = lr;
    state_.rng = rng_streams(cfg_, state_.consumed_samples);

    if (par_.writes() &&
        (s.step % cfg_.log_every == 0 || s.step == last_step || !std::isnan(s.val_loss))) {
      double elapsed = seconds_since(t_start);
      double eta = elapsed / double(s.step - first_step) * double(last_step - s.step);
      std::string val = std::isnan(s.val_loss) ? "" : fmt::format(" | val {:.4f}", s.val_loss);
      fmt::print(
          "step {:>5}/{} | loss {:.4f}{} | lr {:.2e} | gnorm {:.3f} | {:.0f} tok/s | "
          "MFU {:.1f}% | {:.0f} ms | mem {:.0f} MiB | eta {:.0f}s\n",
          s.step, cfg_.steps, s.loss, val, s.lr, s.grad_norm, s.tokens_per_s, 100 * s.mfu,
          s.step_ms, double(s.peak_bytes) / 1048576.0, eta);
      std::fflush(stdout);
    }
    std::vector<std::pair<std::string, double>> record = {
        {"step", double(s.step)},
        {"loss", s.loss},
        {"val_loss", s.val_loss},
        {"lr", s.lr},
        {"grad_norm", s.grad_norm},
        {"tokens_per_s", s.tokens_per_s},
        {"mfu", s.mfu},
        {"step_ms", s.step_ms},
        {"peak_mem_bytes", double(s.peak_bytes)},
        {"peak_rss_bytes", double(peak_rss_bytes())}};
    if (ddp_ || (pipe_ && dp > 1)) record.emplace_back("comm_ms", s.comm_ms);
    // Pipeline parallel: this stage's waits on its neighbours (rank 0's: the first stage).
    if (pipe_) record.emplace_back("pp_wait_ms", pp_wait_s * 1e3);
    if (metrics) metrics->write(record);
    if (on_step) on_step(s);
    // Every rank stops after the same step, whichever of them got the signal.
    const int sig = max_over_ranks(stop_signal());
    if (sig != 0) return stop(sig, fmt::format("after step {}", s.step));
    if (cfg_.save_every > 0 && s.step % cfg_.save_every == 0) save_checkpoint_now();
  }
  if (saved_step_ != state_.step) save_checkpoint_now();
  if (ddp_) ddp_->gather_full_weights();  // FSDP: rank 0 exports the whole model
  // Tensor parallel: rank 0 exports the whole model, gathered from the shards.
  std::unique_ptr<Transformer> whole;
  if (model_parallel()) whole = gather_whole_model();
  // An NF4 base is not saved (it is train.init_from's, quantised): QLoRA's
  // result is its adapter.
  const bool whole_model = model_->frozen_weights() != FrozenWeights::Nf4;
  // A bf16 master sharded by ZeRO-1 or FSDP is joined on every rank (collective).
  dist::Communicator* join = ddp_ && ddp_->sharded() ? &ddp_->group() : nullptr;
  std::optional<MastersOnLoan> masters;
  if (whole_model && !whole && (join || par_.writes())) masters.emplace(*model_, opt_.get(), join);
  if (!par_.writes()) return;
  Transformer& exported = whole ? *whole : *model_;
  std::string model_dir = cfg_.out_dir + "/model";
  if (whole_model) {
    save_model(model_dir, exported);
    save_trainer_state(trainer_state_path(model_dir), state_);
  }
  // The adapter alone, for PEFT, vLLM or generate.adapter.
  if (cfg_.model.has_adapters()) {
    const std::string adapter_dir = cfg_.out_dir + "/adapter";
    save_peft_adapter(adapter_dir, *model_, cfg_.init_from);
    if (cfg_.model.bottleneck.enabled())
      NK_INFO("saved the bottleneck adapters in Nekton's format (PEFT has none) to {}",
              adapter_dir);
    else
      NK_INFO("saved the {} adapter in Hugging Face PEFT's format to {}",
              adapter_method(cfg_.model), adapter_dir);
  }
  if (!whole_model) return;
  if (!cfg_.data.tokenizer.empty()) store_tokenizer(cfg_.data.tokenizer, model_dir);
  // The base's generation_config.json (its end-of-turn ids): the tuned
  // model stops where the base did.
  if (const std::string gc = cfg_.init_from + "/generation_config.json";
      !cfg_.init_from.empty() && std::filesystem::is_regular_file(gc))
    std::filesystem::copy_file(gc, model_dir + "/generation_config.json",
                               std::filesystem::copy_options::overwrite_existing);
  NK_INFO("saved {} at step {} ({} samples consumed)", model_dir, state_.step,
          state_.consumed_samples);
}

}  // namespace nk
