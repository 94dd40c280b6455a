// Token embedding plus, for GPT-2, learned positions.
//
// Vocabulary parallel (Megatron's): under tensor parallelism wte is this
// rank's rows of the table, ids [vocab_start, vocab_start + V/t); each rank
// looks up the tokens it holds (zeros for the others), rank 0 adds the
// positions, and the group sums (nn/tensor_parallel.h: the region's exit,
// a reduce-scatter into this rank's rows under sequence parallelism). One
// rank holds each token, so the sum is the plain lookup's value exactly.
#pragma once
#include "nn/tensor_parallel.h"
#include "ops/ops.h"
#include "ops/quant.h"

namespace nk::nn {

struct Embedding {
  Tensor wte, wpe;    // compute dtype [V, C], [maxT, C] (wpe undefined with RoPE)
  Tensor dwte, dwpe;  // f32; undefined when frozen (not computed)
  TensorParallel tp;
  int64_t vocab_start = 0;  // the first id of wte's rows (tensor parallel)
  ops::Nf4Weight wte_q;     // the frozen table as NF4 (QLoRA) instead of wte
  // The frozen table block-quantised (inference; models without wpe).
  ops::QuantWeight wte_quant;

  // positions i32[B, T] (packed rows) or undefined for 0..T-1 in every row.
  // full: [B, T, C] scratch under sequence parallelism (out is then this
  // rank's rows [N/t, C]).
  void forward(Tensor out, const Tensor& tokens, const Tensor& positions = Tensor(),
               const Tensor& full = Tensor()) const {
    forward_over(tp, out, tokens, positions, full);
  }
  // The cached decode's lookup of N tokens, out [N, C] whole on every rank
  // (no sequence parallelism).
  void forward_cached(Tensor out, const Tensor& tokens, const Tensor& positions) const {
    forward_over(tp.whole_rows(), out, tokens, positions, Tensor());
  }
  // Every rank computes the positions' whole gradient (they are replicated).
  void backward(const Tensor& dout, const Tensor& tokens, const Tensor& positions = Tensor(),
                const Tensor& full = Tensor()) const {
    ops::embedding_backward(dwte, dwpe, tp.exit_backward(dout, full), tokens, positions,
                            tp.active() ? vocab_start : -1);
  }

 private:
  void forward_over(const TensorParallel& t, Tensor out, const Tensor& tokens,
                    const Tensor& positions, const Tensor& full) const {
    if (t.active()) {
      const Tensor local = t.exit_buffer(out, full), pos = t.rank() == 0 ? wpe : Tensor();
      if (wte_q.defined()) {  // QLoRA: this rank's rows of the NF4 table
        ops::nf4_embedding_forward(local, tokens, wte_q, pos, positions, vocab_start);
      } else if (wte_quant.defined()) {  // this rank's block-quantised rows
        NK_CHECK(!pos.defined(), "Embedding: a block-quantised table with learned positions");
        ops::quant_embedding_forward(local, tokens, wte_quant, vocab_start);
      } else {
        ops::embedding_forward(local, tokens, wte, pos, positions, vocab_start);
      }
      t.exit(out, full);
    } else if (wte_q.defined()) {
      ops::nf4_embedding_forward(out, tokens, wte_q, wpe, positions);
    } else if (wte_quant.defined()) {
      NK_CHECK(!wpe.defined(), "Embedding: a block-quantised table with learned positions");
      ops::quant_embedding_forward(out, tokens, wte_quant);
    } else {
      ops::embedding_forward(out, tokens, wte, wpe, positions);
    }
  }
};

}  // namespace nk::nn
