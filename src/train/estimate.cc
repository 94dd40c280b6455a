#include "train/estimate.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "core/parallel.h"
#include "model/arch.h"
#include "nn/cross_entropy.h"
#include "ops/ops.h"
#include "parallel/pipeline_parallel.h"
#include "train/param_groups.h"
#include "train/train_parallel.h"

namespace nk {

namespace fs = std::filesystem;

ActivationBytes activation_bytes(const ModelConfig& c, DType dt, int64_t B, int64_t T,
                                 const std::vector<Recompute>& recompute, int64_t tp, bool sp,
                                 const PipelineStage& stage, bool training, int64_t ep,
                                 int64_t etp) {
  const int64_t s = int64_t(dtype_size(dt)), N = B * T, C = c.d_model;
  // This rank's heads, MLP units and (padded) vocabulary; R: its rows of the
  // tensors outside the tensor-parallel region (all of them without sp).
  const int64_t Q = c.qkv_dim() / tp, HD = c.n_head * c.head_dim() / tp, U = c.mlp_up_dim() / tp,
                F = c.d_ff / tp, H = c.n_head / tp,
                V = c.classifier() ? c.num_labels : c.padded_vocab_size(tp) / tp,
                R = sp ? N / tp : N;
  // One layer, per Recompute. "cheap": the norms' outputs and the MLP
  // activation's, which a selective layer recomputes.
  const int64_t stats = 4 * R * 4;  // the two norms' mean and rstd, f32
  // A MoE layer (nn/moe.h) keeps, in place of the MLP's, its routing (logits,
  // probs, the chosen experts and weights, the slots' sources and each
  // pair's slot, the stats) and its N k routed rows' gathered input, up
  // projection, activation and output, all of them under any recompute.
  // Expert parallel: the products run over up to Re = ep N k received rows,
  // which the experts' inputs, outputs and the exchange's staging hold too
  // (with the exchange's two row permutations and counts).
  const bool moe = c.is_moe();
  // Tensor parallel: each expert's (and the shared expert's) share of its
  // units, over every row (gathered under sp); experts split over etp < tp
  // ranks (whole ones: etp 1): 1/etp of the units, the buffers sized for
  // every row as well (a rank uses N etp / tp), with the region's scratch
  // of rows (nn/token_split.h) even without sp.
  const int64_t te = etp > 0 ? etp : tp;
  const bool moe_rows = c.is_moe() && te < tp && tp > 1 && !sp;
  const int64_t E = c.num_experts, K = moe ? c.num_experts_per_tok : 0, Fe = c.expert_d_ff() / te;
  const int64_t Re = ep * N * K, ep_rows = ep > 1 ? 3 * Re * C * s : 0;
  const int64_t moe_kept = moe ? N * E * s + N * E * 4 + 4 * N * K * 4 + (E + 1) * 4 +
                                     N * K * 2 * C * s + Re * 3 * Fe * s + ep_rows +
                                     (ep > 1 ? 16 * E + 8 * Re : 0)
                               : 0;
  // A shared expert keeps its up projection, activation and output; its gate
  // the gate's routing (logits, probs, index, weight, slot, stats) and the
  // gated output.
  const int64_t Fs = moe ? c.moe_shared_d_ff / te : 0;
  const bool gate = Fs > 0 && c.moe_shared_expert_gate;
  const int64_t shared_kept =
      N * (3 * Fs + (Fs > 0 ? C : 0)) * s + (gate ? N * s + 4 * N * 4 + 2 * 4 + N * C * s : 0);
  // q/k norms (Qwen3) keep q and k before the norm and their inverse RMS.
  const int64_t QK = c.block().qk_norm ? (c.n_head + c.n_kv_head) / tp : 0;
  const int64_t qk_kept = N * QK * c.head_dim() * s + N * QK * 4;
  const int64_t kept = R * C * s + stats + N * (Q + HD + (moe ? 0 : U)) * s + 4 * B * H * T +
                       moe_kept + shared_kept + qk_kept;  // + lse
  const int64_t cheap = 2 * R * C * s + (moe ? 0 : N * F * s);
  ActivationBytes a;
  bool any_full = false, any_selective = false;
  // Inference keeps one layer's tensors, reused by every layer.
  for (int64_t l = 0; l < (training ? c.n_layer : 1); ++l) {
    if (!stage.holds_layer(c, l)) continue;
    const Recompute r = recompute.empty() ? Recompute::None : recompute[size_t(l)];
    any_full |= r == Recompute::Full;
    any_selective |= r == Recompute::Selective;
    if (r != Recompute::Full) a.saved += kept + (r == Recompute::None ? cheap : 0);
  }
  // The layers that recompute share one set of what they drop.
  if (any_full)
    a.saved += kept + cheap;
  else if (any_selective)
    a.saved += cheap;
  // The residual stream entering each of the stage's layers, and its output.
  int64_t inputs = 0;
  for (int64_t l = 0; l <= c.n_layer; ++l) {
    bool used = false;
    for (const auto& [first, last] : stage.ranges(c)) used = used || (l >= first && l <= last);
    inputs += used ? 1 : 0;
  }
  a.saved += inputs * R * C * s;
  // Workspaces: the final norm (with its statistics) and the block output;
  // one row-chunk of logits (as Activations sizes it) and the losses on the
  // head's stage; the backward's gradients of the residual stream, of a
  // norm's output and of one layer's tensors; sp's gathered input and output.
  a.workspace += 2 * R * C * s + 2 * R * 4;
  if (stage.head) {
    const int64_t max_rows = std::max<int64_t>(256, (int64_t(1) << 25) / V);
    const int64_t chunks = (N + max_rows - 1) / max_rows, chunk = (N + chunks - 1) / chunks;
    a.workspace += chunk * V * s + 4 * N;
    if (tp > 1) a.workspace += 4 * nn::VocabCrossEntropy::stats_size(chunk);
  }
  if (training) {
    a.workspace += 2 * R * C * s + N * (Q + HD + (moe ? 0 : U + F)) * s;
    // MoE backward scratch: d logits, d weights, the balancing gradient, d of
    // the routed rows' output, input, up projection and activation, d input
    // through the router.
    if (moe)
      a.workspace +=
          N * E * s + N * K * 4 + E * 4 + N * K * 2 * C * s + Re * 3 * Fe * s + N * C * s + ep_rows;
    // The shared expert's: d output (before the gate), d up projection and
    // activation; the gate's d weight, d logit and zero balancing gradient.
    if (Fs > 0) a.workspace += N * (C + 3 * Fs) * s + (gate ? N * 4 + N * s + 4 : 0);
    if (QK > 0) a.workspace += N * HD * s;                  // d q, k through the norms
    if (moe && (sp || moe_rows)) a.workspace += N * C * s;  // the MoE input gradient's rows
  }
  if (sp || moe_rows) a.workspace += 2 * N * C * s;
  return a;
}

// ---- rates ----

nlohmann::json MachineRates::to_json() const {
  return {{"machine", machine}, {"bandwidth", bandwidth}, {"gemm", gemm}, {"attention", attention}};
}

MachineRates MachineRates::from_json(const nlohmann::json& j, const std::string& what) {
  MachineRates r;
  try {
    r.machine = j.value("machine", "");
    r.bandwidth = j.value("bandwidth", 0.0);
    if (j.contains("gemm")) r.gemm = j.at("gemm").get<std::map<std::string, double>>();
    if (j.contains("attention"))
      r.attention = j.at("attention").get<std::map<std::string, double>>();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: not a rates object ({})", what, e.what());
  }
  return r;
}

namespace {

// The best of a few timed runs of `f` after one warm-up, at least `min_s`
// seconds in all (and no more than 20 runs).
template <class F>
double best_seconds(F&& f, double min_s = 0.3) {
  f();
  double best = 1e30, spent = 0;
  for (int i = 0; i < 20 && (i < 2 || spent < min_s); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    best = std::min(best, dt);
    spent += dt;
  }
  return best;
}

// Rates are measured with at most this many rows: larger products run at
// the same rate, and a 128k-token head at full size would take seconds.
constexpr int64_t kRateRows = 1024;

struct Gemm {
  int64_t M, K, N;
  double count;  // how many such products one micro-batch runs on this rank
  bool layer;    // a block's (recomputed with it), not the head's
};

std::string gemm_key(DType dt, const Gemm& g) {
  return fmt::format("{} {}x{}x{}", dtype_name(dt), std::min(g.M, kRateRows), g.K, g.N);
}

std::string attention_key(DType dt, int64_t B, int64_t T, int64_t H, int64_t Hkv, int64_t D) {
  return fmt::format("{} {}x{}x{}/{}x{}", dtype_name(dt), B, T, H, Hkv, D);
}

int64_t layers_on(const ModelConfig& c, const PipelineStage& stage) {
  int64_t n = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) n += stage.holds_layer(c, l) ? 1 : 0;
  return n;
}

// The linear layers of one micro-batch on one rank of `stage`.
std::vector<Gemm> gemms(const TrainConfig& cfg, int64_t tp, const PipelineStage& stage) {
  const ModelConfig& c = cfg.model;
  const int64_t N = cfg.micro_batch * cfg.seq_len, C = c.d_model, layers = layers_on(c, stage);
  std::vector<Gemm> g = {{N, C, c.qkv_dim() / tp, double(layers), true},
                         {N, c.n_head * c.head_dim() / tp, C, double(layers), true}};
  if (c.is_moe()) {
    // The router, and the experts' products as if over all N k routed rows
    // at once (each expert's is a share of them). Experts split over etp <
    // tp ranks: each expert-tp group's N etp / tp rows, 1/etp of the units.
    const int64_t etp = cfg.parallel.mesh.etp > 0 && cfg.parallel.mesh.etp < tp
                            ? int64_t(cfg.parallel.mesh.etp)
                            : tp;
    const int64_t Ne = N * etp / tp, Nk = Ne * c.num_experts_per_tok, F = c.expert_d_ff() / etp;
    g.insert(g.end(), {{Ne, C, c.num_experts, double(layers), true},
                       {Nk, C, 2 * F, double(layers), true},
                       {Nk, F, C, double(layers), true}});
    // The shared expert over every row, and its gate.
    if (const int64_t Fs = c.moe_shared_d_ff / etp; Fs > 0)
      g.insert(g.end(), {{Ne, C, 2 * Fs, double(layers), true}, {Ne, Fs, C, double(layers), true}});
    if (c.moe_shared_expert_gate) g.push_back({Ne, C, 1, double(layers), true});
  } else {
    g.insert(g.end(), {{N, C, c.mlp_up_dim() / tp, double(layers), true},
                       {N, c.d_ff / tp, C, double(layers), true}});
  }
  // The head's product over the most real ids a rank scores: its share of
  // the padded vocabulary (rank 0's), no padding.
  const int64_t scored = std::min(c.vocab_size, c.padded_vocab_size(tp) / tp);
  if (stage.head) g.push_back({N, C, scored, 1.0, false});
  return g;
}

std::string cpu_name() {
  std::string cpu = "unknown CPU";
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);)
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  return cpu;
}

// Attention's FLOPs over one micro-batch, forward and backward, as Megatron
// counts them (4·T·heads·head_dim per token and layer forward, 3x with the
// backward; the causal mask's skipped half is in the measured rate).
double attention_flops(const ModelConfig& c, int64_t B, int64_t T, int64_t tp) {
  return 3.0 * 4.0 * double(B) * double(T) * double(T) * double(c.n_head / tp) *
         double(c.head_dim());
}

// Ring attention (parallel.cp_comm_type=p2p) on its busiest rank over one
// process's causal attention of the whole row: the query/key pairs of the
// tiles (64 x 64, or a short row's whole) the kernels compute
// (ops/cpu/attention.cc and attention_block.cc skip a tile only when all
// its keys follow all its queries). Rank r holds chunks r and 2 cp - 1 - r
// of c = T / (2 cp) tokens and meets every rank's two chunks; 1/cp when
// chunks are long against a tile, more when they are short (T = 128 at cp 2:
// 2 tiles of the 3 one process computes).
double ring_attention_share(int64_t T, int64_t cp) {
  constexpr int64_t kTile = 64;
  auto tile_pairs = [&](int64_t local, auto&& qpos, auto&& kpos) {  // positions increasing
    double n = 0;
    for (int64_t q0 = 0; q0 < local; q0 += kTile)
      for (int64_t k0 = 0; k0 < local; k0 += kTile)
        if (kpos(k0) <= qpos(std::min(local, q0 + kTile) - 1))
          n += double(std::min(kTile, local - q0)) * double(std::min(kTile, local - k0));
    return n;
  };
  const int64_t c = T / (2 * cp);
  auto pos = [&](int64_t rank) {
    return [=](int64_t t) { return t < c ? rank * c + t : (2 * cp - 1 - rank) * c + (t - c); };
  };
  double busiest = 0;
  for (int64_t r = 0; r < cp; ++r) {
    double n = 0;
    for (int64_t o = 0; o < cp; ++o) n += tile_pairs(2 * c, pos(r), pos(o));
    busiest = std::max(busiest, n);
  }
  auto same = [](int64_t t) { return t; };
  return busiest / tile_pairs(T, same, same);
}

}  // namespace

std::string rates_machine(const TrainConfig& cfg) {
  if (cfg.threads > 0) set_num_threads(int(cfg.threads));
  return fmt::format("{}, {} threads", cpu_name(), num_threads());
}

std::string rates_cache_path() {
  if (const char* d = std::getenv("NEKTON_CACHE"); d && *d)
    return (fs::path(d) / "rates.json").string();
  const char* home = std::getenv("HOME");
  return (fs::path(home && *home ? home : "/tmp") / ".cache" / "nekton" / "rates.json").string();
}

void measure_missing_rates(const TrainConfig& cfg, MachineRates& r) {
  r.machine = rates_machine(cfg);
  const DType dt = cfg.dtype;
  const Device dev = cfg.device;
  const ModelConfig& c = cfg.model;
  const int64_t tp = std::max(1, cfg.parallel.mesh.tp);
  for (const Gemm& g : gemms(cfg, tp, PipelineStage{})) {
    const std::string key = gemm_key(dt, g);
    if (r.gemm.count(key)) continue;
    const int64_t M = std::min(g.M, kRateRows);
    Tensor x = Tensor::empty({M, g.K}, dt, dev), w = Tensor::empty({g.N, g.K}, dt, dev);
    Tensor y = Tensor::empty({M, g.N}, dt, dev), dx = Tensor::empty({M, g.K}, dt, dev);
    Tensor dw = Tensor::empty({g.N, g.K}, DType::F32, dev);
    for (Tensor* t : {&x, &w, &y, &dw}) ops::fill(*t, 0.01f);
    const double s = best_seconds([&] {
      ops::linear_forward(y, x, w, Tensor());
      ops::linear_backward(dx, dw, Tensor(), y, x, w);
    });
    r.gemm[key] = 6.0 * double(M) * double(g.K) * double(g.N) / s;
  }
  const int64_t B = cfg.micro_batch, T = cfg.seq_len, H = c.n_head / tp, Hkv = c.n_kv_head / tp,
                D = c.head_dim();
  const std::string akey = attention_key(dt, B, T, H, Hkv, D);
  if (!r.attention.count(akey)) {
    Tensor qkv = Tensor::empty({B, T, (H + 2 * Hkv) * D}, dt, dev);
    Tensor out = Tensor::empty({B, T, H * D}, dt, dev), lse = Tensor::empty({B, H, T}, DType::F32);
    Tensor dqkv = Tensor::empty(qkv.shape(), dt, dev), dout = Tensor::empty(out.shape(), dt, dev);
    ops::fill(qkv, 0.01f);
    ops::fill(dout, 0.01f);
    const double s = best_seconds([&] {
      ops::attention_forward(out, lse, qkv, H, Hkv);
      ops::attention_backward(dqkv, dout, qkv, out, lse, H, Hkv);
    });
    r.attention[akey] = attention_flops(c, B, T, tp) / s;
  }
  if (r.bandwidth <= 0) {
    const int64_t n = int64_t(1) << 26;  // 256 MiB of f32
    Tensor a = Tensor::empty({n}, DType::F32, dev), b = Tensor::empty({n}, DType::F32, dev);
    ops::fill(a, 1.f);
    ops::fill(b, 0.f);
    const double s = best_seconds([&] { ops::convert(b, a); });
    r.bandwidth = 2.0 * 4.0 * double(n) / s;
  }
}

const RankEstimate& TrainEstimate::peak() const {
  return *std::max_element(
      stages.begin(), stages.end(),
      [](const RankEstimate& a, const RankEstimate& b) { return a.total() < b.total(); });
}

TrainEstimate estimate_training(const TrainConfig& cfg, int64_t world, const MachineRates* rates) {
  TrainEstimate e;
  const dist::MeshSpec& spec = cfg.parallel.mesh;
  const int64_t model_par = int64_t(spec.tp) * spec.cp * spec.pp;
  if (world <= 0) world = model_par * std::max(1, spec.dp);
  const dist::Mesh mesh = train_mesh(cfg, int(world), 0);  // nk::Error naming the parallel.* keys
  e.world = world;
  e.dp = mesh.dp();
  e.tp = mesh.tp();
  e.pp = mesh.pp();
  e.ep = mesh.ep();
  e.cp = mesh.cp();
  const nn::CpComm cp_comm = nn::parse_cp_comm(cfg.parallel.cp_comm_type);
  const int64_t cp_a2a =
      cfg.parallel.hierarchical_cp_sizes.empty() ? 1 : cfg.parallel.hierarchical_cp_sizes[0];
  e.etp = mesh.etp();
  e.edp = mesh.edp();
  const ModelConfig& c = cfg.model;
  const ParamLayout whole = Transformer::layout_for(c, cfg.frozen, cfg.frozen_weights);
  e.params = whole.count();
  // Tensor parallel: each rank's shards (every expert's share, or every
  // expert whole: parallel.etp = 1, or each split tensor over 1 < etp < tp
  // ranks); expert parallel: of those, this rank's experts.
  const ParamLayout held = Transformer::tensor_parallel_global(whole, e.tp, e.etp);
  const ParamLayout shards = e.tp == 1 ? whole : held.shard(e.tp);
  const ParamLayout layout = e.ep > 1 ? shards.shard_experts(e.ep) : shards;
  const bool sp = cfg.parallel.sequence_parallel, bf16 = cfg.dtype != DType::F32;
  const std::vector<Recompute> plan =
      recompute_plan(cfg.recompute, cfg.recompute_layers, c.n_layer);
  const int64_t B = cfg.micro_batch, T = cfg.seq_len;
  const int64_t local_accum = cfg.grad_accum() / e.dp;
  const parallel::Shard shard = cfg.ddp.shard;
  for (int64_t s = 0; s < e.pp; ++s) {
    const PipelineStage stage =
        e.pp > 1 ? parallel::pipeline_stage(c, e.pp, s, cfg.parallel.pp_layout, cfg.parallel.vp)
                 : PipelineStage{};
    RankEstimate r;
    r.stage = s;
    // Weights: an f32 master for every parameter that has one (all with
    // FrozenWeights::Master, else the trainable ones), a compute copy in
    // bf16 up to the quantised ones, and QLoRA's NF4 storage.
    int64_t masters = 0, dense = 0, trainable = 0, nf4 = 0, expert_trainable = 0;
    for (const ParamInfo& p : layout.params()) {
      if (e.pp > 1 && !stage.holds(c, p.name)) continue;
      const int64_t n = p.numel();
      r.params += n;
      if (p.trainable || cfg.frozen_weights == FrozenWeights::Master) masters += n;
      if (p.trainable) trainable += n;
      if (p.trainable && e.ep > 1 && p.split == Split::Experts) expert_trainable += n;
      if (p.quantized) {
        // A MoE layer's experts: each its own (under EP this rank's). Under
        // TP a share's absmax scales may cover fewer blocks each
        // (ops::nf4_shard_scale_block): the rank that holds the most.
        const ParamInfo& local = shards.find(p.name);
        std::vector<Shape> runs = nf4_runs(c, local);
        const size_t mine = p.split == Split::Experts ? runs.size() / size_t(e.ep) : runs.size();
        int64_t most = 0;
        for (int64_t rank = 0; rank < e.tp; ++rank) {
          const std::vector<std::vector<ops::Nf4Piece>> pieces =
              e.tp > 1 ? Transformer::nf4_shard_pieces(c, held.find(p.name), local, rank, e.tp)
                       : std::vector<std::vector<ops::Nf4Piece>>();
          int64_t bytes = 0;
          for (size_t i = 0; i < mine; ++i) {
            const int64_t k = shape_numel(runs[i]),
                          blocks = (k + ops::kNf4Block - 1) / ops::kNf4Block;
            const int64_t per_scale =
                pieces.empty() ? ops::kNf4ScaleBlock : ops::nf4_shard_scale_block(pieces[i]);
            bytes += (k + 1) / 2 + blocks + 4 * ((blocks + per_scale - 1) / per_scale) + 4;
          }
          most = std::max(most, bytes);
        }
        nf4 += most;
      } else {
        dense += n;
      }
    }
    // FSDP keeps 1/dp of the weights resident (and the unit in use);
    // ZeRO-1 and 2 with bf16 compute keep 1/dp of the trainable f32 masters
    // (the frozen ones stay whole); ZeRO-1, 2 and FSDP shard the optimizer
    // state. optim.*: moments of 4 or 2 bytes each (f16 ones with two f32
    // scales per parameter group); a bf16 master is the compute copy, with a
    // 2-byte remainder per trainable parameter in the optimizer's state
    // unless uncompensated, and no f32 arena.
    // Under expert parallelism ZeRO-1 and FSDP shard the experts' part over
    // the expert-dp ranks (those holding the same experts: dp / ep of them
    // when etp = tp).
    const OptimPrecision& pr = cfg.adamw.precision;
    const double edp = double(e.edp);
    const double sharded_trainable =
        double(trainable - expert_trainable) / double(e.dp) + double(expert_trainable) / edp;
    const double weight_share =
        shard != parallel::Shard::Full ? 1.0
        : masters == 0
            ? 1.0 / double(e.dp)
            : (double(masters - expert_trainable) / double(e.dp) + double(expert_trainable) / edp) /
                  double(masters);
    const double state_share = shard == parallel::Shard::None || trainable == 0
                                   ? 1.0
                                   : sharded_trainable / double(trainable);
    double f32_masters = pr.master == DType::F32 ? 4.0 * double(masters) : 0;
    if (pr.master == DType::F32 && bf16 &&
        (shard == parallel::Shard::Optimizer || shard == parallel::Shard::Gradients))
      f32_masters = 4.0 * (sharded_trainable + double(masters - trainable));
    r.weight_bytes = int64_t((f32_masters + (bf16 ? 2.0 * double(dense) : 0)) * weight_share) + nf4;
    // bf16 gradients: 2 bytes each, plus the f32 staging of the largest
    // backward stage and the optimizer's f32 scratch of one chunk.
    const bool bf16_grads = pr.grads == DType::BF16;
    const int64_t largest_stage = plan_grad_staging(c, layout).elems, gs = bf16_grads ? 2 : 4;
    const int64_t staging = bf16_grads ? 4 * largest_stage : 0;
    r.grad_arena_bytes = gs * trainable + staging;
    r.grad_bytes = r.grad_arena_bytes;
    // Sharded gradients: each bucket's other blocks are handed back once
    // reduced, so at most the stage being computed and a bucket on its way
    // are resident beside this rank's blocks (a pipeline accumulates its
    // micro-batches whole: FSDP under one holds them all).
    if (shard == parallel::Shard::Gradients || (shard == parallel::Shard::Full && e.pp == 1)) {
      const double in_flight = std::min(double(trainable) - sharded_trainable,
                                        double(largest_stage + cfg.ddp.bucket_elems()));
      r.grad_bytes = int64_t(double(gs) * (sharded_trainable + in_flight)) + staging;
    }
    const int64_t per_state =
        2 * int64_t(dtype_size(pr.moments)) + (pr.master == DType::BF16 && pr.compensation ? 2 : 0);
    r.optimizer_bytes = int64_t(double(per_state * trainable) * state_share);
    if (bf16_grads && trainable > 0)
      r.optimizer_bytes += 4 * std::min(AdamW::kGradChunk, trainable);
    if (pr.moments == DType::F16)
      r.optimizer_bytes +=
          8 * int64_t(default_param_groups(layout, cfg.adamw.weight_decay, layout.total()).size());
    // Context parallel: each rank's activations hold its T / cp tokens.
    r.per_micro_batch = activation_bytes(c, cfg.dtype, B, T / mesh.cp(), plan, e.tp, sp, stage,
                                         true, e.ep, c.is_moe() ? e.etp : 0);
    if (mesh.cp() > 1)
      r.cp_buffer_bytes = nn::cp_buffer_bytes(cp_comm, e.cp, cp_a2a, B, T / e.cp, c.n_head / e.tp,
                                              c.n_kv_head / e.tp, c.head_dim(), cfg.dtype);
    r.in_flight =
        e.pp > 1 ? parallel::pipeline_max_in_flight(e.pp, s, cfg.parallel.vp, local_accum) : 1;
    e.stages.push_back(r);
  }
  const int64_t tokens = B * T * cfg.grad_accum();
  e.flops_per_step = c.train_flops(tokens, T);
  if (e.cp > 1) {
    // Context parallel: every layer's attention exchanges forward and
    // backward, a fully recomputed layer's forward ones again, per
    // micro-batch of the rank's busiest stage.
    int64_t layers = 0, full = 0;
    for (int64_t s = 0; s < e.pp; ++s) {
      const PipelineStage st =
          e.pp > 1 ? parallel::pipeline_stage(c, e.pp, s, cfg.parallel.pp_layout, cfg.parallel.vp)
                   : PipelineStage{};
      int64_t n = 0, f = 0;
      for (int64_t l = 0; l < c.n_layer; ++l)
        if (st.holds_layer(c, l)) {
          ++n;
          f += plan[size_t(l)] == Recompute::Full ? 1 : 0;
        }
      if (n > layers) std::tie(layers, full) = std::pair(n, f);
    }
    const nn::CpExchangeBytes x =
        nn::cp_exchange_bytes(cp_comm, e.cp, cp_a2a, B, T / e.cp, c.n_head / e.tp,
                              c.n_kv_head / e.tp, c.head_dim(), cfg.dtype);
    e.cp_bytes_per_step = local_accum * (layers * (x.forward + x.backward) + full * x.forward);
  }
  if (c.is_moe()) {
    // Expert parallel: each MoE layer's micro-batch sends its N k routed rows
    // out and back in the forward, and their gradients the same way in the
    // backward (a fully recomputed layer's forward once more); with even
    // routing (ep - 1) / ep of them leave the rank.
    for (const ParamInfo& p : whole.params())
      if (p.name.find(".moe.up.") != std::string::npos ||
          p.name.find(".moe.down.") != std::string::npos)
        e.expert_params += p.numel();
    e.expert_params_computed = e.expert_params / (e.ep * e.etp);  // its experts' etp shares
    // Per rank: the MoE layers of its stage (the busiest one under pipeline
    // parallelism).
    int64_t layers = 0, full = 0;
    for (int64_t s = 0; s < e.pp; ++s) {
      const PipelineStage st =
          e.pp > 1 ? parallel::pipeline_stage(c, e.pp, s, cfg.parallel.pp_layout, cfg.parallel.vp)
                   : PipelineStage{};
      int64_t n = 0, f = 0;
      for (int64_t l = 0; l < c.n_layer; ++l)
        if (c.moe_layer(l) && st.holds_layer(c, l)) {
          ++n;
          f += plan[size_t(l)] == Recompute::Full ? 1 : 0;
        }
      if (n > layers) std::tie(layers, full) = std::pair(n, f);
    }
    // Experts split over etp < tp ranks (whole ones: etp 1): each expert-tp
    // group routes its N etp / tp rows.
    const double rows = double(B * T * c.num_experts_per_tok) * double(e.ep - 1) / double(e.ep) /
                        double(e.etp < e.tp ? e.tp / e.etp : 1);
    e.a2a_bytes_per_step = int64_t(double(local_accum) * double(4 * layers + 2 * full) * rows *
                                   double(c.d_model) * double(dtype_size(cfg.dtype)));
  }
  if (!rates) return e;
  auto rate = [&](const std::map<std::string, double>& m, const std::string& key) {
    auto it = m.find(key);
    if (it == m.end() || !(it->second > 0)) fail("rates: no measured rate for '{}'", key);
    return it->second;
  };
  const double s = double(dtype_size(cfg.dtype)), N = double(B * T);
  // (A MoE layer's feed-forward tensors: its k routed copies of each row's
  // input, up projection, activation and output, and the router's logits.)
  const int64_t ffn =
      c.is_moe() ? c.num_experts_per_tok * (2 * c.d_model + 3 * c.expert_d_ff()) + c.num_experts
                 : c.mlp_up_dim() + c.d_ff;
  const double layer_bytes = N * s * double(6 * c.d_model + (c.qkv_dim() + ffn) / e.tp);
  // One micro-batch's forward and backward on a rank of each stage (its
  // layers, and the head's product and the loss on the last).
  const int64_t cp = mesh.cp();
  // The attention's share of one process's on a rank: its heads / cp over
  // the whole row (a2a), or the tiles of its chunks against every chunk
  // (p2p and all_gather, through the block kernel; a2a+p2p: a ring of cp /
  // a2a over 1/a2a of the heads).
  const double attention_share = cp <= 1                      ? 1.0
                                 : cp_comm == nn::CpComm::A2A ? 1.0 / double(cp)
                                 : cp_comm == nn::CpComm::A2AP2P
                                     ? ring_attention_share(T, cp / cp_a2a) / double(cp_a2a)
                                     : ring_attention_share(T, cp);
  std::vector<StepTime> stage_time;
  double again_flops = 0;  // what full recompute adds, one micro-batch through every stage
  for (int64_t si = 0; si < e.pp; ++si) {
    const PipelineStage stage =
        e.pp > 1 ? parallel::pipeline_stage(c, e.pp, si, cfg.parallel.pp_layout, cfg.parallel.vp)
                 : PipelineStage{};
    const int64_t layers = layers_on(c, stage);
    int64_t full = 0;
    for (int64_t l = 0; l < c.n_layer; ++l)
      full += stage.holds_layer(c, l) && plan[size_t(l)] == Recompute::Full ? 1 : 0;
    StepTime t;
    // A fully recomputing layer runs its forward again: 2 of its 6 FLOPs per
    // multiply-add (attention: a third of its fwd + bwd).
    for (const Gemm& g : gemms(cfg, e.tp, stage)) {
      const double mkn = double(g.M) * double(g.K) * double(g.N);
      const double again = g.layer ? 2.0 * mkn * double(full) : 0.0;
      again_flops += again;
      t.gemm_s += (6.0 * mkn * g.count + again) / rate(rates->gemm, gemm_key(cfg.dtype, g));
    }
    const double att = attention_flops(c, B, T, e.tp);
    again_flops += att / 3.0 * double(full);
    t.attention_s = att * (double(layers) + double(full) / 3.0) /
                    rate(rates->attention, attention_key(cfg.dtype, B, T, c.n_head / e.tp,
                                                         c.n_kv_head / e.tp, c.head_dim()));
    // Memory-bound work: each layer's elementwise passes (norms, rotary,
    // residual adds, the MLP activation) read and write about its tensors
    // twice in the forward and twice in the backward; the loss reads and
    // writes the logits three times.
    const double logits =
        stage.head ? 3.0 * N * s * double(std::min(c.vocab_size, c.padded_vocab_size(e.tp) / e.tp))
                   : 0.0;
    t.memory_s = (4.0 * layer_bytes * double(layers) + logits) / rates->bandwidth;
    // Context parallel: a rank's T / cp tokens through the products and
    // elementwise passes; its share of the attention (above).
    if (cp > 1) {
      t.gemm_s /= double(cp);
      t.memory_s /= double(cp);
      t.attention_s *= attention_share;
    }
    stage_time.push_back(t);
  }
  // The pipeline (1F1B over pp stages of vp chunks each): the slowest
  // stage sets the pace of the steady state, m micro-batches of it; the
  // fill and drain add the other stages' work once, a chunk (1/vp) at a
  // time. With even stages, (m + (pp - 1) / vp) micro-batches of one; with
  // one micro-batch, the stages one after another. Without pipelining: m.
  const double m = double(local_accum), vp = double(std::max<int64_t>(1, cfg.parallel.vp));
  size_t slow = 0;
  for (size_t i = 1; i < stage_time.size(); ++i)
    if (stage_time[i].total() > stage_time[slow].total()) slow = i;
  StepTime sum;
  for (const StepTime& t : stage_time) {
    sum.gemm_s += t.gemm_s;
    sum.attention_s += t.attention_s;
    sum.memory_s += t.memory_s;
  }
  const StepTime& mx = stage_time[slow];
  auto compose = [&](double StepTime::*f) { return m * (mx.*f) + (sum.*f - mx.*f) / vp; };
  e.step.gemm_s = compose(&StepTime::gemm_s);
  e.step.attention_s = compose(&StepTime::attention_s);
  e.step.memory_s = compose(&StepTime::memory_s);
  // Whole step, all ranks, as flops_per_step (the products above are one
  // tensor-parallel rank's share).
  e.recompute_flops = again_flops * m * double(e.dp * e.tp);
  // The optimizer reads the master, gradient and both moments of its state
  // and writes all but the gradient (and the bf16 copy); the gradients are
  // zeroed once per step. Per state element: the f32 step reads 16 bytes
  // and writes 12 (and a 2-byte bf16 copy); with reduced moments or a bf16
  // master the same reads and writes at their sizes. (The slowest stage's
  // rank.)
  const RankEstimate& r = e.stages[slow];
  const OptimPrecision& pr = cfg.adamw.precision;
  const double share = shard != parallel::Shard::None ? 1.0 / double(e.dp) : 1.0;
  const double mom = double(dtype_size(pr.moments)),
               state = double(r.grad_arena_bytes) / 4.0 * share;
  const double master = pr.master == DType::F32 ? 8.0 : (pr.compensation ? 8.0 : 4.0);
  // Zeroing the gradients: the arena, or this rank's blocks where they are sharded.
  const bool grads_sharded =
      shard == parallel::Shard::Gradients || (shard == parallel::Shard::Full && e.pp == 1);
  const double opt =
      state * (master + 4.0 + 4.0 * mom + (bf16 && pr.master == DType::F32 ? 2.0 : 0.0)) +
      double(r.grad_arena_bytes) * (grads_sharded ? share : 1.0);
  e.step.memory_s += opt / rates->bandwidth;
  return e;
}

nlohmann::json estimate_json(const TrainEstimate& e) {
  nlohmann::json stages = nlohmann::json::array();
  for (const RankEstimate& r : e.stages)
    stages.push_back({{"stage", r.stage},
                      {"params", r.params},
                      {"weight_bytes", r.weight_bytes},
                      {"grad_bytes", r.grad_bytes},
                      {"optimizer_bytes", r.optimizer_bytes},
                      {"activation_bytes", r.activation_bytes()},
                      {"workspace_bytes", r.workspace_bytes()},
                      {"activation_bytes_per_micro_batch", r.per_micro_batch.saved},
                      {"workspace_bytes_per_micro_batch", r.per_micro_batch.workspace},
                      {"micro_batches_in_flight", r.in_flight},
                      {"cp_buffer_bytes", r.cp_buffer_bytes},
                      {"total_bytes", r.total()}});
  return {{"world", e.world},
          {"dp", e.dp},
          {"tp", e.tp},
          {"pp", e.pp},
          {"ep", e.ep},
          {"etp", e.etp},
          {"edp", e.edp},
          {"params", e.params},
          {"expert_params", e.expert_params},
          {"expert_params_computed_per_rank", e.expert_params_computed},
          {"a2a_bytes_per_step_per_rank", e.a2a_bytes_per_step},
          {"cp", e.cp},
          {"cp_bytes_per_step_per_rank", e.cp_bytes_per_step},
          {"stages", stages},
          {"peak_total_bytes", e.peak().total()},
          {"flops_per_step", e.flops_per_step},
          {"recompute_flops", e.recompute_flops},
          {"step_seconds",
           {{"gemm", e.step.gemm_s},
            {"attention", e.step.attention_s},
            {"memory", e.step.memory_s},
            {"total", e.step.total()}}}};
}

}  // namespace nk
