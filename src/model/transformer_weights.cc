// The Transformer's weights: the parameter layout, construction and
// initialisation, the arenas (masters, bf16 compute copy, gradients with their
// bf16 staging) and the views every block reads; what a PipelineStage holds.
// What a model split over ranks can hold and the gradients its groups sum are
// in transformer_split.cc, the step in transformer.cc, cached decode in
// transformer_decode.cc.
#include "model/transformer.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>

#include "core/rng.h"
#include "model/arch.h"
#include "model/rope.h"

namespace nk {

namespace {

std::string L(int64_t l, const char* name) {
  return fmt::format("h.{}.{}", l, name);
}

// Zeroed storage for p's runs (zeros read back as zeros in every format).
// nk::Error naming p when the runs do not cover its rows in whole fused parts.
std::vector<ops::QuantWeight> quant_storage(const ParamInfo& p, const std::vector<QuantRun>& runs,
                                            Device device) {
  if (p.shape.size() != 2) fail("quantised parameter '{}' is not a matrix", p.name);
  std::vector<ops::QuantWeight> out;
  int64_t row = 0;
  for (const QuantRun& r : runs) {
    bool at_part = p.parts.empty() ? row == 0 : false;
    for (const ParamPart& part : p.parts) at_part |= part.row0 == row;
    if (!at_part || r.rows <= 0)
      fail("quantised parameter '{}': a run of {} rows at row {} does not start a fused part",
           p.name, r.rows, row);
    ops::QuantWeight q = ops::QuantWeight::empty(r.type, {r.rows, p.shape[1]}, device);
    q.data = Tensor::zeros(q.data.shape(), q.data.dtype(), device);
    if (q.scale.defined()) q.scale = Tensor::zeros(q.scale.shape(), q.scale.dtype(), device);
    out.push_back(q);
    row += r.rows;
  }
  if (row != p.shape[0])
    fail("quantised parameter '{}': runs cover {} of its {} rows", p.name, row, p.shape[0]);
  return out;
}

}  // namespace

std::vector<QuantRun> quant_share_runs(const ParamInfo& g, const Shape& local,
                                       const std::vector<QuantRun>& whole, int64_t rank,
                                       int64_t n) {
  const std::vector<SliceRange> ranges = shard_ranges(tensor_split(g), rank, n);
  if (local[0] == g.shape[0]) {  // whole rows: a row-parallel share holds whole blocks
    for (const SliceRange& r : ranges)
      for (const QuantRun& q : whole)
        if (const int64_t b = ops::quant_block(q.type); r.dim == 1 && (r.start % b || r.len % b))
          fail(
              "'{}' {}: a rank of {} holds its columns [{}, {}), not whole {} blocks of {} "
              "values (fewer tensor-parallel ranks, or a type of smaller blocks such as q8_0)",
              g.name, shape_str(g.shape), n, r.start, r.start + r.len, ops::quant_type_name(q.type),
              b);
    return whole;
  }
  // Rows split: each whole run cut to the rows this rank holds, in its order.
  std::vector<QuantRun> out;
  auto add = [&](int64_t rows, ops::QuantType type) {
    if (rows <= 0) return;
    if (!out.empty() && out.back().type == type)
      out.back().rows += rows;
    else
      out.push_back({rows, type});
  };
  int64_t covered = 0;
  for (const SliceRange& r : ranges) {  // (shard_ranges gives them in the share's order)
    NK_CHECK(r.dim == 0 && r.local_start == covered, "quant_share_runs: '{}' range at {}", g.name,
             r.local_start);
    for (int64_t row0 = 0; const QuantRun& q : whole) {
      add(std::min(row0 + q.rows, r.start + r.len) - std::max(row0, r.start), q.type);
      row0 += q.rows;
    }
    covered += r.len;
  }
  // The vocabulary's padding rows (zeros) close the last run.
  add(local[0] - covered, out.empty() ? whole.back().type : out.back().type);
  return out;
}

bool PipelineStage::holds(const ModelConfig& cfg, const std::string& name) const {
  if (name == "wte") return embedding || (head && cfg.head_tied());
  if (name == "wpe") return embedding;
  if (ModelConfig::head_param(name)) return head;
  if (name.starts_with("h.")) {
    return holds_layer(cfg, std::stoll(name.substr(2, name.find('.', 2) - 2)));
  }
  return embedding;  // the prompt's (p-tuning): placed by the embedding step
}

std::vector<Shape> nf4_runs(const ModelConfig& cfg, const ParamInfo& p) {
  if (p.split != Split::Experts) return {p.shape};
  const int64_t E = cfg.num_experts;
  NK_CHECK(p.shape.size() == 2 && E > 0 && p.shape[0] % E == 0,
           "nf4_runs: '{}' of {} rows for {} experts", p.name, p.shape[0], E);
  return std::vector<Shape>(size_t(E), Shape{p.shape[0] / E, p.shape[1]});
}

ParamLayout Transformer::layout_for(const ModelConfig& cfg, const std::vector<std::string>& frozen,
                                    FrozenWeights frozen_weights, const QuantPlan& quant) {
  NK_CHECK(quant.empty() || frozen_weights == FrozenWeights::Quantized,
           "a QuantPlan without FrozenWeights::Quantized");
  if (frozen_weights == FrozenWeights::Quantized) {
    std::vector<std::string> names;
    for (const auto& [name, runs] : quant) names.push_back(name);
    return model_layout(cfg, frozen, names);
  }
  ParamLayout layout = model_layout(cfg, frozen);
  if (frozen_weights != FrozenWeights::Nf4) return layout;
  // QLoRA's base: every frozen weight matrix but learned positions and a
  // MoE layer's router and shared-expert gate (routing is sensitive to
  // their error and they are a sliver of the weights: unsloth skips the
  // routers too, and Qwen's GPTQ-Int4 MoE checkpoints leave them unquantised).
  std::vector<std::string> quantized;
  for (const ParamInfo& p : layout.params())
    if (!p.trainable && !p.adapter && p.shape.size() == 2 && p.name != "wpe" &&
        !p.name.ends_with(".moe.router.weight") && !p.name.ends_with(".moe.shared_gate.weight"))
      quantized.push_back(p.name);
  return model_layout(cfg, frozen, quantized);
}

ParamLayout Transformer::tensor_parallel_global(ParamLayout whole, int64_t n, int64_t etp) {
  if (etp == 0) etp = n;
  // Whole experts (parallel.etp = 1): the MoE blocks' parameters replicated
  // over the tensor-parallel group, in the whole model's layout too (a
  // gather takes rank 0's, equal on every rank).
  if (n > 1 && etp == 1)
    return whole.replicated(
        [](const ParamInfo& p) { return p.name.find(".moe.") != std::string::npos; });
  // Experts split over etp of the tp ranks (1 < parallel.etp < tp): the MoE
  // blocks' split tensors are each etp ranks' shares (ParamInfo::tp_ways);
  // the router, whole, stays replicated.
  if (1 < etp && etp < n)
    return whole.split_over(
        [](const ParamInfo& p) {
          return p.name.find(".moe.") != std::string::npos &&
                 tensor_split(p).split != Split::Replicated;
        },
        etp);
  return whole;
}

void Transformer::check_nf4_shares(const ModelConfig& cfg, const std::vector<std::string>& frozen,
                                   int64_t tp, int64_t etp) {
  if (tp <= 1) return;
  const ParamLayout whole =
      tensor_parallel_global(layout_for(cfg, frozen, FrozenWeights::Nf4), tp, etp);
  const ParamLayout local = whole.shard(tp);
  for (const ParamInfo& p : whole.params())
    for (int64_t r = 0; p.quantized && r < tp; ++r)
      nf4_shard_pieces(cfg, p, local.find(p.name), r, tp);
}

Transformer::Transformer(const ModelConfig& cfg, DType compute, uint64_t seed, ParamInit init,
                         const std::vector<std::string>& frozen, Device device,
                         FrozenWeights frozen_weights, const QuantPlan& quant,
                         nn::TensorParallel tp, PipelineStage stage)
    : cfg_(cfg),
      compute_(compute),
      device_(device),
      frozen_weights_(frozen_weights),
      tp_(tp),
      stage_(stage),
      global_layout_(layout_for(cfg, frozen, frozen_weights, quant)) {
  // model_layout validated cfg (bounded shapes) before sizing anything.
  NK_CHECK(compute == DType::F32 || compute == DType::BF16, "compute dtype {}",
           dtype_name(compute));
  check_tensor_parallel(cfg_, tp_.size(), tp_.expert_size());
  const bool whole = stage_.whole(cfg_);
  check_moe_support(cfg_, tp_.size(), device_, tp_.expert_size());
  global_layout_ = tensor_parallel_global(std::move(global_layout_), tp_.size(), tp_.expert_size());
  for (const auto& [first, last] : stage_.ranges(cfg_))
    NK_CHECK(0 <= first && first <= last && last <= cfg_.n_layer,
             "pipeline stage: layers [{}, {}) of {}", first, last, cfg_.n_layer);
  check_model_pieces(cfg_, tp_.size(), !whole, frozen_weights, tp_.expert_size());
  layout_ =
      whole ? global_layout_
            : global_layout_.subset([&](const ParamInfo& p) { return stage_.holds(cfg_, p.name); });
  if (tp_.active()) layout_ = layout_.shard(tp_.size());
  // f32 masters: every parameter, or only the trainable ones (in f32 compute
  // the frozen dense ones too: their compute copy is the master).
  const int64_t masters = frozen_weights == FrozenWeights::Master ? layout_.total()
                          : compute == DType::F32                 ? layout_.dense_end()
                                                                  : layout_.trainable_end();
  params_ = Tensor::empty({masters}, DType::F32, device_);
  grads_ = Tensor::empty({layout_.trainable_end()}, DType::F32, device_);
  ops::fill(params_, 0.f);
  zero_grads();
  compute_params_ =
      compute == DType::F32 ? params_ : Tensor::empty({layout_.dense_end()}, compute, device_);
  if (compute_params_.raw() != params_.raw()) ops::fill(compute_params_, 0.f);
  for (const ParamInfo& p : layout_.params()) {
    if (!p.quantized) continue;
    if (frozen_weights == FrozenWeights::Quantized) {
      // The plan's runs are the whole parameter's: a rank holds its share of them.
      const std::vector<QuantRun>& runs = quant.at(p.name);
      quant_[p.name] = quant_storage(
          p,
          tp_.active()
              ? quant_share_runs(global_layout_.find(p.name), p.shape, runs, tp_.rank(), tp_.size())
              : runs,
          device_);
      continue;
    }
    // All-zero storage reads back as zeros (scale and offset 0) until set.
    // A tensor-parallel shard is cut from the whole tensor's NF4 blocks
    // (set_param_from_whole), its absmax scales as that needs.
    const std::vector<std::vector<ops::Nf4Piece>> pieces =
        tp_.active() ? nf4_shard_pieces(p) : std::vector<std::vector<ops::Nf4Piece>>();
    for (const Shape& shape : nf4_runs(cfg_, p)) {
      const size_t k = nf4_[p.name].size();
      ops::Nf4Weight q = ops::Nf4Weight::empty(
          shape, device_,
          pieces.empty() ? ops::kNf4ScaleBlock : ops::nf4_shard_scale_block(pieces[k]));
      for (Tensor* t : {&q.codes, &q.absmax_codes, &q.absmax_scale, &q.absmax_offset})
        *t = Tensor::zeros(t->shape(), t->dtype(), device_);
      nf4_[p.name].push_back(q);
    }
  }
  // Each parameter draws from its own stream so that adding a parameter does
  // not change the others' initial values. A tensor-parallel rank draws the
  // whole parameter and keeps its shard.
  std::vector<float> whole_value;
  for (size_t i = 0; init != ParamInit::Zeros && i < global_layout_.params().size(); ++i) {
    const ParamInfo& g = global_layout_.params()[i];
    if (!layout_.has(g.name)) continue;  // another pipeline stage's
    const ParamInfo& p = layout_.find(g.name);
    if (init == ParamInit::Added && !added_to_base(p)) continue;
    whole_value.assign(size_t(g.numel()), g.init == Init::Ones ? 1.f : 0.f);
    Rng rng(seed * 1000003ull + i);
    if (g.init == Init::Normal)
      for (auto& v : whole_value) v = float(rng.normal() * g.init_std);
    if (g.init == Init::Uniform)
      for (auto& v : whole_value) v = float((2 * rng.uniform() - 1) * g.init_std);
    set_param_from_whole(p, Tensor::from_blob(whole_value.data(), g.shape, DType::F32));
  }
  sync_compute_params();
  const BlockSpec spec = cfg_.block();
  // One table for training and the KV-cache path; scaled as the config says (model/rope.h).
  if (!spec.learned_positions)
    rope_ = ops::to_device(rope_table(cfg_.max_seq_len, cfg_.rotary_dim(), cfg_.rope_theta,
                                      cfg_.rope_scaling, cfg_.max_seq_len),
                           device_);
  // Gemma 3's windowed layers: their own base, unscaled.
  if (!spec.learned_positions && cfg_.rope_local_theta > 0)
    rope_local_ = ops::to_device(rope_table(cfg_.max_seq_len, cfg_.rotary_dim(),
                                            cfg_.rope_local_theta, RopeScaling{}, cfg_.max_seq_len),
                                 device_);
  bind_views();
}

void Transformer::split_experts() {
  NK_CHECK(quant_.empty(), "split_experts: expert parallelism of a block-quantised model");
  const ParamLayout local = layout_.shard_experts(ep_.size());
  // QLoRA's NF4 experts, quantised one expert each (nf4_runs): this rank's runs.
  for (auto& [name, runs] : nf4_) {
    if (layout_.find(name).split != Split::Experts) continue;
    const int64_t n = ep_.local_experts(cfg_.num_experts);
    NK_CHECK(int64_t(runs.size()) == cfg_.num_experts, "split_experts: '{}' in {} NF4 runs", name,
             runs.size());
    const auto first = runs.begin() + ep_.first_expert(cfg_.num_experts);
    runs = std::vector<ops::Nf4Weight>(first, first + n);
  }
  unsplit_layout_ = layout_;
  const int64_t masters = frozen_weights_ == FrozenWeights::Master ? local.total()
                          : compute_ == DType::F32                 ? local.dense_end()
                                                                   : local.trainable_end();
  Tensor params = Tensor::zeros({masters}, DType::F32, device_);
  Tensor compute =
      compute_ == DType::F32 ? params : Tensor::zeros({local.dense_end()}, compute_, device_);
  // Each parameter's values as they were; of an expert tensor, this rank's rows.
  for (const ParamInfo& q : local.params()) {
    const ParamInfo& p = layout_.find(q.name);
    const int64_t row0 = p.split == Split::Experts ? ep_.rank() * q.shape[0] : 0;
    auto mine = [&](const Tensor& flat) {
      return ParamLayout::view(flat, p).narrow0(row0, q.shape[0]);
    };
    if (has_master(p)) ops::convert(ParamLayout::view(params, q), mine(params_));
    if (compute.raw() != params.raw())
      ops::convert(ParamLayout::view(compute, q), mine(compute_params_));
  }
  layout_ = local;
  params_ = params;
  compute_params_ = compute;
  grads_ = Tensor::empty({layout_.trainable_end()}, grads_.dtype(), device_);
  if (grad_stage_.defined()) {
    staging_ = plan_grad_staging(cfg_, layout_);
    grad_stage_ = Tensor::empty({staging_.elems}, DType::F32, device_);
  }
  zero_grads();
  experts_split_ = true;
  bind_views();
}

void Transformer::sync_compute_params() {
  if (compute_params_.raw() != params_.raw())
    ops::convert(compute_params_.narrow0(0, params_.numel()), params_);
}

void Transformer::release_masters() {
  NK_CHECK(compute_ == DType::BF16, "release_masters: a {} model's masters are its weights",
           dtype_name(compute_));
  params_ = Tensor::empty({0}, DType::F32, device_);
  bind_views();  // (a MoE score bias read its master)
}

void Transformer::adopt_masters(Tensor masters) {
  NK_CHECK(compute_ == DType::BF16 && masters.dtype() == DType::F32 && masters.ndim() == 1 &&
               masters.is_contiguous() && masters.numel() <= layout_.dense_end() &&
               masters.device() == device_,
           "adopt_masters: {} for a {} model of {} dense elements", masters.desc(),
           dtype_name(compute_), layout_.dense_end());
  params_ = std::move(masters);
}

Tensor Transformer::param_f32(const ParamInfo& p) const {
  if (has_master(p)) return ParamLayout::view(params_, p);
  Tensor out = Tensor::empty(p.shape, DType::F32, device_);
  if (p.quantized && quant_.count(p.name)) {
    int64_t row = 0;
    for (const ops::QuantWeight& q : quant_.at(p.name)) {
      ops::quant_dequantize(out.narrow0(row, q.rows()), q);
      row += q.rows();
    }
  } else if (p.quantized) {
    int64_t row = 0;
    for (const ops::Nf4Weight& q : nf4_.at(p.name)) {
      ops::nf4_dequantize(out.narrow0(row, q.shape[0]), q);
      row += q.shape[0];
    }
  } else {
    ops::convert(out, ParamLayout::view(compute_params_, p));
  }
  return out;
}

void Transformer::set_param(const ParamInfo& p, const Tensor& src) {
  check_shape(src, p.shape, p.name.c_str());
  if (p.quantized) {
    Tensor f = src;
    if (src.dtype() != DType::F32) {
      f = Tensor::empty(p.shape, DType::F32, device_);
      ops::convert(f, src);
    }
    if (auto it = quant_.find(p.name); it != quant_.end()) {
      int64_t row = 0;
      for (ops::QuantWeight& q : it->second) {
        ops::quant_quantize(q, f.narrow0(row, q.rows()));
        row += q.rows();
      }
      return;
    }
    int64_t row = 0;
    for (ops::Nf4Weight& q : nf4_.at(p.name)) {
      ops::nf4_quantize(q, f.narrow0(row, q.shape[0]));
      row += q.shape[0];
    }
    return;
  }
  if (has_master(p)) ops::convert(ParamLayout::view(params_, p), src);
  if (compute_params_.raw() != params_.raw() || !has_master(p))
    ops::convert(ParamLayout::view(compute_params_, p),
                 has_master(p) ? ParamLayout::view(params_, p) : src);
}

void Transformer::set_param_from_whole(const ParamInfo& p, const Tensor& whole) {
  NK_CHECK(!experts_split_, "set_param_from_whole: '{}' after the experts' split", p.name);
  const ParamInfo& g = global_layout_.find(p.name);
  check_shape(whole, g.shape, p.name.c_str());
  NK_CHECK(whole.device() == kHost && whole.is_contiguous(), "set_param_from_whole: '{}' from {}",
           p.name, whole.desc());
  Tensor f = whole;
  if (whole.dtype() != DType::F32) {
    f = Tensor::empty(g.shape, DType::F32);
    ops::convert(f, whole);
  }
  if (const auto it = nf4_.find(p.name); tp_.active() && it != nf4_.end()) {
    // NF4: the whole quantised as one process does, this rank's blocks cut from it.
    const std::vector<std::vector<ops::Nf4Piece>> pieces = nf4_shard_pieces(p);
    int64_t row = 0;
    for (size_t k = 0; const Shape& shape : nf4_runs(cfg_, g)) {
      ops::Nf4Weight q = ops::Nf4Weight::empty(shape);
      ops::nf4_quantize(q, f.narrow0(row, shape[0]));
      ops::nf4_take_shard(it->second[k], q, pieces[k]);
      row += shape[0];
      ++k;
    }
    return;
  }
  Tensor share = f;
  if (tp_.active()) {
    share = Tensor::empty(p.shape, DType::F32);
    extract_shard(tensor_split(g), tp_.rank(), tp_.size(), sizeof(float), f.data<float>(),
                  share.data<float>());
  }
  if (has_master(p)) {
    ops::copy_from_host(ParamLayout::view(params_, p), share.data<float>());
  } else {
    // On the host no second f32 copy (say, of a 1 GiB embedding table).
    set_param(p, device_ == kHost ? share : ops::to_device(share, device_));
  }
}

std::vector<std::vector<ops::Nf4Piece>> Transformer::nf4_shard_pieces(const ModelConfig& cfg,
                                                                      const ParamInfo& held,
                                                                      const ParamInfo& p,
                                                                      int64_t rank, int64_t n) {
  const ParamInfo g = tensor_split(held);  // (held gives the runs: nf4_runs)
  NK_CHECK(g.shape.size() == 2 && p.shape.size() == 2, "nf4_shard_pieces: '{}' of shape {}", p.name,
           shape_str(g.shape));
  const int64_t cols = g.shape[1];
  std::vector<SliceRange> ranges = shard_ranges(g, rank, n);
  std::sort(ranges.begin(), ranges.end(),
            [](const SliceRange& a, const SliceRange& b) { return a.local_start < b.local_start; });
  // The shard's values in order, as pieces of the whole's flattened values.
  std::vector<ops::Nf4Piece> flat;
  auto add = [&](int64_t start, int64_t len) {
    ops::Nf4Piece* last = flat.empty() ? nullptr : &flat.back();
    if (last && last->start >= 0 && start == last->start + last->len)
      last->len += len;
    else
      flat.push_back({start, len});
  };
  if (ranges.empty() || ranges[0].dim == 0) {
    int64_t rows = 0;
    for (const SliceRange& r : ranges) {
      add(r.start * cols, r.len * cols);
      rows += r.len;
    }
    if (rows < p.shape[0]) add(-1, (p.shape[0] - rows) * cols);  // vocabulary padding
  } else {
    for (int64_t i = 0; i < g.shape[0]; ++i)
      for (const SliceRange& r : ranges) add(i * cols + r.start, r.len);
  }
  // Cut into the runs (a MoE layer's experts), each piece in its run's values.
  const std::vector<Shape> whole = nf4_runs(cfg, held), mine = nf4_runs(cfg, p);
  NK_CHECK(whole.size() == mine.size(), "nf4_shard_pieces: '{}' in {} runs, its shard in {}",
           p.name, whole.size(), mine.size());
  const int64_t run_values = shape_numel(whole[0]);
  std::vector<std::vector<ops::Nf4Piece>> out(mine.size());
  size_t k = 0;
  int64_t room = shape_numel(mine[0]);
  for (ops::Nf4Piece piece : flat) {
    while (piece.len > 0) {
      NK_CHECK(k < mine.size(), "nf4_shard_pieces: '{}' holds more than its shard", p.name);
      const int64_t take = std::min(piece.len, room), base = int64_t(k) * run_values;
      NK_CHECK(piece.start < 0 || (piece.start >= base && piece.start + take <= base + run_values),
               "nf4_shard_pieces: '{}' has a piece across NF4 runs", p.name);
      out[k].push_back({piece.start < 0 ? -1 : piece.start - base, take});
      piece.len -= take;
      if (piece.start >= 0) piece.start += take;
      room -= take;
      if (room == 0 && ++k < mine.size()) room = shape_numel(mine[k]);
    }
  }
  for (size_t r = 0; r < out.size(); ++r) {
    const int64_t bad = ops::nf4_pieces_misaligned(out[r]);
    if (bad < 0) continue;
    const ops::Nf4Piece& piece = out[r][size_t(bad)];
    fail(
        "peft.method=qlora under parallel.tp = {}: '{}' {}{}: rank {} holds {} of its values from "
        "flat index {}, not whole NF4 blocks of {} (each rank's share is cut from the whole "
        "tensor's blocks, so a row-parallel weight needs a multiple of {} columns per rank: {} "
        "columns over {} ranks here; see model.d_model, model.d_ff)",
        n, p.name, shape_str(g.shape), out.size() > 1 ? fmt::format(" (expert {})", r) : "", rank,
        piece.len, piece.start, ops::kNf4Block, ops::kNf4Block, cols, n);
  }
  return out;
}

Tensor Transformer::prompt_f32() const {
  NK_CHECK(prompt_.active(), "prompt_f32: the model has no p-tuning prompt");
  const PromptConfig& pc = cfg_.prompt;
  nn::Prompt::Saved s =
      nn::Prompt::saved_for(pc.virtual_tokens, cfg_.d_model, pc.encoder_hidden, compute_, device_);
  const Tensor p = prompt_.forward(s);
  Tensor f = Tensor::empty(p.shape(), DType::F32, device_);
  ops::convert(f, p);
  if (device_ == kHost) return f;
  Tensor out = Tensor::empty(p.shape(), DType::F32);
  ops::copy_to_host(f, out.data<float>());
  return out;
}

size_t Transformer::weight_bytes() const {
  size_t n = params_.nbytes();
  if (compute_params_.raw() != params_.raw()) n += compute_params_.nbytes();
  for (const auto& [name, runs] : nf4_)
    for (const ops::Nf4Weight& q : runs) n += q.nbytes();
  for (const auto& [name, runs] : quant_)
    for (const ops::QuantWeight& q : runs) n += q.nbytes();
  return n;
}

void Transformer::zero_grads() {
  ops::fill(grads_, 0.f);
  if (grad_stage_.defined()) ops::fill(grad_stage_, 0.f);
}

int64_t GradStaging::unit_of(const ModelConfig& cfg, const std::string& name) {
  if (name.starts_with("h.")) return std::stoll(name.substr(2, name.find('.', 2) - 2));
  if (ModelConfig::head_param(name)) return cfg.n_layer;
  return cfg.n_layer + 1;  // wte, wpe, the prompt
}

GradStaging plan_grad_staging(const ModelConfig& cfg, const ParamLayout& layout) {
  GradStaging g;
  g.units.resize(size_t(cfg.n_layer + 2));
  std::vector<int64_t> size(g.units.size(), 0);
  auto add = [&](const ParamInfo& p, int64_t unit) {
    g.units[size_t(unit)].push_back({p.offset, size[size_t(unit)], p.numel(), p.name});
    size[size_t(unit)] += p.numel();
  };
  for (const ParamInfo& p : layout.params()) {
    if (!p.trainable) continue;
    add(p, GradStaging::unit_of(cfg, p.name));
    if (p.name == "wte" && cfg.head_tied()) add(p, cfg.n_layer);  // the tied head's use
  }
  g.elems = *std::max_element(size.begin(), size.end());
  return g;
}

void Transformer::set_grad_dtype(DType dtype) {
  NK_CHECK(dtype == DType::F32 || dtype == DType::BF16, "gradients in {}", dtype_name(dtype));
  staging_ = GradStaging();
  grad_stage_ = Tensor();
  if (dtype == DType::BF16) {
    if (tp_.active() || !stage_.whole(cfg_))
      fail("optim.grad_dtype=bf16: tensor and pipeline parallel layouts are not supported yet");
    staging_ = plan_grad_staging(cfg_, layout_);
    grad_stage_ = Tensor::empty({staging_.elems}, DType::F32, device_);
  }
  grads_ = Tensor::empty({layout_.trainable_end()}, dtype, device_);
  zero_grads();
  bind_views();
}

Tensor Transformer::grad_view(const ParamInfo& p, int64_t unit) const {
  if (!grad_stage_.defined()) return ParamLayout::view(grads_, p);
  for (const GradStaging::Span& s : staging_.units[size_t(unit)])
    if (s.name == p.name) return grad_stage_.narrow0(s.stage, s.n).view(p.shape);
  NK_CHECK(false, "grad_view: '{}' has no gradient in backward stage {}", p.name, unit);
  return Tensor();
}

void Transformer::flush_grads(int64_t unit) {
  if (!grad_stage_.defined()) return;
  int64_t used = 0;
  for (const GradStaging::Span& s : staging_.units[size_t(unit)]) {
    ops::accumulate(grads_.narrow0(s.grad, s.n), grad_stage_.narrow0(s.stage, s.n));
    used = std::max(used, s.stage + s.n);
  }
  if (used > 0) ops::fill(grad_stage_.narrow0(0, used), 0.f);
}

void Transformer::bind_views() {
  const BlockSpec spec = cfg_.block();
  auto w = [&](const std::string& n) {
    const ParamInfo& p = layout_.find(n);
    return p.quantized ? Tensor() : ParamLayout::view(compute_params_, p);
  };
  auto nf4 = [&](const std::string& n) {
    auto it = nf4_.find(n);
    return it == nf4_.end() ? std::vector<ops::Nf4Weight>() : it->second;
  };
  auto q = [&](const std::string& n) {
    const std::vector<ops::Nf4Weight> runs = nf4(n);
    NK_CHECK(runs.size() <= 1, "{}: {} NF4 runs for one linear layer", n, runs.size());
    return runs.empty() ? ops::Nf4Weight() : runs[0];
  };
  auto runs = [&](const std::string& n) {
    auto it = quant_.find(n);
    return it == quant_.end() ? std::vector<ops::QuantWeight>() : it->second;
  };
  auto g = [&](const std::string& n) {
    const ParamInfo& p = layout_.find(n);
    return p.trainable ? grad_view(p, GradStaging::unit_of(cfg_, n)) : Tensor();
  };
  auto maybe = [&](const std::string& n, bool grad) {
    if (!layout_.has(n)) return Tensor();
    return grad ? g(n) : w(n);
  };
  auto linear = [&](const std::string& base) {
    nn::Linear lin;
    lin.w = w(base + ".weight");
    lin.wq = q(base + ".weight");
    lin.wquant = runs(base + ".weight");
    lin.dw = g(base + ".weight");
    lin.b = maybe(base + ".bias", false);
    lin.db = maybe(base + ".bias", true);
    return lin;
  };
  auto norm = [&](const std::string& base) {
    nn::Norm n;
    n.rms = spec.rms_norm;
    n.eps = float(cfg_.norm_eps);
    n.w_offset = spec.norm_offset ? 1.f : 0.f;
    n.w = w(base + ".weight");
    n.dw = g(base + ".weight");
    n.b = maybe(base + ".bias", false);
    n.db = maybe(base + ".bias", true);
    return n;
  };
  // Adapters (model/peft.h): each LoRA target's A and B, each IA3 scale, on its layer.
  // A MoE layer's experts: one nn::Lora per expert this rank holds
  // (experts_lora[linear][e - first]), its parts' columns within the
  // expert's own output, its A and B rows of the layer's stacked tensors.
  const int64_t held = experts_split_ ? ep_.local_experts(cfg_.num_experts) : cfg_.num_experts,
                first = experts_split_ ? ep_.first_expert(cfg_.num_experts) : 0;
  auto expert_rows = [&](const Tensor& mine, const std::string& name, const std::string& part) {
    if (!mine.defined()) return mine;
    const ParamInfo& whole = unsplit_layout().find(name);
    const int64_t row0 = mine.dim(0) == whole.shape[0] ? 0 : ep_.rank() * mine.dim(0);
    const ParamPart& rows = whole.part(part);
    return mine.narrow0(rows.row0 - row0, rows.rows);
  };
  std::map<std::string, nn::Lora> loras;
  std::map<std::string, std::vector<nn::Lora>> experts_lora;
  // Where an adapted part's output columns start: its first row in this
  // rank's weight (under tensor parallelism its share's, the adapters being
  // split as their layers, model/peft.cc), for an expert's part within the
  // expert's own rows (every expert holds an equal run of them).
  auto local_col0 = [&](const AdaptedModule& t) -> int64_t {
    if (t.part.empty()) return 0;
    const ParamInfo& w = unsplit_layout().find(t.linear + ".weight");
    const int64_t e = adapted_expert(t);
    return w.part(t.part).row0 - (e < 0 ? 0 : e * (w.shape[0] / cfg_.num_experts));
  };
  for (const AdaptedModule& t : lora_targets(cfg_)) {
    if (!stage_.holds(cfg_, t.a_name())) continue;  // another pipeline stage's
    const int64_t e = adapted_expert(t);
    if (e >= 0 && (e < first || e >= first + held)) continue;  // another rank's
    nn::Lora& lo = e < 0 ? loras[t.linear] : [&]() -> nn::Lora& {
      std::vector<nn::Lora>& v = experts_lora[t.linear];
      v.resize(size_t(held));
      return v[size_t(e - first)];
    }();
    if (lo.parts.empty()) {
      lo.id = loras.size() + 1000003ull * experts_lora.size() + uint64_t(e + 1);
      // A row-parallel layer's ranks each drop out their own input columns,
      // and a MoE block's with whole experts its own rows (nn/token_split.h):
      // their masks must not repeat one another's (one process's mask over
      // the whole input is not what any rank draws).
      const ParamInfo& base = layout_.find(t.linear + ".weight");
      if (tp_.active() && (tensor_split(base).split == Split::Cols ||
                           (tp_.experts_whole && t.linear.find(".moe.") != std::string::npos)))
        lo.id += uint64_t(tp_.rank()) * 0x9E3779B97F4A7C15ull;
    }
    lo.rank = cfg_.lora.rank;
    lo.scale = float(cfg_.lora.scale());
    lo.dropout = float(cfg_.lora.dropout);
    const std::string part = t.lora_part();
    auto mine = [&](const Tensor& x, const std::string& name) {
      return part.empty() ? x : expert_rows(x, name, part);
    };
    lo.parts.push_back({mine(w(t.a_name()), t.a_name()), mine(w(t.b_name()), t.b_name()),
                        mine(g(t.a_name()), t.a_name()), mine(g(t.b_name()), t.b_name()),
                        local_col0(t)});
  }
  std::map<std::string, nn::Ia3> ia3s;
  for (const AdaptedModule& t : ia3_targets(cfg_)) {
    if (!stage_.holds(cfg_, t.ia3_name())) continue;
    nn::Ia3& s = ia3s[t.linear];
    if (t.feedforward) {
      s.in = w(t.ia3_name());
      s.din = g(t.ia3_name());
    } else {
      s.out.push_back({w(t.ia3_name()), g(t.ia3_name()), local_col0(t)});
    }
  }
  std::map<std::string, nn::Bottleneck> bottlenecks;
  for (const AdaptedModule& t : bottleneck_targets(cfg_)) {
    if (!stage_.holds(cfg_, t.adapter_name("ln.weight"))) continue;
    nn::Bottleneck& a = bottlenecks[t.linear];
    a.ln_w = w(t.adapter_name("ln.weight"));
    a.ln_b = w(t.adapter_name("ln.bias"));
    a.w_in = w(t.adapter_name("linear_in.weight"));
    a.w_out = w(t.adapter_name("linear_out.weight"));
    a.dln_w = g(t.adapter_name("ln.weight"));
    a.dln_b = g(t.adapter_name("ln.bias"));
    a.dw_in = g(t.adapter_name("linear_in.weight"));
    a.dw_out = g(t.adapter_name("linear_out.weight"));
    a.eps = float(kBottleneckNormEps);
  }
  auto adapted = [&](const std::string& base) {
    nn::Linear lin = linear(base);
    if (auto it = loras.find(base); it != loras.end()) lin.lora = it->second;
    if (auto it = ia3s.find(base); it != ia3s.end()) lin.ia3 = it->second;
    if (auto it = bottlenecks.find(base); it != bottlenecks.end()) lin.bottleneck = it->second;
    return lin;
  };
  // Tensor parallel: this rank's heads, MLP units and vocabulary rows; a
  // row-parallel layer's bias is added once, by tp rank 0, before the group
  // sums its partial outputs (the other ranks hold it and its gradient).
  const int64_t t = tp_.size();
  auto row_parallel = [&](nn::Linear lin) {
    if (tp_.rank() != 0) lin.b = Tensor();
    // A bottleneck adapter reads the whole output: after the group's sum.
    lin.bottleneck_after_sum = t > 1 && lin.bottleneck.active();
    return lin;
  };
  embed_ = nn::Embedding();
  embed_.tp = tp_;
  // Every rank holds padded / t rows; ids from vocab_size on are padding.
  embed_.vocab_start = tp_.rank() * (cfg_.padded_vocab_size(t) / t);
  if (layout_.has("wte")) {  // a pipeline stage without the embedding nor a tied head has none
    embed_.wte = w("wte");
    embed_.wte_q = q("wte");
    if (std::vector<ops::QuantWeight> r = runs("wte"); !r.empty()) embed_.wte_quant = r[0];
    embed_.dwte = g("wte");
  }
  embed_.wpe = maybe("wpe", false);
  embed_.dwpe = maybe("wpe", true);
  blocks_.clear();
  for (int64_t l = 0; l < cfg_.n_layer; ++l) {
    Block b;
    if (!stage_.holds_layer(cfg_, l)) {  // another pipeline stage's
      blocks_.push_back(b);
      continue;
    }
    b.norm1 = norm(L(l, "ln1"));
    b.norm2 = norm(L(l, "ln2"));
    if (spec.post_norms) {
      b.post1 = norm(L(l, "ln_attn_out"));
      b.post2 = norm(L(l, "ln_mlp_out"));
    }
    if (spec.latent_attention) {
      nn::LatentAttention& m = b.attn.mla;
      if (cfg_.q_lora_rank > 0) {
        m.q_a = linear(L(l, "attn.q_a"));
        m.q_a_norm = norm(L(l, "attn.q_a_norm"));
        m.q_b = linear(L(l, "attn.q_b"));
      } else {
        m.q = linear(L(l, "attn.q"));
      }
      m.kv_a = linear(L(l, "attn.kv_a"));
      m.kv_a_norm = norm(L(l, "attn.kv_a_norm"));
      m.kv_b = linear(L(l, "attn.kv_b"));
      // Hugging Face's DeepseekV3RMSNorm default, whatever rms_norm_eps says.
      m.q_a_norm.eps = m.kv_a_norm.eps = 1e-6f;
      m.q_rank = cfg_.q_lora_rank;
      m.kv_rank = cfg_.kv_lora_rank;
      m.rope_dim = cfg_.qk_rope_head_dim;
      m.nope = cfg_.head_dim() - cfg_.qk_rope_head_dim;
      m.v_dim = cfg_.v_head_dim;
    } else {
      b.attn.qkv = adapted(L(l, "attn.qkv"));
    }
    b.attn.proj = row_parallel(adapted(L(l, "attn.proj")));
    b.attn.n_head = cfg_.n_head / t;
    b.attn.n_kv_head = cfg_.n_kv_head / t;
    b.attn.tp = tp_;
    b.attn.head_dim = cfg_.head_dim();
    b.attn.window = cfg_.layer_window(l);
    b.attn.scale = cfg_.attn_scale();
    b.attn.softcap = float(cfg_.attn_logit_softcap);
    b.attn.rope = cfg_.layer_local(l) && rope_local_.defined() ? rope_local_ : rope_;
    if (spec.qk_norm) {
      b.attn.q_norm = norm(L(l, "attn.q_norm"));
      b.attn.k_norm = norm(L(l, "attn.k_norm"));
    }
    if (cfg_.moe_layer(l)) {
      b.moe.router = linear(L(l, "moe.router"));
      b.moe.up = w(L(l, "moe.up.weight"));
      b.moe.dup = g(L(l, "moe.up.weight"));
      b.moe.down = w(L(l, "moe.down.weight"));
      b.moe.ddown = g(L(l, "moe.down.weight"));
      // Quantised experts: each expert's rows of the stacked runs.
      const std::vector<ops::QuantWeight> up_runs = runs(L(l, "moe.up.weight")),
                                          down_runs = runs(L(l, "moe.down.weight"));
      // (Under tensor parallelism this rank's rows of each.)
      const int64_t E = cfg_.num_experts;
      for (int64_t e = 0, n = layout_.find(L(l, "moe.up.weight")).shape[0] / E;
           e < E && !up_runs.empty(); ++e)
        b.moe.up_q.push_back(ops::quant_slice_rows(up_runs, n * e, n));
      for (int64_t e = 0, n = layout_.find(L(l, "moe.down.weight")).shape[0] / E;
           e < E && !down_runs.empty(); ++e)
        b.moe.down_q.push_back(ops::quant_slice_rows(down_runs, n * e, n));
      // QLoRA's NF4 experts: one weight per expert.
      b.moe.up_nf4 = nf4(L(l, "moe.up.weight"));
      b.moe.down_nf4 = nf4(L(l, "moe.down.weight"));
      b.moe.n_experts = cfg_.num_experts;
      b.moe.top_k = cfg_.num_experts_per_tok;
      // This rank's share of each expert's units (all of them when whole:
      // the ranks then split the block's rows, nn/token_split.h).
      // 1 < etp < tp: each expert split over the expert-tp group, the rows
      // over expert-token.
      const int64_t te = tp_.expert_size();
      b.moe.d_ff = cfg_.expert_d_ff() / te;
      if (tp_.experts_whole) {
        b.moe.split = {tp_.comm, tp_.sequence_parallel};
      } else if (tp_.experts_narrower()) {
        b.moe.tp = {tp_.experts, tp_.sequence_parallel};
        b.moe.split = {tp_.tokens, tp_.sequence_parallel};
      } else {
        b.moe.tp = tp_;
      }
      b.moe.sigmoid = cfg_.moe_score_func == "sigmoid";
      b.moe.norm_topk = cfg_.norm_topk_prob;
      b.moe.capacity_factor = cfg_.moe_capacity_factor;
      b.moe.n_group = cfg_.moe_n_group;
      b.moe.topk_group = cfg_.moe_topk_group;
      b.moe.scaling = cfg_.moe_routed_scaling;
      // The score bias from its f32 master where there is one: the choice
      // reads it unrounded (DeepSeek keeps it in f32; its steps are small).
      if (cfg_.has_score_bias()) {
        const ParamInfo& p = layout_.find(L(l, "moe.score_bias"));
        b.moe.bias = has_master(p) ? ParamLayout::view(params_, p) : w(p.name);
      }
      if (cfg_.moe_shared_d_ff > 0) {
        b.moe.shared_d_ff = cfg_.moe_shared_d_ff / te;
        b.moe.shared_up = adapted(L(l, "moe.shared_up"));
        b.moe.shared_down = adapted(L(l, "moe.shared_down"));
        if (!tp_.experts_whole && b.moe.tp.rank() != 0) b.moe.shared_down.b = Tensor();
        if (cfg_.moe_shared_expert_gate) b.moe.shared_gate = linear(L(l, "moe.shared_gate"));
      }
      b.moe.ep = ep_;
      if (auto it = experts_lora.find(L(l, "moe.up")); it != experts_lora.end())
        b.moe.up_lora = it->second;
      if (auto it = experts_lora.find(L(l, "moe.down")); it != experts_lora.end())
        b.moe.down_lora = it->second;
      blocks_.push_back(b);
      continue;
    }
    b.mlp.up = adapted(L(l, "mlp.up"));
    b.mlp.down = row_parallel(adapted(L(l, "mlp.down")));
    b.mlp.swiglu = spec.swiglu;
    b.mlp.geglu = spec.gelu_gate;
    b.mlp.tp = tp_;
    blocks_.push_back(b);
  }
  prompt_ = nn::Prompt();
  if (cfg_.prompt.enabled() && stage_.embedding) {
    prompt_.table = w(kPromptTable);
    prompt_.dtable = g(kPromptTable);
    const std::vector<std::string> mlp = prompt_encoder_layers();
    for (size_t i = 0; i < mlp.size() && cfg_.prompt.encoder_hidden > 0; ++i)
      prompt_.mlp[i] = linear(mlp[i]);
  }
  norm_f_ = nn::Norm();
  head_ = nn::Linear();
  value_ = nn::Linear();
  if (stage_.head) norm_f_ = norm("ln_f");
  if (stage_.head && cfg_.value_head) value_ = linear("value_head");
  if (stage_.head && cfg_.head_tied()) {
    head_.w = embed_.wte;
    head_.wq = embed_.wte_q;
    if (embed_.wte_quant.defined()) head_.wquant = {embed_.wte_quant};
    if (embed_.dwte.defined()) head_.dw = grad_view(layout_.find("wte"), head_unit());
  } else if (stage_.head) {
    head_ = linear(cfg_.classifier() ? "score" : "lm_head");
  }
  // Vocabulary padding (tensor parallel): the head scores only this rank's
  // real rows, so the padding's logits never exist, the cross-entropy's
  // softmax is over vocab_size ids exactly as in one process, and the zero
  // padding rows get no gradient and stay zero. A rank holding padding only
  // scores nothing (head_scored_rows_ = 0).
  head_scored_rows_ = cfg_.classifier() ? cfg_.num_labels
                                        : std::clamp<int64_t>(cfg_.vocab_size - embed_.vocab_start,
                                                              0, cfg_.padded_vocab_size(t) / t);
  if (stage_.head && tp_.active() && head_scored_rows_ < cfg_.padded_vocab_size(t) / t) {
    if (head_.w.defined()) head_.w = head_.w.narrow0(0, head_scored_rows_);
    if (head_.wq.defined() && head_scored_rows_ > 0)  // (none: the head is not run)
      head_.wq = head_.wq.first_rows(head_scored_rows_);
    // Block-quantised: its real rows to a whole group of 16 (a packed run is
    // cut there, so the rank runs one process's kernels; the few padding
    // logits past them are dropped: gather_vocab_logits).
    if (!head_.wquant.empty() && head_scored_rows_ > 0)
      head_.wquant = ops::quant_slice_rows(
          head_.wquant, 0,
          std::min(cfg_.padded_vocab_size(t) / t, (head_scored_rows_ + 15) / 16 * 16));
    if (head_.dw.defined()) head_.dw = head_.dw.narrow0(0, head_scored_rows_);
  }
  loss_.tp = tp_;
  loss_.vocab_start = embed_.vocab_start;
  loss_.ignore_index = kIgnoreIndex;
}

}  // namespace nk
