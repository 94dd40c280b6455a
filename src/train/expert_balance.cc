// Aux-loss-free balancing of MoE routers (train/expert_balance.h).
#include "train/expert_balance.h"

#include <algorithm>

#include "ops/ops.h"

namespace nk {

void add_expert_load(const Activations& a, std::vector<double>& load) {
  for (size_t l = 0; l < a.expert_counts().size(); ++l) {
    const std::vector<int64_t>& n = a.expert_counts()[l];
    for (size_t e = 0; e < n.size(); ++e) load[l * n.size() + e] += double(n[e]);
  }
}

void update_expert_bias(Transformer& model, const std::vector<double>& load) {
  const ModelConfig& c = model.config();
  if (!(c.moe_bias_update_rate > 0)) return;
  const int64_t E = c.num_experts;
  const float rate = float(c.moe_bias_update_rate);
  std::vector<float> b(static_cast<size_t>(E));
  Tensor dst = Tensor::empty({E}, DType::F32, model.device());
  for (int64_t l = 0; l < c.n_layer; ++l) {
    // A pipeline stage moves its own layers' biases.
    if (!c.moe_layer(l) || !model.stage().holds_layer(c, l)) continue;
    const ParamInfo& p = model.layout().find(fmt::format("h.{}.moe.score_bias", l));
    if (!model.has_master(p))
      fail(
          "model.moe_bias_update_rate = {}: {} has no f32 master weight to accumulate the "
          "balancing steps in (keep optim.master_dtype=f32)",
          c.moe_bias_update_rate, p.name);
    ops::copy_bytes_to_host(ParamLayout::view(model.params(), p), b.data());
    const double* n = load.data() + l * E;
    double mean = 0;
    for (int64_t e = 0; e < E; ++e) mean += n[e];
    mean /= double(E);
    for (int64_t e = 0; e < E; ++e) {
      const double d = mean - n[e];
      b[size_t(e)] += d > 0 ? rate : d < 0 ? -rate : 0.f;
    }
    ops::copy_bytes_from_host(dst, b.data());
    model.set_param(p, dst);
  }
}

std::vector<double> expert_load_max(const ModelConfig& c, const std::vector<double>& load) {
  const int64_t E = c.num_experts;
  std::vector<double> out(size_t(c.n_layer), 0.0);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    if (!c.moe_layer(l)) continue;
    const double* n = load.data() + l * E;
    double sum = 0, mx = 0;
    for (int64_t e = 0; e < E; ++e) {
      sum += n[e];
      mx = std::max(mx, n[e]);
    }
    out[size_t(l)] = sum > 0 ? mx * double(E) / sum : 0.0;
  }
  return out;
}

}  // namespace nk
