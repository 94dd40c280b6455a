#include "train/train_config.h"

#include "data/dataset/gpt_indices.h"
#include "train/freeze.h"

namespace nk {

ConfigSchema train_schema() {
  ConfigSchema s;
  add_model_keys(s);
  s.add_string("data.path", "",
               "UTF-8 text file (optionally .gz/.dz) to train on, byte-level tokens");
  s.add_string("data.prefix", "",
               "Megatron indexed dataset PREFIX (.bin/.idx) to train on (instead of data.path)");
  s.add_string("data.blend", "",
               "weighted indexed datasets: \"0.3,PREFIX1,0.7,PREFIX2\" (in YAML also a list)");
  s.add_string("data.split", "969,30,1",
               "train,valid,test weights over the documents of data.prefix / data.blend");
  s.add_string("data.tokenizer", "",
               "tokenizer that made the data (name, file or folder), kept with the saved model; "
               "default: bytes for data.path, none for indexed data");
  s.add_string("data.cache_dir", "",
               "folder for the cached sample indices (default: the dataset's folder/cache)");
  s.add_float("data.val_fraction", 0.05,
              "data.path only: last fraction of the tokens held out for validation");
  s.add_int("data.max_bytes", 0, "read at most this many bytes of the corpus (0 = all)");
  s.add_string("data.invalid_utf8", "error",
               "invalid UTF-8 in the corpus: error, or replace (with U+FFFD)");
  s.add_string("train.dtype", "bf16", "compute precision: bf16 (fp32 master weights) or f32");
  s.add_string("train.device", "cpu",
               "where the model, optimizer state and activations live: cpu (cuda needs a build "
               "with the CUDA backend)");
  s.add_int("train.micro_batch", 8, "sequences per forward/backward pass");
  s.add_int("train.seq_len", 256, "tokens per sequence");
  s.add_int("train.global_batch", 8, "sequences per optimizer step (multiple of micro_batch)");
  s.add_int("train.steps", 100, "optimizer steps");
  s.add_float("train.lr", 6e-4, "peak learning rate");
  s.add_float("train.min_lr", 6e-5, "learning rate at the end of the cosine decay");
  s.add_int("train.warmup_steps", 10, "linear warmup steps");
  s.add_int("train.decay_steps", 0, "step where cosine decay reaches min_lr (0 = train.steps)");
  s.add_float("train.weight_decay", 0.1, "AdamW decoupled weight decay (matrices only)");
  s.add_float("train.beta1", 0.9, "AdamW beta1");
  s.add_float("train.beta2", 0.95, "AdamW beta2");
  s.add_float("train.eps", 1e-8, "AdamW epsilon");
  s.add_float("train.grad_clip", 1.0, "clip the global gradient norm to this (0 = off)");
  s.add_string("train.freeze", "",
               "parameters to freeze (no gradient, no optimizer state): comma-separated glob "
               "patterns over names such as wte, h.*.attn.*, lm_head.weight (a tied head "
               "follows wte)");
  s.add_int("train.seed", 1234, "seed for initialisation and data order");
  s.add_int("train.threads", 0, "CPU threads (0 = all cores)");
  s.add_int("train.val_every", 50, "validation loss every N steps (0 = never)");
  s.add_int("train.val_batches", 4, "micro-batches per validation");
  s.add_int("train.log_every", 1, "log line every N steps");
  s.add_string("train.out_dir", "runs/train", "output folder: model/, metrics.jsonl");
  s.add_string("train.resume_from", "",
               "continue from this run's OUT_DIR (its newest checkpoint), a checkpoint folder, or "
               "an old model/ folder (weights and data position only)");
  s.add_string("train.resume", "auto",
               "when OUT_DIR/checkpoints exists: auto = continue from the newest valid one, "
               "never = stop with an error");
  s.add_int("train.save_every", 0,
            "save a full checkpoint every N steps in OUT_DIR/checkpoints (0 = only at the end)");
  s.add_int("train.keep_checkpoints", 3, "keep the newest N checkpoints, delete older ones");
  s.add_int("train.exit_at_step", 0,
            "stop after this step, saving a checkpoint and the model (0 = run all train.steps)");
  s.add_string("train.metrics_file", "", "JSONL metrics path (default: OUT_DIR/metrics.jsonl)");
  s.add_float("train.peak_tflops", 0, "hardware peak for MFU (0 = measure the GEMM peak)");
  dist::add_parallel_keys(s);
  parallel::add_ddp_keys(s);
  return s;
}

TrainConfig train_config_from(const Config& c) {
  TrainConfig t;
  t.model = model_config_from(c);
  t.dtype = parse_dtype(c.get_string("train.dtype"));
  if (t.dtype != DType::F32 && t.dtype != DType::BF16)
    fail("train.dtype: expected bf16 or f32, got '{}'", c.get_string("train.dtype"));
  t.device = parse_device(c.get_string("train.device"), "train.device");
  t.data_path = c.get_string("data.path");
  t.data_prefix = c.get_string("data.prefix");
  t.data_blend = c.get_string("data.blend");
  t.data_split = c.get_string("data.split");
  t.data_cache_dir = c.get_string("data.cache_dir");
  t.data_tokenizer = c.get_string("data.tokenizer");
  if (t.data_tokenizer.empty() && !t.data_path.empty()) t.data_tokenizer = "bytes";
  t.val_fraction = c.get_float("data.val_fraction");
  t.max_bytes = c.get_int("data.max_bytes");
  std::string bad_utf8 = c.get_string("data.invalid_utf8");
  if (bad_utf8 != "error" && bad_utf8 != "replace")
    fail("data.invalid_utf8: expected error or replace, got '{}'", bad_utf8);
  t.replace_invalid_utf8 = bad_utf8 == "replace";
  t.micro_batch = c.get_int("train.micro_batch");
  t.seq_len = c.get_int("train.seq_len");
  t.global_batch = c.get_int("train.global_batch");
  t.steps = c.get_int("train.steps");
  t.lr.lr = c.get_float("train.lr");
  t.lr.min_lr = c.get_float("train.min_lr");
  t.lr.warmup_steps = c.get_int("train.warmup_steps");
  t.lr.decay_steps = c.get_int("train.decay_steps");
  if (t.lr.decay_steps == 0) t.lr.decay_steps = t.steps;
  t.adamw.weight_decay = c.get_float("train.weight_decay");
  t.adamw.beta1 = c.get_float("train.beta1");
  t.adamw.beta2 = c.get_float("train.beta2");
  t.adamw.eps = c.get_float("train.eps");
  t.grad_clip = c.get_float("train.grad_clip");
  t.freeze = c.get_string("train.freeze");
  t.seed = uint64_t(c.get_int("train.seed"));
  t.threads = c.get_int("train.threads");
  t.val_every = c.get_int("train.val_every");
  t.val_batches = c.get_int("train.val_batches");
  t.log_every = c.get_int("train.log_every");
  t.out_dir = c.get_string("train.out_dir");
  t.resume_from = c.get_string("train.resume_from");
  t.resume = c.get_string("train.resume");
  if (t.resume != "auto" && t.resume != "never")
    fail("train.resume: expected auto or never, got '{}'", t.resume);
  t.save_every = c.get_int("train.save_every");
  t.keep_checkpoints = c.get_int("train.keep_checkpoints");
  t.exit_at_step = c.get_int("train.exit_at_step");
  t.metrics_file = c.get_string("train.metrics_file");
  if (t.metrics_file.empty()) t.metrics_file = t.out_dir + "/metrics.jsonl";
  t.peak_tflops = c.get_float("train.peak_tflops");
  t.config_yaml = c.to_yaml();
  t.parallel = dist::parallel_config(c);
  t.ddp = parallel::ddp_config(c);

  auto positive = [](const char* key, int64_t v) {
    if (v <= 0) fail("{}: must be positive, got {}", key, v);
  };
  int sources = !t.data_path.empty() + !t.data_prefix.empty() + !t.data_blend.empty();
  if (sources == 0)
    fail(
        "data.path: no training data given (data.path=TEXT_FILE, data.prefix=INDEXED_PREFIX or "
        "data.blend=W1,PREFIX1,W2,PREFIX2)");
  if (sources > 1)
    fail("data.{}: give only one of data.path, data.prefix and data.blend",
         t.data_blend.empty() ? "prefix" : "blend");
  if (!t.data_blend.empty()) t.blend = parse_blend(t.data_blend, "data.blend");
  if (t.indexed_data()) {
    try {
      parse_split(t.data_split);
    } catch (const Error& e) {
      throw e.with_context("data.split");
    }
  }
  positive("train.micro_batch", t.micro_batch);
  positive("train.seq_len", t.seq_len);
  positive("train.global_batch", t.global_batch);
  positive("train.steps", t.steps);
  positive("train.val_batches", t.val_batches);
  positive("train.log_every", t.log_every);
  if (t.global_batch % t.micro_batch)
    fail("train.global_batch: {} is not a multiple of train.micro_batch = {}", t.global_batch,
         t.micro_batch);
  if (t.seq_len > t.model.max_seq_len)
    fail("train.seq_len: {} exceeds model.max_seq_len = {}", t.seq_len, t.model.max_seq_len);
  if (!t.indexed_data() && t.model.vocab_size < 257)
    fail("model.vocab_size: {} is smaller than the byte tokenizer's 257", t.model.vocab_size);
  if (!(t.val_fraction >= 0 && t.val_fraction < 1))
    fail("data.val_fraction: must be in [0, 1), got {}", t.val_fraction);
  if (!(t.lr.lr > 0)) fail("train.lr: must be positive, got {}", t.lr.lr);
  if (t.lr.min_lr < 0 || t.lr.min_lr > t.lr.lr)
    fail("train.min_lr: must be in [0, train.lr], got {}", t.lr.min_lr);
  if (t.lr.warmup_steps < 0) fail("train.warmup_steps: must be >= 0");
  if (!(t.adamw.beta1 >= 0 && t.adamw.beta1 < 1)) fail("train.beta1: must be in [0, 1)");
  if (!(t.adamw.beta2 >= 0 && t.adamw.beta2 < 1)) fail("train.beta2: must be in [0, 1)");
  if (!(t.adamw.eps > 0)) fail("train.eps: must be positive");
  if (t.adamw.weight_decay < 0) fail("train.weight_decay: must be >= 0");
  if (t.grad_clip < 0) fail("train.grad_clip: must be >= 0");
  t.frozen = match_frozen(Transformer::layout_for(t.model), t.freeze, "train.freeze");
  if (t.val_every < 0) fail("train.val_every: must be >= 0");
  if (t.out_dir.empty()) fail("train.out_dir: must not be empty");
  if (t.save_every < 0) fail("train.save_every: must be >= 0, got {}", t.save_every);
  positive("train.keep_checkpoints", t.keep_checkpoints);
  if (t.exit_at_step < 0 || t.exit_at_step > t.steps)
    fail("train.exit_at_step: must be in [0, train.steps = {}], got {}", t.steps, t.exit_at_step);
  return t;
}

}  // namespace nk
