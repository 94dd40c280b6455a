// The Trainer's writes out of the step loop: checkpoints (the whole model
// gathered under tensor and pipeline parallelism, each rank's shard under
// ZeRO-1 and FSDP), the bf16 masters lent back for them, and the final model
// and adapter export.
#include <chrono>
#include <filesystem>

#include "ckpt/checkpoint.h"
#include "ckpt/model_io.h"
#include "ckpt/peft_adapter.h"
#include "core/atomic_file.h"
#include "core/log.h"
#include "data/chat/chat_template.h"
#include "data/tokenizer/tokenizer.h"
#include "parallel/model_parallel.h"
#include "train/train_checkpoint.h"
#include "train/trainer.h"

namespace nk {

namespace {

// Whether arena element `at` belongs to a split expert tensor (Split::Experts).
bool is_expert_element(const ParamLayout& layout, int64_t at) {
  for (const ParamInfo& p : layout.params())
    if (at >= p.offset && at < p.offset + p.numel()) return p.split == Split::Experts;
  return false;
}

// Each data-parallel rank's blocks of the trainable f32 weights `blocks`
// (the groups' shards: ZeRO-1, FSDP), summed over `group` into the whole
// arena on every rank; the frozen ones, whole everywhere, are copied.
// Split experts (`experts`: the expert-dp group, layout: the model's): the
// experts' blocks tile each ep rank's own experts, so they are summed over
// `experts` instead (a group's shard lies in one bucket: all experts' or none).
Tensor join_blocks(const Tensor& blocks, const std::vector<ParamGroup>& groups,
                   int64_t trainable_end, dist::Communicator& group,
                   dist::Communicator* experts = nullptr, const ParamLayout* layout = nullptr) {
  Tensor out = Tensor::zeros({blocks.numel()}, DType::F32);
  Tensor ex = experts ? Tensor::zeros({blocks.numel()}, DType::F32) : Tensor();
  for (const ParamGroup& g : groups)
    if (g.trainable && g.shard_size() > 0) {
      const bool expert = experts && is_expert_element(*layout, g.shard_begin);
      ops::convert((expert ? ex : out).narrow0(g.shard_begin, g.shard_size()),
                   blocks.narrow0(g.shard_begin, g.shard_size()));
    }
  group.all_reduce(out);
  if (experts) {
    experts->all_reduce(ex);
    ops::accumulate(out, ex);
  }
  const int64_t frozen = out.numel() - trainable_end;
  if (frozen > 0)
    ops::convert(out.narrow0(trainable_end, frozen), blocks.narrow0(trainable_end, frozen));
  return out;
}

}  // namespace

Trainer::MastersOnLoan::MastersOnLoan(Transformer& model, const AdamW* opt,
                                      dist::Communicator* join, dist::Communicator* experts)
    : model_(opt && opt->master_in_compute() ? &model : nullptr) {
  if (!model_) return;
  Tensor masters = opt->masters_f32();
  if (join)
    masters = join_blocks(masters, opt->groups(), model.layout().trainable_end(), *join, experts,
                          &model.layout());
  model_->adopt_masters(std::move(masters));
}

Trainer::MastersOnLoan::~MastersOnLoan() {
  if (model_) model_->release_masters();
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
  objective_->save_state(state_.step);  // first: a checkpoint found has its objective's state
  save_checkpoint_files();
  objective_->checkpoint_saved(state_.step);
}

void Trainer::save_checkpoint_files() {
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [t0] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  if (ddp_) ddp_->finish_param_gathers();  // the weights it writes
  check_weights_finite();
  std::string dir;
  if (pieces_model()) {  // the whole model, gathered from the ranks' pieces
    // (A bf16 master, split experts only: lent as f32, joined under ZeRO-1.)
    const bool sharded = ddp_ && ddp_->sharded();
    MastersOnLoan masters(*model_, opt_.get(), sharded ? &ddp_->group() : nullptr,
                          sharded ? ddp_->expert_group() : nullptr);
    std::unique_ptr<Transformer> whole = gather_whole_model(false);
    const Tensor m =
        parallel::gather_model(*model_, replica_state(opt_->m_f32()), par_.group("pp"));
    const Tensor v =
        parallel::gather_model(*model_, replica_state(opt_->v_f32()), par_.group("pp"));
    if (par_.writes()) dir = save_train_checkpoint(cfg_, *whole, m, v, opt_->steps_done(), state_);
    par_.groups->get("world").barrier();  // installed before any rank goes on
    saved_step_ = state_.step;
    if (par_.writes()) NK_INFO("saved checkpoint {} ({:.2f} s)", dir, seconds());
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
  NK_INFO("saved checkpoint {} ({:.2f} s)", dir, seconds());
}

Tensor Trainer::replica_state(const Tensor& state) {
  if (!ddp_ || !ddp_->sharded()) return state;
  // Each data-parallel rank holds its blocks of every trainable group; the
  // blocks tile the arena, so a sum over the ranks puts them together (split
  // experts': over the expert-dp ranks, see join_blocks).
  Tensor out = Tensor::zeros({model_->layout().trainable_end()}, DType::F32);
  for (size_t i = 0; i < opt_->groups().size(); ++i) {
    const ParamGroup& g = opt_->groups()[i];
    if (!g.trainable || g.shard_size() == 0) continue;
    ops::convert(out.narrow0(g.shard_begin, g.shard_size()),
                 state.narrow0(opt_->state_offset(i), g.shard_size()));
  }
  return join_blocks(out, opt_->groups(), out.numel(), ddp_->group(), ddp_->expert_group(),
                     &model_->layout());
}

Tensor Trainer::replica_weights() {
  if (!ddp_ || !ddp_->shards_master()) return model_->params();
  return join_blocks(model_->params(), opt_->groups(), model_->layout().trainable_end(),
                     ddp_->group(), ddp_->expert_group(), &model_->layout());
}

std::unique_ptr<Transformer> Trainer::gather_whole_model(bool with_base, bool everywhere) {
  const ParamLayout& mine = model_->layout();
  const bool masters = model_->frozen_weights() == FrozenWeights::Master;
  Tensor local = replica_weights();
  if (!masters) {
    // A base held without masters (bf16 alone, or QLoRA's NF4): the f32
    // arena starts with the trainable parameters (then, in f32 compute, the
    // frozen dense ones). A checkpoint holds those alone (the base is
    // train.init_from's, read again on resume); the export, the bf16 base
    // too, gathered through f32.
    const Tensor trainable = local.narrow0(0, mine.trainable_end());
    local = trainable;
    if (with_base) {
      NK_CHECK(model_->frozen_weights() == FrozenWeights::Compute,
               "gather_whole_model: the base of a model held as {} is not exported",
               model_->frozen_weights() == FrozenWeights::Nf4 ? "NF4" : "quantised");
      local = Tensor::empty({mine.total()}, DType::F32, model_->device());
      ops::convert(local.narrow0(0, trainable.numel()), trainable);
      for (const ParamInfo& p : mine.params())
        if (!p.trainable) ops::convert(ParamLayout::view(local, p), model_->param_f32(p));
    }
  }
  const Tensor params = parallel::gather_model(*model_, local, par_.group("pp"));
  if (!par_.writes() && !everywhere) return nullptr;
  auto whole = std::make_unique<Transformer>(cfg_.model, cfg_.dtype, cfg_.seed, ParamInit::Zeros,
                                             cfg_.frozen, kHost, model_->frozen_weights());
  if (masters) {
    ops::convert(whole->params(), params);
  } else {
    const ParamLayout& all = whole->layout();
    ops::convert(whole->params().narrow0(0, all.trainable_end()),
                 params.narrow0(0, all.trainable_end()));
    if (with_base)
      for (const ParamInfo& p : all.params())
        if (!p.trainable) whole->set_param(p, ParamLayout::view(params, p));
  }
  whole->sync_compute_params();
  return whole;
}

void Trainer::export_final() {
  if (ddp_) ddp_->gather_full_weights();  // FSDP: rank 0 exports the whole model
  // Tensor parallel: rank 0 exports the whole model, gathered from the shards
  // (a bf16 master, split experts only, lent as f32 for it).
  // An NF4 base is not saved (it is train.init_from's, quantised): QLoRA's
  // result is its adapter.
  const bool whole_model = model_->frozen_weights() != FrozenWeights::Nf4;
  std::unique_ptr<Transformer> whole;
  if (pieces_model()) {
    const bool sharded = ddp_ && ddp_->sharded();
    MastersOnLoan masters(*model_, opt_.get(), sharded ? &ddp_->group() : nullptr,
                          sharded ? ddp_->expert_group() : nullptr);
    whole = gather_whole_model(whole_model);
  }
  // A bf16 master sharded by ZeRO-1 or FSDP is joined on every rank (collective).
  dist::Communicator* join = ddp_ && ddp_->sharded() ? &ddp_->group() : nullptr;
  std::optional<MastersOnLoan> masters;
  if (whole_model && !pieces_model() && (join || par_.writes()))
    masters.emplace(*model_, opt_.get(), join);
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
    save_peft_adapter(adapter_dir, exported, cfg_.init_from);
    if (cfg_.model.bottleneck.enabled())
      NK_INFO("saved the bottleneck adapters in Nekton's format (PEFT has none) to {}",
              adapter_dir);
    else
      NK_INFO("saved the {} adapter in Hugging Face PEFT's format to {}",
              adapter_method(cfg_.model), adapter_dir);
  }
  if (!whole_model) return;
  if (!cfg_.data.tokenizer.empty()) store_tokenizer(cfg_.data.tokenizer, model_dir);
  // A template named by data.chat_template (a built-in or a file) is kept with
  // the tuned model, so that generate and serve (template auto) format chats
  // as it was trained; it takes precedence over the base's own.
  if (!cfg_.data.chat_template.empty() && cfg_.data.chat_template != "auto")
    write_file_atomic(model_dir + "/chat_template.jinja",
                      chat_template_for(cfg_.data.chat_template, cfg_.init_from)->jinja());
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
