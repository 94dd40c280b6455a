#include "train/train_config.h"

#include <filesystem>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_io.h"
#include "ckpt/model_io.h"
#include "core/limits.h"
#include "data/dataset/text_dataset.h"
#include "data/tokenizer/tokenizer.h"
#include "train/freeze.h"

namespace nk {

void TrainConfig::bind(ConfigBinder& b) {
  bind_model_keys(b, model);
  data.bind(b);
  b.bind_with<std::string>("train.dtype", dtype_name(dtype),
                           "compute precision: bf16 (fp32 master weights) or f32",
                           [&](const std::string& s) {
                             dtype = parse_dtype(s);
                             if (dtype != DType::F32 && dtype != DType::BF16)
                               fail("train.dtype: expected bf16 or f32, got '{}'", s);
                           });
  b.bind_with<std::string>("train.device", device_name(device),
                           "where the model, optimizer state and activations live: cpu, or cuda "
                           "(a build with the CUDA backend on a machine with a GPU)",
                           [&](const std::string& s) { device = parse_device(s, "train.device"); });
  b.bind("train.micro_batch", micro_batch, "sequences per forward/backward pass");
  b.bind("train.seq_len", seq_len, "tokens per sequence");
  b.bind("train.global_batch", global_batch,
         "sequences per optimizer step (multiple of micro_batch)");
  b.bind("train.steps", steps, "optimizer steps");
  b.bind("train.lr", lr.lr, "peak learning rate");
  b.bind("train.min_lr", lr.min_lr, "learning rate at the end of the cosine decay");
  b.bind("train.warmup_steps", lr.warmup_steps, "linear warmup steps");
  b.bind("train.decay_steps", lr.decay_steps,
         "step where cosine decay reaches min_lr (0 = train.steps)");
  b.bind("train.weight_decay", adamw.weight_decay, "AdamW decoupled weight decay (matrices only)");
  b.bind("train.beta1", adamw.beta1, "AdamW beta1");
  b.bind("train.beta2", adamw.beta2, "AdamW beta2");
  b.bind("train.eps", adamw.eps, "AdamW epsilon");
  b.bind("train.grad_clip", grad_clip, "clip the global gradient norm to this (0 = off)");
  b.bind("train.recompute", recompute,
         "activation recompute: none, selective (the norms' and MLP activation's outputs are "
         "recomputed in the backward) or full (each layer keeps only its input and reruns its "
         "forward); the same gradients, less activation memory");
  b.bind("train.recompute_layers", recompute_layers,
         "with train.recompute: the first N layers recompute, the rest keep everything (0: all)");
  b.bind("train.freeze", freeze,
         "parameters to freeze (no gradient, no optimizer state): comma-separated glob "
         "patterns over names such as wte, h.*.attn.*, lm_head.weight (a tied head "
         "follows wte)");
  b.bind("peft.method", peft.method,
         "parameter-efficient fine-tuning: none (train every unfrozen weight), lora, qlora "
         "(LoRA over a base held in 4-bit NF4; needs train.init_from), ia3, adapter (NeMo's "
         "bottleneck adapters) or p_tuning (virtual prompt tokens from an MLP encoder; "
         "data.sft_path, unpacked); all but none freeze the base weights");
  b.bind("peft.lora_rank", peft.lora.rank, "LoRA rank r");
  b.bind("peft.lora_alpha", peft.lora.alpha, "LoRA alpha: adapters scale by alpha / r");
  b.bind("peft.lora_dropout", peft.lora.dropout, "dropout on the LoRA adapters' input");
  b.bind("peft.use_rslora", peft.lora.rslora,
         "rank-stabilised LoRA: scale by alpha / sqrt(r) instead of alpha / r");
  b.bind("peft.target_modules", peft.target_modules,
         "modules to adapt, comma-separated: Hugging Face names (q_proj, k_proj, v_proj, "
         "o_proj, gate_proj, up_proj, down_proj; GPT-2's c_attn, c_proj, c_fc), Megatron's "
         "(linear_qkv, linear_proj, linear_fc1, linear_fc2) or all-linear; default: linear_qkv "
         "for LoRA, PEFT's for IA3 (k_proj, v_proj, down_proj; GPT-2: c_attn, mlp.c_proj), "
         "NeMo's for adapters (linear_proj, linear_fc2)");
  b.bind("peft.train_router", peft.lora.train_router,
         "Mixture of Experts with LoRA: train the routers' weights with the adapters (saved as "
         "PEFT's modules_to_save); false: frozen, as every base weight");
  b.bind("peft.feedforward_modules", peft.feedforward_modules,
         "IA3: the target modules scaled on their input rather than their output (with the "
         "default targets: down_proj; GPT-2: mlp.c_proj)");
  b.bind("peft.adapter_dim", peft.adapter_dim, "bottleneck adapters: the bottleneck's width");
  b.bind("peft.num_virtual_tokens", peft.num_virtual_tokens,
         "p-tuning: virtual tokens before every sample (they count in train.seq_len)");
  b.bind("peft.encoder_hidden_size", peft.encoder_hidden_size,
         "p-tuning: the MLP prompt encoder's hidden width (0: the model's, as PEFT)");
  // As an int64 key: a negative seed wraps, as it always has.
  b.bind_with<int64_t>("train.seed", int64_t(seed), "seed for initialisation and data order",
                       [&](int64_t v) { seed = uint64_t(v); });
  b.bind("train.threads", threads, "CPU threads (0 = all cores)");
  b.bind("train.val_every", val_every, "validation loss every N steps (0 = never)");
  b.bind("train.val_batches", val_batches, "micro-batches per validation");
  b.bind("train.log_every", log_every, "log line every N steps");
  b.bind("train.eval_tasks", eval.tasks,
         "benchmark tasks, groups or tags (as nekton eval tasks' eval.tasks) run on the live "
         "model during training, logged as eval/TASK/METRIC");
  b.bind("train.eval_tasks_every", eval.every,
         "with train.eval_tasks: every N steps and at the last (0 = the last step only)");
  b.bind("train.eval_data", eval.data, "with train.eval_tasks: the tasks' documents (eval.data)");
  b.bind("train.eval_task_dir", eval.task_dir,
         "with train.eval_tasks: folder of task YAMLs (default: the built-in ones)");
  b.bind(
      "train.eval_tokenizer", eval.tokenizer,
      "with train.eval_tasks: the tokenizer for the prompts (default: data.tokenizer, or bytes)");
  b.bind("train.eval_limit", eval.limit,
         "with train.eval_tasks: score only each task's first N documents (0 = all)");
  b.bind("train.eval_num_fewshot", eval.num_fewshot,
         "with train.eval_tasks: few-shot examples per prompt (-1 = each task's own)");
  b.bind("train.eval_batch_size", eval.batch_size, "with train.eval_tasks: requests per forward");
  b.bind("train.out_dir", out_dir, "output folder: model/, metrics.jsonl");
  b.bind("train.init_from", init_from,
         "a saved model folder to start from (fine-tuning): its config replaces model.*, its "
         "weights the initialisation, its tokenizer the default data.tokenizer");
  b.bind("train.resume_from", resume_from,
         "continue from this run's OUT_DIR (its newest checkpoint), a checkpoint folder, or "
         "an old model/ folder (weights and data position only)");
  b.bind("train.resume", resume,
         "when OUT_DIR/checkpoints exists: auto = continue from the newest valid one, "
         "never = stop with an error");
  b.bind("train.save_every", save_every,
         "save a full checkpoint every N steps in OUT_DIR/checkpoints (0 = only at the end)");
  b.bind("train.save_final", save_final,
         "after the last of train.steps, save a checkpoint and export OUT_DIR/model (false: "
         "timing runs and sweeps that keep only metrics; train.exit_at_step and SIGTERM still "
         "save)");
  b.bind("train.keep_checkpoints", keep_checkpoints,
         "keep the newest N checkpoints, delete older ones");
  b.bind("train.exit_at_step", exit_at_step,
         "stop after this step, saving a checkpoint and the model (0 = run all train.steps)");
  b.bind("train.metrics_file", metrics_file, "JSONL metrics path (default: OUT_DIR/metrics.jsonl)");
  b.bind("train.tensorboard", tensorboard,
         "also write the metrics' scalars as a TensorBoard event file "
         "(events.out.tfevents.*) beside train.metrics_file");
  b.bind("train.peak_tflops", peak_tflops, "hardware peak for MFU (0 = measure the GEMM peak)");
  b.bind("train.profile", profile,
         "time every kernel and print where a step's time goes, kernel by kernel (mean over "
         "the steps after the first; on CUDA each kernel's device time between events), also "
         "written to OUT_DIR/profile.json");
  OptimPrecision& pr = adamw.precision;
  auto dtype_key = [&](const char* key, DType& field, std::vector<DType> allowed, const char* doc) {
    b.bind_with<std::string>(key, dtype_name(field), doc,
                             [&field, key, allowed](const std::string& s) {
                               std::string names;
                               for (DType d : allowed) {
                                 if (s == dtype_name(d)) {
                                   field = d;
                                   return;
                                 }
                                 names += (names.empty() ? "" : ", ") + std::string(dtype_name(d));
                               }
                               fail("{}: '{}' is not one of {}", key, s, names);
                             });
  };
  dtype_key("optim.master_dtype", pr.master, {DType::F32, DType::BF16},
            "master weights: f32 (an f32 copy beside the bf16 weights) or bf16 (train.dtype=bf16 "
            "only: the bf16 weights are the master, with optim.master_compensation's remainder "
            "instead of the f32 copy)");
  b.bind("optim.master_compensation", pr.compensation,
         "with optim.master_dtype=bf16: keep the 16 bits each update rounds away, so the master is "
         "f32-exact (false: plain bf16 master weights, which drift)");
  dtype_key("optim.moment_dtype", pr.moments, {DType::F32, DType::BF16, DType::F16},
            "AdamW moments: f32, bf16 (rounded to nearest even) or f16 (m and sqrt(v), each with a "
            "per-tensor power-of-two scale); the update is computed in f32");
  dtype_key("optim.grad_dtype", pr.grads, {DType::F32, DType::BF16},
            "the gradient arena: f32, or bf16 (2 bytes per parameter; each backward stage "
            "adds its f32 gradients into it, rounded once; needs train.dtype=bf16, on the CPU, "
            "without tensor or pipeline parallelism)");
  parallel.bind(b);
  ddp.bind(b);
}

std::string TrainConfig::resumed_run_dir() const {
  if (resume_from.empty()) return out_dir;
  const std::filesystem::path from(resume_from);
  if (checkpoint_step(from.string()) >= 0 || std::filesystem::exists(from / "manifest.json"))
    return from.parent_path().parent_path().string();  // OUT/checkpoints/step_N
  return from.string();
}

ConfigSchema train_schema() {
  return schema_of([](ConfigBinder& b) { TrainConfig().bind(b); });
}

TrainConfig train_config_from(const Config& c, bool needs_data) {
  TrainConfig t;
  ConfigReader r(c);
  t.bind(r);
  if (!t.init_from.empty()) {
    // The saved model's shape, with this run's layout choice (not saved)
    // and, when given, its classifier head (a reward model from a causal LM).
    const int64_t divisible_by = t.model.make_vocab_size_divisible_by;
    const int64_t num_labels = t.model.num_labels;
    const std::vector<std::string> labels = t.model.labels;
    const std::string cfg_path = t.init_from + "/config.json";
    if (!std::filesystem::exists(cfg_path))
      fail("train.init_from: '{}' is not a saved model folder (no config.json)", t.init_from);
    // A Hugging Face folder: its config mapped as import does; its
    // tokenizer files are in the folder itself.
    t.model = any_model_folder_config(t.init_from);
    if (t.data.tokenizer.empty())
      t.data.tokenizer =
          is_hf_model_folder(t.init_from) ? t.init_from : stored_tokenizer(t.init_from);
    t.model.make_vocab_size_divisible_by = divisible_by;
    if (num_labels > 0) {
      t.model.num_labels = num_labels;
      t.model.labels = labels;
      try {
        t.model.validate();
      } catch (const Error& e) {
        throw e.with_context("train.init_from");
      }
    }
  }
  if (t.data.tokenizer.empty() && (!t.data.path.empty() || t.data.sft()))
    t.data.tokenizer = "bytes";
  if (t.resume != "auto" && t.resume != "never")
    fail("train.resume: expected auto or never, got '{}'", t.resume);
  if (t.lr.decay_steps == 0) t.lr.decay_steps = t.steps;
  if (t.metrics_file.empty()) t.metrics_file = t.out_dir + "/metrics.jsonl";
  t.config_yaml = c.to_yaml();
  t.parallel.check();
  t.ddp.check();

  // Positive and bounded (core/limits.h), so a typo like 2^62 is an error,
  // not a run that never ends.
  auto positive = [](const char* key, int64_t v, int64_t limit = limits::kBatch,
                     const char* what = "sequences") {
    if (v <= 0) fail("{}: must be positive, got {}", key, v);
    check_limit("", key, v, limit, what);
  };
  if (needs_data || t.data.indexed() || !t.data.path.empty() || t.data.sft())
    t.data.check_training_source();
  positive("train.micro_batch", t.micro_batch);
  positive("train.seq_len", t.seq_len, limits::kSeqLen, "positions");
  positive("train.global_batch", t.global_batch);
  positive("train.steps", t.steps, limits::kSteps, "steps");
  positive("train.val_batches", t.val_batches, limits::kBatch, "micro-batches");
  positive("train.log_every", t.log_every, limits::kSteps, "steps");
  check_limit("", "train.micro_batch x train.seq_len",
              checked_mul(t.micro_batch, t.seq_len, "train.micro_batch x train.seq_len"),
              limits::kBatchTokens, "tokens per micro-batch");
  if (t.global_batch % t.micro_batch)
    fail("train.global_batch: {} is not a multiple of train.micro_batch = {}", t.global_batch,
         t.micro_batch);
  if (t.seq_len > t.model.max_seq_len)
    fail("train.seq_len: {} exceeds model.max_seq_len = {}", t.seq_len, t.model.max_seq_len);
  if (!t.data.path.empty() && t.model.vocab_size < 257)
    fail("model.vocab_size: {} is smaller than the byte tokenizer's 257", t.model.vocab_size);
  if (!(t.lr.lr > 0)) fail("train.lr: must be positive, got {}", t.lr.lr);
  if (t.lr.min_lr < 0 || t.lr.min_lr > t.lr.lr)
    fail("train.min_lr: must be in [0, train.lr], got {}", t.lr.min_lr);
  if (t.lr.warmup_steps < 0) fail("train.warmup_steps: must be >= 0");
  if (!(t.adamw.beta1 >= 0 && t.adamw.beta1 < 1)) fail("train.beta1: must be in [0, 1)");
  if (!(t.adamw.beta2 >= 0 && t.adamw.beta2 < 1)) fail("train.beta2: must be in [0, 1)");
  if (!(t.adamw.eps > 0)) fail("train.eps: must be positive");
  if (t.adamw.weight_decay < 0) fail("train.weight_decay: must be >= 0");
  if (t.grad_clip < 0) fail("train.grad_clip: must be >= 0");
  const OptimPrecision& pr = t.adamw.precision;
  if (pr.master == DType::BF16 && t.dtype != DType::BF16)
    fail(
        "optim.master_dtype: bf16 needs train.dtype=bf16 (with train.dtype={} the weights the "
        "kernels read are the f32 master)",
        dtype_name(t.dtype));
  if (pr.grads == DType::BF16) {
    if (t.dtype != DType::BF16)
      fail("optim.grad_dtype: bf16 needs train.dtype=bf16 (train.dtype={})", dtype_name(t.dtype));
    if (pr.moments == DType::F16)
      fail(
          "optim.grad_dtype: bf16 does not go with optim.moment_dtype=f16 yet (f16 moments "
          "pick their scales over a whole group); use optim.moment_dtype=bf16 or f32");
    if (t.device != kHost)
      fail("optim.grad_dtype: bf16 runs on the CPU only for now (train.device={})",
           device_name(t.device));
  }
  const std::string& m = t.peft.method;
  if (m != "none" && m != "lora" && m != "qlora" && m != "ia3" && m != "adapter" && m != "p_tuning")
    fail("peft.method: expected none, lora, qlora, ia3, adapter or p_tuning, got '{}'", m);
  // (QLoRA keeps the routers dense: Transformer::layout_for.)
  if (t.peft.lora.train_router && m != "lora" && m != "qlora")
    fail(
        "peft.train_router: trains the routers beside LoRA adapters only (peft.method=lora or "
        "qlora), got peft.method={}",
        m);
  if (t.peft.adapters()) {
    if (!t.freeze.empty())
      fail("train.freeze: not used with peft.method={}, which freezes every base weight",
           t.peft.method);
    if (t.model.has_adapters())
      fail(
          "peft.method: the model of train.init_from already has adapters; merge them first "
          "(nekton export hf ... --merge-lora) or fine-tune it without peft.method");
    if (t.peft.lora_kind()) {
      t.model.lora = t.peft.lora;
      t.model.lora.target_modules = split_commas(t.peft.target_modules);
      if (t.model.lora.target_modules.empty()) t.model.lora.target_modules = {"linear_qkv"};
      if (t.peft.lora.rank <= 0) fail("peft.lora_rank: must be positive, got {}", t.peft.lora.rank);
    } else if (m == "adapter") {
      t.model.bottleneck.dim = t.peft.adapter_dim;
      t.model.bottleneck.target_modules = split_commas(t.peft.target_modules);
      if (t.model.bottleneck.target_modules.empty())
        t.model.bottleneck.target_modules = {"linear_proj", "linear_fc2"};
      if (t.peft.adapter_dim <= 0)
        fail("peft.adapter_dim: must be positive, got {}", t.peft.adapter_dim);
    } else if (m == "p_tuning") {
      if (!t.peft.target_modules.empty())
        fail("peft.target_modules: p-tuning adapts no module (its virtual tokens are inputs)");
      if (t.peft.num_virtual_tokens <= 0)
        fail("peft.num_virtual_tokens: must be positive, got {}", t.peft.num_virtual_tokens);
      if (t.peft.num_virtual_tokens >= t.seq_len)
        fail("peft.num_virtual_tokens: {} leaves no room for text in train.seq_len = {}",
             t.peft.num_virtual_tokens, t.seq_len);
      if (t.peft.encoder_hidden_size < 0)
        fail("peft.encoder_hidden_size: must be >= 0, got {}", t.peft.encoder_hidden_size);
      if (!t.data.sft())
        fail(
            "peft.method: p_tuning reads conversations (data.sft_path), whose rows leave room "
            "for the virtual tokens");
      if (t.data.pack)
        fail(
            "data.pack: p-tuning puts its virtual tokens before each sample, one per row; set "
            "data.pack=false");
      t.model.prompt.virtual_tokens = t.peft.num_virtual_tokens;
      t.model.prompt.encoder_hidden =
          t.peft.encoder_hidden_size ? t.peft.encoder_hidden_size : t.model.d_model;
    } else {
      t.model.ia3.target_modules = split_commas(t.peft.target_modules);
      t.model.ia3.feedforward_modules = split_commas(t.peft.feedforward_modules);
      if (t.model.ia3.target_modules.empty()) {
        if (!t.model.ia3.feedforward_modules.empty())
          fail("peft.feedforward_modules: give peft.target_modules with it");
        t.model.ia3 = default_ia3(t.model);
      }
    }
    validate_adapters(t.model, "peft.");
    const ParamLayout layout = Transformer::layout_for(t.model);
    // A classifier's score head trains with the adapters (PEFT's
    // modules_to_save for sequence classification).
    // peft.train_router: the routers too.
    for (const ParamInfo& p : layout.params())
      if (!added_to_base(p) &&
          !(t.model.lora.train_router && p.name.ends_with(".moe.router.weight")))
        t.frozen.push_back(p.name);
    if (t.peft.method == "qlora")
      t.frozen_weights = FrozenWeights::Nf4;
    else if (t.dtype == DType::BF16)
      t.frozen_weights = FrozenWeights::Compute;
  } else {
    if (t.model.ia3.enabled())
      fail(
          "train.init_from: the model has IA3 adapters, which train only over a frozen base; merge "
          "them first (nekton export hf ... --merge-lora, then nekton import hf)");
    if (t.model.bottleneck.enabled() || t.model.prompt.enabled())
      fail(
          "train.init_from: the model has {}, which train only over a frozen base and do not "
          "merge into it; start from the base model",
          t.model.prompt.enabled() ? "a p-tuning prompt" : "bottleneck adapters");
    t.frozen = match_frozen(Transformer::layout_for(t.model), t.freeze, "train.freeze");
  }
  recompute_plan(t.recompute, t.recompute_layers, t.model.n_layer);  // checks both keys
  if (t.val_every < 0) fail("train.val_every: must be >= 0");
  if (t.eval.every < 0) fail("train.eval_tasks_every: must be >= 0, got {}", t.eval.every);
  if (t.eval.limit < 0) fail("train.eval_limit: must be >= 0, got {}", t.eval.limit);
  if (t.eval.num_fewshot < -1)
    fail("train.eval_num_fewshot: must be >= -1, got {}", t.eval.num_fewshot);
  if (t.eval.batch_size < 1) fail("train.eval_batch_size: must be >= 1, got {}", t.eval.batch_size);
  if (!t.eval.tasks.empty() && t.eval.data.empty())
    fail("train.eval_data: train.eval_tasks needs the tasks' documents (train.eval_data=DIR)");
  if (t.out_dir.empty()) fail("train.out_dir: must not be empty");
  if (t.save_every < 0) fail("train.save_every: must be >= 0, got {}", t.save_every);
  positive("train.keep_checkpoints", t.keep_checkpoints, limits::kSteps, "checkpoints");
  if (t.exit_at_step < 0 || t.exit_at_step > t.steps)
    fail("train.exit_at_step: must be in [0, train.steps = {}], got {}", t.steps, t.exit_at_step);
  return t;
}

}  // namespace nk
