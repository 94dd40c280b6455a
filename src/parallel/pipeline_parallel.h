// Pipeline parallelism: the layers split into stages over the mesh's "pp"
// group (each process holds its stage's parameters: PipelineStage), every
// micro-batch's residual stream sent forward from stage to stage and its
// gradient backward, point to point, in Megatron's 1F1B order: stage s of p
// runs min(p - s - 1, m) forwards first (warm-up), then alternates one
// forward and one backward, then finishes the backwards, so it holds at
// most p - s micro-batches' activations at once.
//
// Interleaved (v virtual stages per rank, parallel.vp): the layers are cut
// into p·v chunks and rank s holds chunks s, s + p, s + 2p, ...; a
// micro-batch passes every rank v times (the last rank's output goes on to
// rank 0's next chunk). Megatron's interleaved 1F1B order: forward step k
// runs chunk (k mod pv) / p of micro-batch (k / pv)·p + k mod p (backward
// steps the chunks in reverse), after a warm-up of (p - s - 1)·2 + (v - 1)·p
// forward steps (all of them when m = p). The bubble shrinks from (p - 1)/m
// to (p - 1)/(v·m) of the work; m must be a multiple of p.
//
// Transfers: a send is posted without waiting, and completed together with
// the stage's next receive (Megatron's send_forward_recv_backward and
// send_backward_recv_forward): MPI moves a large message only while both
// sides are inside MPI, so a send left pending across the next layer's
// compute would hold the neighbour up for that long. The interleaved order
// does not pair each send with the neighbour's next receive, so there
// every receive of the step is posted at its start, into a buffer of its
// own (one residual stream per chunk and micro-batch, kept across steps),
// and a send can always complete.
//
// The first rank reads the tokens and runs the embedding, the last the
// final norm, the head and the loss (the language model's cross-entropy, or
// the head a training objective sets: set_head); the step's loss reaches
// every stage.
// With tied embeddings the last rank holds a copy of the token table for
// its head, initialised alike; reduce_embedding_grads() sums the two
// ranks' gradients of it (the "embedding" group), so both copies take the
// same update and stay equal.
//
// Mixture of Experts: a stage's layers route the tokens, but the balancing
// loss (HF's form) couples every layer's counts, and the last stage reports
// the loss. So each Activations' routing record (Activations::moe_record)
// travels with the residual stream: forward, each stage adding its layers',
// so that the last stage's loss and figures cover every layer; backward,
// the whole record, so that every stage's balancing gradient sees every
// layer's counts (and the losses' gradient scale). Under the interleaved
// schedule the record passes every chunk in the residual stream's order
// (each chunk's Activations adding its layers'), its receives posted at the
// step's start as the residual stream's are.
//
// Context parallelism (nn/context_parallel.h) inside each stage: B and T
// are a cp rank's micro-batch (T / cp local tokens), the residual streams
// sent between stages are its chunks' tokens, and every micro-batch's
// PackedBatchInfo (the chunks' global positions) reaches every stage's
// layers: the rotary positions and the ring attention over the stage's own
// "cp" group (the model's). The loss is each cp rank's share
// (Transformer::head_loss); the trainer sums it, and the gradients, over
// "dp-cp".
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "dist/communicator.h"
#include "model/transformer.h"

namespace nk::parallel {

// What a chunk of layers reads, made resident before it runs and let go
// after (FSDP's gathers and releases, DistributedDataParallel): the layers
// [first, last), and the embedding's and the head's weights when the chunk
// runs them. (The model's last chunk in a training step lets go of the head
// after its forward, which ran the head's backward too, and of its layers
// after their backward: use_chunk of resident units waits for nothing.)
class ChunkWeights {
 public:
  virtual ~ChunkWeights() = default;
  virtual void use_chunk(int64_t first, int64_t last, bool embedding, bool head) = 0;
  virtual void done_chunk(int64_t first, int64_t last, bool embedding, bool head) = 0;
};

// The stage of pipeline rank `rank` of `pp` for a model of cfg: the layers
// split evenly, or as `layers` says (layers per stage, in order, summing to
// cfg.n_layer: parallel.pp_layout; a stage may have none); with vp > 1
// virtual stages per rank, vp chunks: of n_layer / (pp·vp) layers each, or
// as `layers` lists pp·vp virtual stages in model order (rank r's chunk c
// is virtual stage c·pp + r; Megatron's pipeline_model_parallel_layout).
// nk::Error naming the key and the numbers when they do not fit.
PipelineStage pipeline_stage(const ModelConfig& cfg, int64_t pp, int64_t rank,
                             const std::vector<int64_t>& layers = {}, int64_t vp = 1);

// The (interleaved) 1F1B schedule of stage `stage` of p with v model chunks
// per rank over m micro-batches: its warm-up forwards, and the most chunk
// activations it holds at once (the warm-up and one).
int64_t pipeline_warmup_steps(int64_t p, int64_t stage, int64_t v, int64_t m);
int64_t pipeline_max_in_flight(int64_t p, int64_t stage, int64_t v, int64_t m);

class PipelineParallel {
 public:
  // The model's last chunk's head and loss of micro-batch j (its index in
  // forward_backward's lists; 0 in forward_loss) over the layers' output in
  // a: the micro-batch's loss, and with `backward` its gradient
  // d(loss * grad_scale) into a.residual_grad() and the head's weights, as
  // Transformer::head_loss (the default) does. A preference objective's
  // (src/align) is another. Called on the last stage only; set_head.
  using Head = std::function<double(Activations& a, int64_t j, bool backward, float grad_scale)>;
  // pp: the pipeline group (stage = group rank); embedding: the first and
  // last stages' group, for tied embeddings (null otherwise). Activations
  // for micro-batches of B x T are made as micro-batches come in flight
  // (recompute: the run's plan) and kept for the next step. The model and
  // groups must outlive this.
  PipelineParallel(Transformer& model, dist::Communicator& pp, dist::Communicator* embedding,
                   int64_t B, int64_t T, const std::vector<Recompute>& recompute);

  // One step over the micro-batches tokens[i], targets[i] (i32 [B, T]; the
  // first stage reads the tokens, the last the targets), in (interleaved)
  // 1F1B order; gradients ACCUMULATE d(loss_i * grad_scale)/d params as
  // Transformer::forward_backward does. packed[i]: micro-batch i's
  // positions (context parallel: its chunks' global ones), read by every
  // stage; empty, or null entries: none. Returns the sum of the
  // micro-batches' mean losses, on every stage. Collective over pp.
  double forward_backward(const std::vector<Tensor>& tokens, const std::vector<Tensor>& targets,
                          float grad_scale, const std::vector<const PackedBatchInfo*>& packed = {});
  // One micro-batch's mean loss without gradients (validation), on every stage.
  double forward_loss(const Tensor& tokens, const Tensor& targets,
                      const PackedBatchInfo* packed = nullptr);
  // The same with `head` (called with j = 0 and backward false) in place of
  // the loss: what it returns, on every stage.
  double forward_head(const Tensor& tokens, const Tensor& targets, const Head& head,
                      const PackedBatchInfo* packed = nullptr);
  // Tied embeddings: the token table's gradient summed over the first and
  // last stages (once per step, after the backward). Nothing otherwise.
  void reduce_embedding_grads();
  // FSDP: each chunk's forward and backward (and validation's forward) made
  // resident by `w` just before and released just after (null: the weights
  // stay whole). Must outlive this.
  void set_chunk_weights(ChunkWeights* w) { weights_ = w; }
  // Sets the head the schedule runs (above) in place of the loss.
  void set_head(Head head) { head_ = std::move(head); }
  // Bytes of the activation workspaces this stage keeps.
  int64_t activation_bytes() const;
  // The schedule's warm-up forwards over m micro-batches on this stage, and
  // the most chunk activations it then holds at once (the warm-up and one).
  int64_t warmup_steps(int64_t m) const;
  int64_t max_in_flight(int64_t m) const;
  int64_t chunks() const { return int64_t(chunks_.size()); }
  // MoE: the last forward_backward's losses and figures (the mean over its
  // micro-batches; load_max their largest) and its routed pairs per layer
  // and expert [n_layer E], summed over its micro-batches: the last stage's,
  // on every stage.
  const Transformer::MoeLosses& moe_losses() const { return moe_losses_; }
  const std::vector<double>& expert_load() const { return expert_load_; }
  // Seconds this stage waited on its neighbours (received activations or
  // gradients, completed sends) since the last call: the pipeline's bubble
  // plus the transfers it did not overlap.
  double take_wait_seconds() {
    const double s = wait_s_;
    wait_s_ = 0;
    return s;
  }

 private:
  // One chunk of micro-batch j: forward (with the loss on the model's last
  // chunk) or backward, with its transfers.
  void forward(int64_t chunk, int64_t j, const Tensor& tokens, const Tensor& targets,
               const PackedBatchInfo* packed, bool backward, float grad_scale, const Head& head,
               double& loss);
  void backward(int64_t chunk, int64_t j, const Tensor& tokens, const PackedBatchInfo* packed);
  // Receives x from group rank `src`, completing every pending send meanwhile.
  void receive(const Tensor& x, int src, int tag);
  void wait_sends();
  double from_last_stage(double v);
  // MoE: the routing record of a (forward or backward message) to `dst`, and
  // from `src` into a (every layer but [first, last)).
  // (chunk, j): the posted receive it is taken from (interleaved), if any.
  void send_moe_record(Activations& a, bool backward, int dst);
  void receive_moe_record(Activations& a, bool backward, int src, int64_t chunk, int64_t j);
  // Posts the routing record's receive of (chunk, j) from `src` into `to`.
  struct Posted;
  void post_record(std::map<std::pair<int64_t, int64_t>, Posted>& to,
                   std::map<std::pair<int64_t, int64_t>, Tensor>& buffers, int64_t chunk, int64_t j,
                   int src, int tag);
  void moe_from_last_stage(int64_t m);
  // The activations of micro-batch j in `chunk` (taken from the chunk's free
  // ones, or made), and their release after its backward.
  Activations& acts(int64_t chunk, int64_t j);
  void release(int64_t chunk, int64_t j);
  bool first_chunk(int64_t chunk) const { return stage_ == 0 && chunk == 0; }
  bool last_chunk(int64_t chunk) const {
    return stage_ == stages_ - 1 && chunk == int64_t(chunks_.size()) - 1;
  }

  Transformer& model_;
  dist::Communicator& pp_;
  dist::Communicator* embedding_;
  int64_t B_, T_;
  std::vector<Recompute> recompute_;
  int64_t stage_, stages_;
  std::vector<std::pair<int64_t, int64_t>> chunks_;  // this rank's layer ranges
  struct Chunk {
    std::vector<std::unique_ptr<Activations>> free;
    std::vector<std::pair<int64_t, std::unique_ptr<Activations>>> busy;  // by micro-batch
  };
  std::vector<Chunk> state_;
  std::vector<dist::WorkPtr> sending_;  // posted, not yet complete
  ChunkWeights* weights_ = nullptr;     // FSDP's, else null
  Head head_;                           // null: Transformer::head_loss
  bool moe_ = false;
  // f64 records per Activations: forward's and backward's (a backward
  // receive may be posted while the forward send is pending).
  std::map<const Activations*, std::pair<Tensor, Tensor>> records_;
  Transformer::MoeLosses moe_losses_;
  std::vector<double> expert_load_;
  double wait_s_ = 0;
  // Interleaved: the step's receives, posted at its start, by (chunk, micro-batch).
  struct Posted {
    Tensor buffer;
    dist::WorkPtr work;
  };
  std::map<std::pair<int64_t, int64_t>, Posted> inputs_, grads_;
  // Their buffers, kept for the next step (the loop allocates nothing after its first step).
  std::map<std::pair<int64_t, int64_t>, Tensor> input_buffers_, grad_buffers_;
  // MoE under the interleaved schedule: the routing records' posted
  // receives (forward, backward) and their buffers, likewise.
  std::map<std::pair<int64_t, int64_t>, Posted> moe_inputs_, moe_grads_;
  std::map<std::pair<int64_t, int64_t>, Tensor> moe_input_buffers_, moe_grad_buffers_;
  // Takes the posted receive of (chunk, j) from `from` into x (interleaved),
  // or receives it now; then x holds the message.
  void take(std::map<std::pair<int64_t, int64_t>, Posted>& from, int64_t chunk, int64_t j,
            const Tensor& x, int src, int tag);
  void post_receives(int64_t m);
};

}  // namespace nk::parallel
