// The Trainer and another training objective (train_objective.h: the
// preference objectives of src/align) over the ranks: which layouts it
// trains under, its figures' and rows' sums over the mesh's groups
// (ObjectiveRanks), the distributed forward its reference is computed by
// where no rank holds whole rows (a pipeline stage, FSDP's shards, context
// parallel chunks), its own forward before each staged micro-batch, and for
// an online objective the ranks that share its generations and the policy
// gathered whole for them.
#include <algorithm>

#include "parallel/context_parallel_batch.h"
#include "parallel/model_parallel.h"
#include "train/trainer.h"

namespace nk {

void Trainer::check_objective_layout() const {
  // Another objective runs under data parallelism through its staged form,
  // under tensor parallelism as it is (every tp rank sums whole rows: the
  // vocabulary-parallel loss is reduced over them, and under sequence
  // parallelism the head gathers every row first), under pipeline
  // parallelism as the last stage's head (its rows whole there), and under
  // context parallelism where it sums each row's parts over the cp ranks
  // (splits_rows; with a pipeline, among the last stage's cp ranks). Under
  // expert parallelism every rank forwards the same number of micro-batches
  // (a step's, the reference's: every rank computes every sequence), so the
  // ep group's all-to-alls pair up.
  if (custom_objective_ && par_.active() && !objective_->staged())
    fail("parallel.*: this objective trains on one process for now ({} processes asked for)",
         par_.world());
  if (custom_objective_ && par_.active() && par_.cp() > 1 && !objective_->splits_rows())
    fail(
        "parallel.cp: this objective trains under data, tensor (and sequence), expert and "
        "pipeline parallelism for now (parallel.* lays {} processes out as {})",
        par_.world(), par_.mesh->describe());
}

ObjectiveRanks Trainer::objective_ranks(std::optional<Activations>& acts) {
  ObjectiveRanks ranks;
  ranks.writes = par_.writes();
  // A pipeline stage or FSDP's shards: a piece of the weights; context
  // parallel: the model forwards its cp rank's chunks of the rows.
  ranks.whole_model = !pipe_ && (!ddp_ || !ddp_->shards_weights()) && par_.cp() == 1;
  ranks.dp = par_.dp();
  ranks.dp_rank = par_.dp_rank();
  ranks.cp = par_.cp();
  const auto sum_over = [](dist::Communicator& c) {
    return [&c](std::span<double> v) {
      Tensor t = Tensor::empty({int64_t(v.size())}, DType::F64);
      std::copy(v.begin(), v.end(), t.data<double>());
      c.all_reduce(t, dist::ReduceOp::Sum);
      std::copy(t.data<double>(), t.data<double>() + v.size(), v.begin());
    };
  };
  // Tensor-parallel ranks hold the same figures: summed over the replicas
  // only (a pipeline's without data-parallel weights too: "dp-cp"); the
  // context-parallel ranks of a replica hold the whole rows' figures alike.
  const auto sum_tensor_over = [](dist::Communicator& c) {
    return [&c](Tensor& t) { c.all_reduce(t, dist::ReduceOp::Sum); };
  };
  if (par_.cp() > 1) {
    ranks.sum_over_sequence = sum_over(par_.groups->get("cp"));
    if (par_.dp() > 1) ranks.sum_over_ranks = sum_over(par_.groups->get("dp"));
  } else if (ddp_) {
    ranks.sum_over_ranks = sum_over(ddp_->group());
  } else if (pipe_ && par_.dp() * par_.cp() > 1)
    ranks.sum_over_ranks = sum_over(par_.groups->get("dp-cp"));
  // Online objectives: where every rank's model is whole (data parallel,
  // ZeRO-1) the replicas share the generations; where it is split by tensor
  // parallelism alone (sequence parallel, data-parallel replicas, ZeRO-1
  // and -2 included) each replica's tp group generates its share from its
  // pieces (the cached decode under TP: attention, multi-head latent
  // attention, MLPs and Mixture-of-Experts layers whose experts are split
  // over the tp ranks or whole, not over expert-parallel ones); where it
  // is otherwise in pieces, or forwards chunks of rows (context parallel),
  // every rank generates with the policy gathered whole.
  const bool pieces = pieces_model() || (ddp_ && ddp_->shards_weights()) || par_.cp() > 1;
  const bool tp_decode = objective_->online() && tensor_parallel().active() && par_.pp() == 1 &&
                         par_.cp() == 1 && !model_->experts_split() &&
                         !(ddp_ && ddp_->shards_weights());
  // An objective's own whole model: where the policy is whole, the
  // replicas' gradients summed over them; where it is in pieces, each
  // rank's head that adds rows of its own (tp rank 0 of the last stage,
  // every cp rank its chunks' positions) over every rank, the others adding
  // zeros, so every rank steps the same copy.
  if (pieces) {
    ranks.own_grads = par_.mesh->rank_in("tp") == 0 && model_->stage().head;
    ranks.sum_own_grads = sum_tensor_over(par_.groups->get("world"));
  } else if (ddp_) {
    ranks.sum_own_grads = sum_tensor_over(ddp_->group());
  }
  if (tp_decode) {
    ranks.generators = par_.dp();
    ranks.generator = par_.dp_rank();
    ranks.scores = par_.mesh->rank_in("tp") == 0;
    ranks.sum_over_generators = sum_over(par_.groups->get("world"));
  } else if (objective_->online() && pieces) {
    ranks.generators = par_.world();
    ranks.generator = par_.mesh->rank();
    ranks.sum_over_generators = sum_over(par_.groups->get("world"));
    ranks.whole_policy = [this](std::unique_ptr<Transformer> previous) {
      return whole_policy(std::move(previous));
    };
    dist::Communicator& peers = par_.groups->get(par_.cp() > 1 ? "tp-cp-pp" : "tp-pp");
    ranks.replica_peers = peers.size();
    ranks.replica_peer = peers.rank();
    if (peers.size() > 1) ranks.sum_over_replica_peers = sum_over(peers);
  } else {
    ranks.generators = par_.dp();
    ranks.generator = par_.dp_rank();
    ranks.sum_over_generators = ranks.sum_over_ranks;
  }
  ranks.replica_writes =
      par_.mesh->rank_in("tp") == 0 && par_.mesh->rank_in("pp") == 0 && par_.cp_rank() == 0;
  // The other stages hold zeros: a sum over the pipeline is the last one's.
  if (pipe_) ranks.from_last_stage = sum_over(par_.groups->get("pp"));
  if (!ranks.whole_model) {
    // A pipeline: the stages in turn, the last one's sums to every stage.
    // FSDP: the staged forward gathers each layer. Context parallel: this
    // rank's chunks of the rows at their global positions, the rows' sums
    // over the cp ranks.
    const int64_t cp = par_.cp(), cp_rank = par_.cp_rank();
    ranks.row_nll = [this, &acts, cp, cp_rank, rows = ranks.sum_over_sequence,
                     last = ranks.from_last_stage](const Tensor& tokens, const Tensor& targets,
                                                   std::span<double> nll) {
      Tensor x = tokens, y = targets;
      PackedBatchInfo chunks;
      if (cp > 1) {
        const int64_t B = tokens.dim(0), T = tokens.dim(1) / cp;
        x = Tensor::empty({B, T}, DType::I32);
        y = Tensor::empty({B, T}, DType::I32);
        parallel::cp_local_rows(tokens, x, cp_rank, cp);
        parallel::cp_local_rows(targets, y, cp_rank, cp);
        chunks.position_ids = Tensor::empty({B, T}, DType::I32);
        parallel::cp_local_positions(chunks.position_ids, cp_rank, cp);
      }
      std::fill(nll.begin(), nll.end(), 0.0);
      // ZeRO-1 under a pipeline: the schedule reads every weight.
      if (pipe_ && ddp_) ddp_->finish_param_gathers();
      const PackedBatchInfo* packed = cp > 1 ? &chunks : nullptr;
      if (pipe_)
        pipe_->forward_head(
            x, y,
            [&](Activations& a, int64_t, bool, float) {
              model_->head_row_nll(a, y, nll);
              return 0.0;
            },
            packed);
      else
        ddp_->forward_head(
            *acts, x,
            [&] {
              model_->head_row_nll(*acts, y, nll);
              return 0.0;
            },
            packed);
      rows(nll);
      last(nll);
    };
  }
  return ranks;
}

void Trainer::before_staged(Activations* a, const MicroBatch& mb, bool train) {
  using Head = std::function<double(Activations&)>;
  objective_->before_staged(*model_, mb, train, [&](const Head& head) {
    if (pipe_)
      return pipe_->forward_head(
          mb.tokens, mb.targets,
          [&](Activations& stage, int64_t, bool, float) { return head(stage); }, mb.packed);
    return ddp_->forward_head(
        *a, mb.tokens, [&] { return head(*a); }, mb.packed);
  });
}

std::unique_ptr<Transformer> Trainer::whole_policy(std::unique_ptr<Transformer> previous) {
  if (ddp_) ddp_->finish_param_gathers();
  const bool sharded = ddp_ && ddp_->sharded();
  MastersOnLoan masters(*model_, opt_.get(), sharded ? &ddp_->group() : nullptr,
                        sharded ? ddp_->expert_group() : nullptr);
  // Adapters over a frozen base (or frozen layers): the base never changes,
  // so a copy made before takes the trainable parameters alone (they lead
  // the f32 arena, in the whole layout as in this rank's).
  const ParamLayout &mine = model_->layout(), &all = model_->global_layout();
  // QLoRA: an NF4 base in pieces has no whole form to gather, but it is
  // train.init_from's, quantised whole as one process quantises it (each
  // rank's share cut from those blocks): read it whole once, the trainable
  // parameters gathered into it like any copy's.
  if (!previous && model_->frozen_weights() == FrozenWeights::Nf4) {
    previous = load_run_model(cfg_, cfg_.init_from, "train.init_from");
    previous->set_logit_temperature(model_->logit_temperature());
  }
  if (previous && all.trainable_end() < all.total()) {
    const Tensor trainable = parallel::gather_model(
        *model_, replica_weights().narrow0(0, mine.trainable_end()), par_.group("pp"));
    ops::convert(previous->params().narrow0(0, trainable.numel()), trainable);
    previous->sync_compute_params();
    return previous;
  }
  std::unique_ptr<Transformer> whole = gather_whole_model(true, true);
  whole->set_logit_temperature(model_->logit_temperature());
  return whole;
}

}  // namespace nk
