// The Trainer's set-up and step loop: data, model, optimizer and parallel
// layout, then each step's micro-batches, clipping, update, validation, logs
// and metrics. Resume is in trainer_resume.cc; checkpoints and the final
// export in trainer_save.cc.
#include "train/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <optional>
#include <span>

#include "ckpt/checkpoint.h"
#include "ckpt/model_vocab.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "core/parallel.h"
#include "core/stop_signal.h"
#include "data/dataset/dp_slice.h"
#include "dist/strings.h"
#include "ops/cpu_isa.h"
#include "parallel/context_parallel_batch.h"
#include "parallel/model_parallel.h"
#include "train/expert_balance.h"
#include "train/metrics.h"
#include "train/step_profile.h"
#include "train/tensorboard.h"
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
// Context parallel (cp > 1, parallel/context_parallel_batch.h; the CPU
// only): the loader fills the whole rows, and tokens and targets are this cp
// rank's chunks of them (T / cp each) with their global positions, or with
// packed rows their positions within their documents (the whole rows'
// cu_seqlens go to the ring attention, which masks by global position).
struct DeviceBatch {
  DeviceBatch(int64_t B, int64_t T, Device device, int64_t S = 0, int64_t cp = 1,
              int64_t cp_rank = 0)
      : host_tokens(Tensor::empty({B, T / cp}, DType::I32)),
        host_targets(Tensor::empty({B, T / cp}, DType::I32)),
        tokens(ops::to_device(host_tokens, device)),
        targets(ops::to_device(host_targets, device)),
        cp(cp),
        cp_rank(cp_rank) {
    if (cp > 1) {
      NK_CHECK(device == Device::CPU, "context parallel: the CPU only");
      full_tokens = Tensor::empty({B, T}, DType::I32);
      full_targets = Tensor::empty({B, T}, DType::I32);
      packed.position_ids = Tensor::empty({B, T / cp}, DType::I32);
      if (S == 0) parallel::cp_local_positions(packed.position_ids, cp_rank, cp);
    }
    if (S == 0) return;
    host_positions = Tensor::empty({B, T}, DType::I32);
    host_cu = Tensor::empty({B, S + 1}, DType::I32);
    if (cp == 1) packed.position_ids = ops::to_device(host_positions, device);
    packed.cu_seqlens = ops::to_device(host_cu, device);
  }
  void load(DataLoader& loader) {
    if (cp == 1) {
      loader.next(host_tokens, host_targets, host_positions, host_cu);
      return;
    }
    loader.next(full_tokens, full_targets, host_positions, host_cu);
    parallel::cp_local_rows(full_tokens, host_tokens, cp_rank, cp);
    parallel::cp_local_rows(full_targets, host_targets, cp_rank, cp);
    if (host_cu.defined())
      parallel::cp_local_rows(host_positions, packed.position_ids, cp_rank, cp);
  }
  void upload() {
    ops::upload(tokens, host_tokens);
    ops::upload(targets, host_targets);
    if (!host_cu.defined()) return;
    if (cp == 1) ops::upload(packed.position_ids, host_positions);
    ops::upload(packed.cu_seqlens, host_cu);
  }
  const PackedBatchInfo* packing() const { return host_cu.defined() || cp > 1 ? &packed : nullptr; }
  const Tensor* whole_tokens() const { return cp > 1 ? &full_tokens : nullptr; }
  const Tensor* whole_targets() const { return cp > 1 ? &full_targets : nullptr; }
  Tensor host_tokens, host_targets, tokens, targets;
  Tensor host_positions, host_cu;
  PackedBatchInfo packed;
  int64_t cp = 1, cp_rank = 0;
  Tensor full_tokens, full_targets;  // context parallel: the whole rows the loader fills
};

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

Trainer::Trainer(const TrainConfig& cfg, TrainParallel par,
                 std::shared_ptr<TrainObjective> objective)
    : cfg_(cfg),
      par_(par),
      objective_(objective ? std::move(objective) : std::make_shared<LmObjective>()),
      custom_objective_(objective_ && !dynamic_cast<LmObjective*>(objective_.get())) {
  if (par_.mesh) check_train_layout(cfg_, *par_.mesh);
  check_objective_layout();
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
  data_ = objective_->data(cfg_);
  state_.data = data_signature(cfg_);
  state_.lr = cfg_.lr;
  state_.rng = rng_streams(cfg_, 0);
  import_hf_base();
  resume();
  if (!model_ && !cfg_.init_from.empty()) {
    model_ = load_run_model(cfg_, cfg_.init_from, "train.init_from", tensor_parallel(),
                            pipeline_stage());
    NK_INFO("starting from the weights of {}", cfg_.init_from);
  }
  if (!model_)
    model_ = std::make_unique<Transformer>(cfg_.model, cfg_.dtype, cfg_.seed, ParamInit::Random,
                                           cfg_.frozen, cfg_.device, cfg_.frozen_weights,
                                           QuantPlan(), tensor_parallel(), pipeline_stage());
  // Before the gradient dtype, data parallelism and the optimizer: the
  // experts' split changes the layout they are sized from.
  if (par_.active() && par_.mesh->ep() > 1) {
    a2a_seconds_ = std::make_shared<double>(0.0);
    model_->set_expert_parallel({&par_.groups->get("ep"), a2a_seconds_});
    NK_INFO(
        "expert parallel: {}; each rank holds and computes {} of the {} experts of every MoE "
        "layer for its ep group's tokens (all-to-all dispatch and combine): {:.2f}M of the "
        "{:.2f}M parameters",
        par_.mesh->describe(), cfg_.model.num_experts / par_.mesh->ep(), cfg_.model.num_experts,
        double(model_->layout().count()) / 1e6, double(model_->global_layout().count()) / 1e6);
  }
  if (par_.cp() > 1) {
    const nn::CpComm comm_type = nn::parse_cp_comm(cfg_.parallel.cp_comm_type);
    model_->set_context_parallel(par_.context_parallel(comm_type));
    const ModelConfig& c = cfg_.model;
    const int64_t tp = par_.mesh->tp(), T = cfg_.seq_len / par_.cp();
    const int64_t hq = c.n_head / tp, hkv = c.n_kv_head / tp;
    const std::vector<int64_t>& hcp = cfg_.parallel.hierarchical_cp_sizes;
    const int64_t a2a = hcp.empty() ? 1 : hcp[0];
    const int64_t buffers = nn::cp_buffer_bytes(comm_type, par_.cp(), a2a, cfg_.micro_batch, T, hq,
                                                hkv, c.head_dim(), cfg_.dtype);
    NK_INFO(
        "context parallel: {}; each rank holds {} of every row's {} tokens (chunks {} and {} of "
        "{}), {}",
        par_.mesh->describe(), T, cfg_.seq_len, par_.cp_rank(), 2 * par_.cp() - 1 - par_.cp_rank(),
        2 * par_.cp(), nn::cp_comm_summary(comm_type, par_.cp(), a2a, hq, cfg_.seq_len, buffers));
  }
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
  // Context parallel: each stage runs its cp rank's T / cp tokens of every row.
  if (par_.pp() > 1)
    pipe_ = std::make_unique<parallel::PipelineParallel>(
        *model_, par_.groups->get("pp"), par_.group("embedding"), cfg_.micro_batch,
        cfg_.seq_len / par_.cp(),
        recompute_plan(cfg_.recompute, cfg_.recompute_layers, cfg_.model.n_layer));
  // Another objective's head on the last stage, over the micro-batch the
  // schedule is at (pipe_batches_: the step's, or validation's one).
  if (pipe_ && custom_objective_)
    pipe_->set_head([this](Activations& a, int64_t j, bool backward, float scale) {
      return objective_->head_micro_batch(*model_, a, pipe_batches_.at(size_t(j)), scale, backward);
    });
  // Data parallel over whole replicas (a pure model-parallel run has none);
  // under pipelining the gradients are summed after the step instead (ZeRO-1's
  // and FSDP's reduce-scattered by their buckets, all at once; FSDP's chunks
  // gathered and released around each of the schedule's passes).
  // Context parallel ranks hold the same weights and see different tokens:
  // their gradients are summed as the replicas' are (over "dp-cp").
  if (par_.active() && par_.dp() * par_.cp() > 1 &&
      (!pipe_ || cfg_.ddp.shard != parallel::Shard::None)) {
    const bool split = model_->experts_split();
    ddp_ = std::make_unique<parallel::DistributedDataParallel>(
        *model_, par_.groups->get("dp-cp"), cfg_.ddp,
        split ? &par_.groups->get("expert-dp") : nullptr,
        split ? &par_.groups->get("ep") : nullptr);
    if (pipe_ && ddp_->shards_weights()) pipe_->set_chunk_weights(ddp_.get());
    NK_INFO("data parallel: {}; gradients in {} ({}){}", par_.mesh->describe(),
            parallel::describe_buckets(ddp_->buckets()),
            pipe_                          ? "after the pipeline's schedule"
            : cfg_.ddp.overlap_grad_reduce ? "overlapped with the backward"
                                           : "after the backward",
            ddp_->shards_weights() ? "; weights, gradients and optimizer state sharded (FSDP)"
            : ddp_->shards_grads() ? "; gradients and optimizer state sharded (ZeRO-2)"
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
    // The model's rows against the tokenizer's ids (ckpt/model_vocab.h):
    // fewer is an error naming both, more are padding (logged).
    const bool init = !cfg_.init_from.empty();
    try {
      check_model_vocab(cfg_.model.vocab_size,
                        init ? fmt::format("model folder '{}' of train.init_from", cfg_.init_from)
                             : fmt::format("model.vocab_size = {}", cfg_.model.vocab_size),
                        tok->vocab_size(), fmt::format("data.tokenizer '{}'", cfg_.data.tokenizer));
    } catch (const Error& e) {
      throw e.with_context(init ? "train.init_from" : "model.vocab_size");
    }
  }
  // Token ids beyond the vocabulary (data made with another tokenizer) are
  // caught here on the first micro-batch, before anything is written; the
  // loader checks every later sample as it reads it. (An online objective's
  // samples do not exist before its first step.)
  if (!objective_->online() && state_.consumed_samples + cfg_.micro_batch <= data_.train->size()) {
    DataLoader probe(data_.train, cfg_.micro_batch, cfg_.model.vocab_size);
    probe.set_consumed_samples(state_.consumed_samples);
    DeviceBatch(cfg_.micro_batch, cfg_.seq_len, kHost, data_.train->max_segments()).load(probe);
  }
}

void Trainer::make_optimizer() {
  std::vector<ParamGroup> groups =
      default_param_groups(model_->layout(), cfg_.adamw.weight_decay, model_->params().numel());
  if (ddp_ && ddp_->sharded()) groups = shard_param_groups(groups, ddp_->optimizer_pieces());
  // Plain data parallelism keeps the whole optimizer on every rank, each
  // updating its bf16 master alike from the same all-reduced gradients;
  // ZeRO-1 and FSDP split it, each rank's optimizer holding the remainders
  // of its blocks. Tensor and pipeline parallel ranks (and split experts)
  // update their own pieces, and lend them as f32 to the gathers of a
  // checkpoint or the export (MastersOnLoan, trainer_save.cc).
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
    // Saved whole: under expert parallelism this rank's experts' moments.
    if (model_->experts_split()) {
      resumed_->exp_avg = parallel::local_arena(*model_, resumed_->exp_avg);
      resumed_->exp_avg_sq = parallel::local_arena(*model_, resumed_->exp_avg_sq);
    }
    opt_->load_arena_state(resumed_->exp_avg, resumed_->exp_avg_sq, state_.optimizer_steps);
    resumed_.reset();
  }
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

double Trainer::evaluate() {
  if (!data_.valid) return NAN;
  std::optional<Activations> acts;  // pipeline parallel: the schedule's
  if (!pipe_) acts.emplace(*model_, cfg_.micro_batch, cfg_.seq_len / par_.cp(), false);
  if (pipe_ && ddp_) ddp_->finish_param_gathers();  // ZeRO-1: the schedule reads every weight
  // The same valid samples at every validation, so the figures compare.
  DataLoader loader(data_.valid, cfg_.micro_batch, cfg_.model.vocab_size);
  DeviceBatch batch(cfg_.micro_batch, cfg_.seq_len, model_->device(), data_.valid->max_segments(),
                    par_.cp(), par_.cp_rank());
  double sum = 0;
  for (int64_t i = 0; i < cfg_.val_batches; ++i) {
    batch.load(loader);
    batch.upload();
    const int64_t first = loader.consumed_samples() - cfg_.micro_batch;
    const MicroBatch mb{batch.tokens,         batch.targets,        batch.host_tokens,
                        batch.host_targets,   batch.packing(),      first,
                        batch.whole_tokens(), batch.whole_targets()};
    if (custom_objective_ && (ddp_ || pipe_)) before_staged(acts ? &*acts : nullptr, mb, false);
    if (pipe_) {
      pipe_batches_.clear();
      pipe_batches_.push_back(mb);
    }
    sum += pipe_ ? pipe_->forward_loss(batch.tokens, batch.targets, batch.packing())
           : ddp_ && custom_objective_
               ? ddp_->forward_head(
                     *acts, batch.tokens,
                     [&] { return objective_->head_micro_batch(*model_, *acts, mb, 0.f, false); },
                     batch.packing())
           : ddp_ ? ddp_->forward_loss(*acts, batch.tokens, batch.targets, batch.packing())
                  : objective_->eval_micro_batch(*model_, *acts, mb);
  }
  // Context parallel: each rank's loss is its tokens' share of the mean.
  if (par_.cp() > 1) {
    Tensor t = Tensor::empty({1}, DType::F64);
    *t.data<double>() = sum;
    par_.groups->get("cp").all_reduce(t);
    sum = *t.data<double>();
  }
  return sum / double(cfg_.val_batches);
}

void Trainer::set_step_evaluator(StepEvaluator f) {
  if (pieces_model() || (ddp_ && ddp_->shards_weights()))
    fail(
        "train.eval_tasks: needs the whole model on every process; not with tensor, pipeline "
        "or expert parallelism or parallel.shard=full (evaluate the saved checkpoints with "
        "nekton eval tasks instead)");
  step_eval_ = std::move(f);
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
  // TensorBoard: the same scalars, the step axis continuing on resume.
  std::optional<EventFileWriter> events;
  if (par_.writes() && cfg_.tensorboard) {
    const std::string dir = std::filesystem::path(cfg_.metrics_file).parent_path().string();
    std::error_code ec;  // only OUT_DIR's own event files are replaced or appended to
    events.emplace(dir, state_.step,
                   std::filesystem::equivalent(dir.empty() ? "." : dir, cfg_.out_dir, ec));
  }
  // On the CPU, the kernels' ISA level first (ops/cpu_isa.h): the GEMM peak
  // and every step below are measured at it.
  const bool on_cpu = model_->device() == Device::CPU;
  if (on_cpu) NK_INFO("cpu kernels: {}", ops::cpu_isa_summary());
  double peak = cfg_.peak_tflops > 0 ? cfg_.peak_tflops * 1e12
                                     : measure_gemm_peak(cfg_.dtype, model_->device());
  const std::string peak_note =
      cfg_.peak_tflops > 0 ? ""
      : on_cpu ? fmt::format(" (measured GEMM, {})", ops::cpu_isa_name(ops::active_cpu_isa()))
               : " (measured GEMM)";
  NK_INFO("model {}, {} layers: {:.2f}M parameters, {} compute, peak {:.0f} GFLOP/s{}",
          cfg_.model.arch, cfg_.model.n_layer, double(model_->layout().count()) / 1e6,
          dtype_name(cfg_.dtype), peak / 1e9, peak_note);
  if (!cfg_.frozen.empty()) {
    int64_t trainable = 0;
    for (const ParamInfo& p : model_->layout().params()) trainable += p.trainable ? p.numel() : 0;
    const LoraConfig& l = cfg_.model.lora;
    if (l.enabled())
      NK_INFO(
          "peft: LoRA r={} alpha={}{}{} on {} modules ({}); base frozen{}, {:.2f}M parameters "
          "trainable ({:.2f}%)",
          l.rank, l.alpha, l.rslora ? " (rsLoRA)" : "",
          l.dropout > 0 ? fmt::format(" dropout {}", l.dropout) : "",
          lora_targets(cfg_.model).size(), fmt::join(l.target_modules, ","),
          l.train_router ? " but the routers (peft.train_router)" : "", double(trainable) / 1e6,
          100.0 * double(trainable) / double(model_->layout().count()));
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
          "frozen base held as {}: {:.1f} MiB of weights on this rank",
          m.frozen_weights() == FrozenWeights::Nf4 ? "NF4 (QLoRA)" : dtype_name(m.compute_dtype()),
          weights / 1048576.0);
    }
    // Sharded gradients: the pages of this rank's blocks (each step's
    // reductions hand the others back; metrics.jsonl's grad_resident_bytes
    // is the most held during a step).
    const double grads = ddp_ && ddp_->shards_grads() ? double(parallel::resident_bytes(m.grads()))
                                                      : double(m.grad_bytes()),
                 state = double(opt_->state_bytes());
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
    acts.emplace(*model_, B, T / par_.cp(), true,
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
  if (par_.active()) objective_->set_ranks(objective_ranks(acts));
  objective_->prepare(*model_, state_.step == 0);
  AdamW& opt = *opt_;
  DataLoader loader(data_.train, B, cfg_.model.vocab_size);
  loader.set_consumed_samples(state_.consumed_samples);
  const int64_t last_step = cfg_.exit_at_step > 0 ? cfg_.exit_at_step : cfg_.steps;
  DeviceBatch batch(B, T, model_->device(), data_.train->max_segments(), par_.cp(), par_.cp_rank());
  const double flops_per_step = cfg_.model.train_flops(B * T * accum, T);
  // Data parallel: this rank runs accum / dp of the step's micro-batches.
  const int64_t dp = par_.dp(), dp_rank = par_.dp_rank(), local_accum = accum / dp;
  // Pipeline parallel: whether other ranks hold the same stage (data or
  // context parallel), whose gradients and losses are summed over "dp-cp".
  const bool pp_replicas = pipe_ && dp * par_.cp() > 1;
  // MoE: [n_layer E] pairs routed per expert over a step's micro-batches.
  std::vector<double> expert_load;
  if (model_->config().is_moe())
    expert_load.assign(size_t(cfg_.model.n_layer * cfg_.model.num_experts), 0.0);
  // Pipeline parallel: all of them, loaded before the step's schedule runs,
  // each stage given every micro-batch's packed rows (fine-tuning data).
  // Context parallel: this cp rank's chunks and their global positions.
  std::vector<DeviceBatch> pp_batches;
  std::vector<Tensor> pp_tokens, pp_targets;
  std::vector<const PackedBatchInfo*> pp_packed;
  for (int64_t m = 0; pipe_ && m < local_accum; ++m) {
    pp_batches.emplace_back(B, T, model_->device(), data_.train->max_segments(), par_.cp(),
                            par_.cp_rank());
    pp_tokens.push_back(pp_batches.back().tokens);
    pp_targets.push_back(pp_batches.back().targets);
  }
  for (const DeviceBatch& b : pp_batches) pp_packed.push_back(b.packing());
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

  // train.profile: this process's kernels timed, step by step.
  StepProfile profile(cfg_.profile, cfg_.device);
  for (int64_t step = state_.step; step < last_step; ++step) {
    auto t0 = Clock::now();
    profile.begin_step();
    if (objective_->online()) {
      if (ddp_) ddp_->finish_param_gathers();  // ZeRO-1: the whole updated model on every rank
      objective_->before_step(*model_, step);
    }
    if (ddp_)
      ddp_->zero_grads();  // sharded gradients: this rank's blocks (the rest stay released)
    else
      model_->zero_grads();
    double loss = 0, comm_s = 0, pp_wait_s = 0;
    if (a2a_seconds_) *a2a_seconds_ = 0;
    Transformer::MoeLosses moe;  // this rank's micro-batches' mean (MoE models)
    std::fill(expert_load.begin(), expert_load.end(), 0.0);
    const int64_t step_first = loader.consumed_samples();
    if (pipe_) {
      // The stages run this rank's micro-batches in one 1F1B schedule
      // (signals are agreed on after the step); then the tied table's two
      // copies and the data-parallel replicas sum their gradients.
      pipe_batches_.clear();
      for (int64_t m = 0; m < local_accum; ++m) {
        if (dp > 1)
          loader.set_consumed_samples(dp_micro_batch_first_sample(step_first, m, dp, dp_rank, B));
        const int64_t first_sample = loader.consumed_samples();
        DeviceBatch& b = pp_batches[size_t(m)];
        b.load(loader);
        if (on_batch_) on_batch_(step + 1, b.host_tokens, b.host_targets);
        b.upload();
        pipe_batches_.push_back(MicroBatch{b.tokens, b.targets, b.host_tokens, b.host_targets,
                                           b.packing(), first_sample, b.whole_tokens(),
                                           b.whole_targets()});
      }
      double gather_s = 0;  // ZeRO-1: the schedule reads every weight
      if (ddp_) {
        const auto t_gather = Clock::now();
        ddp_->finish_param_gathers();
        gather_s = seconds_since(t_gather);
      }
      // Another objective's own forward of each micro-batch (a reference),
      // all before the schedule.
      if (custom_objective_)
        for (const MicroBatch& mb : pipe_batches_) before_staged(nullptr, mb, true);
      loss = pipe_->forward_backward(pp_tokens, pp_targets, 1.f / float(accum), pp_packed) /
             double(accum);
      pp_wait_s = pipe_->take_wait_seconds();
      pipe_->reduce_embedding_grads();
      if (model_->config().is_moe()) {  // the last stage's, over every layer
        moe = pipe_->moe_losses();
        expert_load = pipe_->expert_load();
      }
      if (pp_replicas) {
        dist::Communicator& replicas = par_.groups->get("dp-cp");
        const auto t_comm = Clock::now();
        // Split experts: their gradients over the ranks holding the same experts.
        if (ddp_) {
          // The communication waited for: the gathers before the schedule
          // (ZeRO-1) and inside it (FSDP's chunks, counted by wait_grads),
          // the reductions' launch and their wait.
          ddp_->reduce_grads();
          const double launched = seconds_since(t_comm);
          comm_s = gather_s + launched + ddp_->wait_grads();
        } else {
          parallel::reduce_replica_grads(
              *model_, replicas,
              model_->experts_split() ? &par_.groups->get("expert-dp") : nullptr);
          comm_s = seconds_since(t_comm);
        }
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
      const int64_t first_sample = loader.consumed_samples();
      batch.load(loader);
      if (on_batch_) on_batch_(step + 1, batch.host_tokens, batch.host_targets);
      batch.upload();
      // The single process's weighting: the mean over all `accum` micro-batches
      // of each one's token-mean loss (the dp ranks' parts are summed below).
      const float scale = 1.f / float(accum);
      // Dropout masks (LoRA's) from the seed, step and micro-batch: a resumed run redraws them.
      // Data parallel: the step's micro-batch this one is (m · dp + rank), so every
      // micro-batch draws the mask one process would.
      model_->set_dropout_seed(cfg_.seed * 0x9E3779B97F4A7C15ull + uint64_t(step) * 65537u +
                               uint64_t(ddp_ ? m * dp + dp_rank : m));
      const MicroBatch mb{batch.tokens,         batch.targets,        batch.host_tokens,
                          batch.host_targets,   batch.packing(),      first_sample,
                          batch.whole_tokens(), batch.whole_targets()};
      const bool reduce = m == local_accum - 1;
      if (ddp_ && custom_objective_) before_staged(&*acts, mb, true);
      // Data parallel: DistributedDataParallel runs the stages (its weight
      // gathers and gradient reductions between them), another objective
      // its head.
      loss +=
          (ddp_ && custom_objective_
               ? ddp_->forward_backward(
                     *acts, batch.tokens, reduce,
                     [&] { return objective_->head_micro_batch(*model_, *acts, mb, scale, true); },
                     batch.packing())
           : ddp_ ? ddp_->forward_backward(*acts, batch.tokens, batch.targets, scale, reduce,
                                           batch.packing())
                  : objective_->train_micro_batch(*model_, *acts, mb, scale)) /
          double(accum);
      if (model_->config().is_moe()) {
        const Transformer::MoeLosses f = model_->moe_losses(*acts);
        const double w = 1.0 / double(local_accum);
        moe.aux += f.aux * w;
        moe.z += f.z * w;
        moe.dropped += f.dropped * w;
        moe.load_max = std::max(moe.load_max, f.load_max);
        add_expert_load(*acts, expert_load);
      }
    }
    if (ddp_ && !pipe_) {
      comm_s = ddp_->wait_grads();
      loss = ddp_->sum_over_group(loss);
      loader.set_consumed_samples(step_first + B * accum);
    }
    // Tensor parallel: the gradients of replicated norms that each rank
    // summed over its own rows (sequence parallel) or heads (q/k norms).
    parallel::reduce_tensor_parallel_partial_grads(*model_);
    // The grads arena holds the trainable parameters only: frozen ones neither
    // count towards the norm nor get clipped. Model parallel: each rank's
    // pieces, the replicated parameters and the tied table once.
    // An objective's own model (PPO's critic) is clipped with this one.
    double norm = std::sqrt((model_parallel() ? model_parallel_grad_norm_squared()
                             : ddp_           ? ddp_->grad_norm_squared()
                                              : ops::sum_squares(model_->grads())) +
                            objective_->own_grad_norm_squared());
    if (!std::isfinite(loss) || !std::isfinite(norm))
      fail("step {}: non-finite {} ({}); stopping without saving", step + 1,
           std::isfinite(loss) ? "gradient norm" : "loss", std::isfinite(loss) ? norm : loss);
    float clip = cfg_.grad_clip > 0 && norm > cfg_.grad_clip ? float(cfg_.grad_clip / norm) : 1.f;
    double lr = cfg_.lr.at(step);
    opt.step(lr, clip);
    objective_->own_step(lr, clip);
    if (ddp_) ddp_->gather_params();  // ZeRO-1: waited for by the next forward
    // Mixture of Experts: the step's expert loads over every rank's tokens,
    // which move the score-correction bias (aux-loss-free balancing). The
    // model's counts are its micro-batches' whole rows (summed over the cp
    // ranks' chunks, and the tp ranks' rows with whole experts): the
    // replicas' sum is over "dp".
    if (!expert_load.empty()) {
      if (dp > 1) {
        Tensor t = Tensor::empty({int64_t(expert_load.size())}, DType::F64);
        std::copy(expert_load.begin(), expert_load.end(), t.data<double>());
        par_.groups->get("dp").all_reduce(t, dist::ReduceOp::Sum);
        std::copy(t.data<double>(), t.data<double>() + expert_load.size(), expert_load.begin());
      }
      update_expert_bias(*model_, expert_load);
    }

    StepStats s;
    s.step = step + 1;
    s.loss = loss;
    s.lr = lr;
    s.grad_norm = norm;
    double dt = seconds_since(t0);
    profile.end_step(dt);
    s.step_ms = dt * 1e3;
    s.tokens_per_s = double(B * T * accum) / dt;
    s.mfu = flops_per_step / dt / (peak * double(par_.world()));
    s.comm_ms = comm_s * 1e3;
    s.peak_bytes = Allocator::get(model_->device()).peak_bytes();
    if (ddp_) s.grad_resident_bytes = ddp_->take_grad_peak();
    // The objective's own figures (preference rewards, ...), for the log and the record.
    ObjectiveMetrics figures = objective_->take_metrics(false);
    // Mixture of Experts: the balancing and z-losses (before their
    // coefficients), the busiest expert's load over the mean and the dropped
    // fraction, over this rank's micro-batches.
    if (model_->config().is_moe())
      figures.insert(figures.end(), {{"moe_aux", moe.aux},
                                     {"moe_z", moe.z},
                                     {"moe_load_max", moe.load_max},
                                     {"moe_dropped", moe.dropped}});
    // Per MoE layer, the busiest expert's tokens over the mean, over the step.
    if (!expert_load.empty()) {
      const std::vector<double> per_layer = expert_load_max(model_->config(), expert_load);
      for (size_t l = 0; l < per_layer.size(); ++l)
        if (model_->config().moe_layer(int64_t(l)))
          figures.emplace_back(fmt::format("moe_load_max.l{}", l), per_layer[l]);
    }
    // Expert parallel: the MoE layers' all-to-alls, forward and backward
    // (recomputes included), and their share of the step.
    if (a2a_seconds_)
      figures.insert(figures.end(),
                     {{"a2a_ms", *a2a_seconds_ * 1e3}, {"a2a_share", *a2a_seconds_ / dt}});
    ObjectiveMetrics val_figures;
    if (cfg_.val_every > 0 && (s.step % cfg_.val_every == 0 || s.step == cfg_.steps)) {
      if (objective_->online()) {  // no validation micro-batches: its own pass, if any
        if (ddp_) ddp_->finish_param_gathers();  // ZeRO-1: the whole updated model
        val_figures = objective_->validate(*model_);
      } else {
        s.val_loss = evaluate();
        val_figures = objective_->take_metrics(true);
      }
    }
    const bool eval_step = step_eval_ && ((cfg_.eval.every > 0 && s.step % cfg_.eval.every == 0) ||
                                          s.step == cfg_.steps);
    if (eval_step) {
      const auto eval_figures = step_eval_(s.step);
      figures.insert(figures.end(), eval_figures.begin(), eval_figures.end());
    }
    history_.push_back(s);
    state_.step = s.step;
    state_.consumed_samples = loader.consumed_samples();
    state_.optimizer_steps = opt.steps_done();
    state_.last_lr = lr;
    state_.rng = rng_streams(cfg_, state_.consumed_samples);

    if (par_.writes() && (s.step % cfg_.log_every == 0 || s.step == last_step ||
                          !std::isnan(s.val_loss) || !val_figures.empty() || eval_step)) {
      double elapsed = seconds_since(t_start);
      double eta = elapsed / double(s.step - first_step) * double(last_step - s.step);
      std::string val = std::isnan(s.val_loss) ? "" : fmt::format(" | val {:.4f}", s.val_loss);
      for (const auto& [name, v] : figures) val += fmt::format(" | {} {:.4f}", name, v);
      // An online objective's validation (the others' are in the record).
      if (std::isnan(s.val_loss))
        for (const auto& [name, v] : val_figures) val += fmt::format(" | val_{} {:.4f}", name, v);
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
    for (const auto& [name, v] : figures) record.emplace_back(name, v);
    for (const auto& [name, v] : val_figures) record.emplace_back("val_" + name, v);
    if (ddp_ || pp_replicas) record.emplace_back("comm_ms", s.comm_ms);
    if (ddp_ && ddp_->shards_grads())
      record.emplace_back("grad_resident_bytes", double(s.grad_resident_bytes));
    // Pipeline parallel: this stage's waits on its neighbours (rank 0's: the first stage).
    if (pipe_) record.emplace_back("pp_wait_ms", pp_wait_s * 1e3);
    // At log steps, each MoE layer's tokens per expert over the step
    // (routed pairs before dropping, every rank's): "moe_tokens.lL": [E].
    std::vector<std::pair<std::string, std::vector<double>>> arrays;
    if (!expert_load.empty() && (s.step % cfg_.log_every == 0 || s.step == last_step)) {
      const size_t E = size_t(model_->config().num_experts);
      for (int64_t l = 0; l < model_->config().n_layer; ++l)
        if (model_->config().moe_layer(l))
          arrays.emplace_back(
              fmt::format("moe_tokens.l{}", l),
              std::vector<double>(expert_load.begin() + ptrdiff_t(size_t(l) * E),
                                  expert_load.begin() + ptrdiff_t(size_t(l + 1) * E)));
    }
    if (metrics) metrics->write(record, arrays);
    if (events) events->add_scalars(s.step, {record.begin() + 1, record.end()});  // all but step
    if (on_step) on_step(s);
    // Every rank stops after the same step, whichever of them got the signal.
    const int sig = max_over_ranks(stop_signal());
    if (sig != 0) return stop(sig, fmt::format("after step {}", s.step));
    if (cfg_.save_every > 0 && s.step % cfg_.save_every == 0) save_checkpoint_now();
  }
  // Every rank's table, printed by rank 0 (the ranks' own prints would
  // interleave line by line under mpirun), which also writes
  // OUT_DIR/profile.json.
  StepProfile::Gather gather;
  if (par_.active())
    gather = [&](const std::string& mine) {
      return dist::all_gather_strings(par_.groups->get("world"), mine);
    };
  profile.report(par_.writes() ? cfg_.out_dir + "/profile.json" : "",
                 par_.mesh ? par_.mesh->rank() : 0, par_.world(), gather);
  // train.save_final=false: a run kept for its metrics only ends here,
  // unless it stopped early at train.exit_at_step (whose point is the save).
  if (!cfg_.save_final && cfg_.exit_at_step == 0) return;
  if (saved_step_ != state_.step) save_checkpoint_now();
  export_final();
}

}  // namespace nk
