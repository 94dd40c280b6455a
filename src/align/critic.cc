#include "align/critic.h"

#include <unistd.h>

#include <filesystem>

#include "ckpt/checkpoint.h"
#include "ckpt/hf_io.h"
#include "ckpt/model_io.h"
#include "core/error.h"
#include "core/log.h"
#include "data/tokenizer/tokenizer.h"
#include "ops/ops.h"
#include "train/train_checkpoint.h"

namespace nk {

namespace fs = std::filesystem;

namespace {

// A Hugging Face folder imported into a temporary folder for the load,
// removed after it (nothing is left in OUT_DIR by a refused run).
struct ImportedCritic {
  std::string dir;  // the model folder to read
  std::string tmp;  // the temporary import, or empty
  explicit ImportedCritic(const std::string& from) : dir(from) {
    if (!is_hf_model_folder(from)) return;
    tmp = (fs::temp_directory_path() / fmt::format("nk_critic_{}_{}", ::getpid(), uintptr_t(this)))
              .string();
    HfImportOptions o;
    o.storage = DType::F32;
    try {
      import_hf(from, tmp, o);
    } catch (const Error& e) {
      fs::remove_all(tmp);
      throw e.with_context("align.value_model");
    }
    dir = tmp;
  }
  ~ImportedCritic() {
    std::error_code ec;
    if (!tmp.empty()) fs::remove_all(tmp, ec);
  }
};

}  // namespace

Critic::Critic(const TrainConfig& run, const std::string& dir, int64_t policy_vocab) : cfg_(run) {
  if (dir.empty() || !fs::exists(fs::path(dir) / "config.json"))
    fail("align.value_model: '{}' is not a model folder (no config.json)", dir);
  const ModelConfig saved = any_model_folder_config(dir);
  if (saved.classifier() && saved.num_labels != 1)
    fail(
        "align.value_model: '{}' is a sequence classifier of {} labels; a critic is one of 1 (a "
        "reward model) or a causal LM (given a score head)",
        dir, saved.num_labels);
  if (saved.vocab_size != policy_vocab)
    fail(
        "align.value_model: '{}' has a vocabulary of {} ids, the policy one of {}; the critic "
        "reads the policy's tokens (start it from a model of the policy's tokenizer)",
        dir, saved.vocab_size, policy_vocab);
  if (saved.has_adapters())
    fail("align.value_model: '{}' holds adapters; merge them first (nekton export hf --merge-lora)",
         dir);
  if (saved.value_head)
    fail("align.value_model: '{}' is a policy with a value head, not a critic's start", dir);
  const ImportedCritic from(dir);  // checked first: a refused critic is not imported
  ModelConfig mc = read_model_config(from.dir);
  mc.num_labels = 1;
  cfg_.model = mc;
  cfg_.out_dir = (fs::path(run.out_dir) / "critic").string();
  cfg_.init_from = dir;
  cfg_.freeze.clear();
  cfg_.frozen.clear();
  cfg_.frozen_weights = FrozenWeights::Master;
  cfg_.adamw.precision = OptimPrecision();  // f32 master, moments and gradients
  model_ = load_run_model(cfg_, from.dir, "align.value_model");
  model_->zero_grads();
  opt_ = std::make_unique<AdamW>(*model_, cfg_.adamw);
  acts_ = std::make_unique<Activations>(*model_, run.micro_batch, run.seq_len, true);
  NK_INFO("align: critic = {} ({}, {:.2f}M parameters){}", dir,
          saved.classifier() ? "a reward model's score head read at every token"
                             : "a causal LM's trunk with a new score head",
          double(model_->params().numel()) / 1e6,
          saved.classifier() ? "" : ", the head drawn from the seed");
  // Beside the policy's (the Trainer's memory line counts the policy alone).
  const bool copy = model_->compute_params().raw() != model_->params().raw();
  const double mib = 1048576.0;
  NK_INFO(
      "align: critic's memory per rank: weights {:.1f} MiB, gradients {:.1f} MiB, optimizer "
      "state {:.1f} MiB, activations {:.1f} MiB per micro-batch",
      double(model_->params().nbytes() + (copy ? model_->compute_params().nbytes() : 0)) / mib,
      double(model_->grad_bytes()) / mib, double(opt_->state_bytes()) / mib,
      double(acts_->bytes()) / mib);
}

void Critic::forward(const Tensor& tokens, std::span<float> out) {
  if (!acts_ || acts_->B != tokens.dim(0) || acts_->T != tokens.dim(1))
    acts_ = std::make_unique<Activations>(*model_, tokens.dim(0), tokens.dim(1), true);
  model_->embed_forward(*acts_, tokens);
  model_->blocks_forward(*acts_, 0, model_->config().n_layer);
  model_->token_scores_forward(*acts_, out);
}

void Critic::backward(const Tensor& tokens, std::span<const float> dvalues) {
  NK_CHECK(acts_, "Critic::backward before forward");
  model_->token_scores_backward(*acts_, dvalues);
  model_->blocks_backward(*acts_, 0, model_->config().n_layer);
  model_->embed_backward(*acts_, tokens);
}

double Critic::reduce_grads(const std::function<void(Tensor&)>& sum) {
  Tensor g = model_->grads();
  if (sum) sum(g);
  return ops::sum_squares(g);
}

void Critic::step(double lr, float clip) {
  opt_->step(lr, clip);
  model_->zero_grads();
}

void Critic::save_checkpoint(int64_t step, bool writes) {
  if (!writes) return;
  TrainerState s;
  s.step = step;
  s.optimizer_steps = opt_->steps_done();
  s.lr = cfg_.lr;
  const std::string dir = save_train_checkpoint(cfg_, *model_, *opt_, s);
  NK_INFO("saved the critic's checkpoint {}", dir);
}

void Critic::load_checkpoint(int64_t step) {
  // Beside the checkpoint the policy resumes (train.resume_from's run, else
  // this one's; cfg_.out_dir is this run's OUT/critic).
  const std::string root =
      cfg_.resume_from.empty()
          ? cfg_.checkpoint_root()
          : (fs::path(cfg_.resumed_run_dir()) / "critic" / "checkpoints").string();
  std::string dir;
  for (const std::string& d : list_checkpoints(root))
    if (checkpoint_step(d) == step) dir = d;
  if (dir.empty())
    fail(
        "align.value_model: resuming at step {} needs the critic's checkpoint of that step in "
        "'{}' (written with the policy's); it is missing",
        step, root);
  LoadedTrainCheckpoint c = load_train_checkpoint(dir, cfg_);
  model_ = std::move(c.model);
  model_->zero_grads();
  acts_.reset();
  opt_ = std::make_unique<AdamW>(*model_, cfg_.adamw);
  opt_->load_arena_state(c.exp_avg, c.exp_avg_sq, c.state.optimizer_steps);
  NK_INFO("align: the critic resumed from {}", dir);
}

void Critic::export_model() {
  const std::string dir = (fs::path(cfg_.out_dir) / "model").string();
  save_model(dir, *model_);
  if (!cfg_.data.tokenizer.empty()) store_tokenizer(cfg_.data.tokenizer, dir);
  NK_INFO("saved the critic to {}", dir);
}

}  // namespace nk
