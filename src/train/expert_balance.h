// Aux-loss-free load balancing of Mixture-of-Experts routers (DeepSeek-V3,
// arXiv:2412.19437 section 2.1.2; Megatron's moe_router_bias_update_rate):
// after each optimizer step every MoE layer's expert score-correction bias
// (h.L.moe.score_bias, ModelConfig::has_score_bias) moves by
//   b_e += rate x sign(mean_e' load_e' - load_e),
// the loads being the pairs routed to each expert over the step's tokens
// (every micro-batch, every data-parallel rank: the trainer sums them), so
// an overloaded expert is chosen less and an idle one more. The bias only
// chooses (ops::moe_route); the gradient never reaches it. It is updated in
// f32 on its master, the same on every rank, so resume is exact.
#pragma once
#include <vector>

#include "model/transformer.h"

namespace nk {

// Adds the last forward's routed pairs per expert (a.moe_counts) into
// load [n_layer E].
void add_expert_load(const Activations& a, std::vector<double>& load);
// The step described above, for every MoE layer, when
// moe_bias_update_rate > 0 (else nothing). nk::Error when the bias has no
// f32 master to accumulate in.
void update_expert_bias(Transformer& model, const std::vector<double>& load);
// Per layer, the busiest expert's load over the mean load (1: even; 0 for a
// dense layer).
std::vector<double> expert_load_max(const ModelConfig& c, const std::vector<double>& load);

}  // namespace nk
