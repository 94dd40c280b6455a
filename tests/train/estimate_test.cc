// `nekton estimate` (train/estimate.h) against what the step really
// allocates: the activation formula against the planned workspace
// (Activations::bytes) for every recompute policy, GPT-2 and Llama shapes,
// f32 and bf16, two sequence lengths and a pipeline stage; the weights,
// gradients and optimizer state against the arenas; the total against the
// measured tensor peak of real steps.
#include "train/estimate.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "ckpt/model_io.h"
#include "core/allocator.h"
#include "dist/communicator.h"
#include "parallel/pipeline_parallel.h"
#include "test_util.h"
#include "train/trainer.h"

#include "test_paths.h"
#include "train/corpus.h"

namespace nk {
namespace {

namespace fs = std::filesystem;
using test::run_nekton;

using test::corpus_path;

TrainConfig recipe(const std::vector<std::string>& extra) {
  std::vector<std::string> o = {"data.path=" + corpus_path(), "data.tokenizer=bytes",
                                "train.log_every=100", "train.val_every=0", "train.peak_tflops=1"};
  o.insert(o.end(), extra.begin(), extra.end());
  return train_config_from(Config::load(train_schema(), "", o));
}

// Three shapes of two families, each at its own vocabulary and head layout.
const std::vector<std::vector<std::string>> kShapes = {
    {"model.preset=gpt-tiny", "model.n_layer=3"},
    {"model.preset=llama-tiny", "model.n_layer=3", "model.vocab_size=1000"},
    {"model.preset=gpt-tiny", "model.d_model=384", "model.n_layer=2", "model.vocab_size=3000"},
    {"model.preset=mixtral-tiny", "model.n_layer=3", "model.moe_d_ff=48"}};

TEST(Estimate, ActivationsEqualThePlannedWorkspace) {
  // A reward model besides: a score head of one label, not the vocabulary's logits.
  std::vector<std::vector<std::string>> shapes = kShapes;
  shapes.push_back({"model.preset=llama-tiny", "model.n_layer=2", "model.num_labels=1"});
  // Shared experts (gated), q/k norms and heads of their own size.
  shapes.push_back({"model.preset=qwen2-moe-tiny", "model.n_layer=2"});
  shapes.push_back({"model.preset=qwen3-moe-tiny", "model.n_layer=2"});
  shapes.push_back({"model.preset=qwen3-tiny", "model.n_layer=2"});
  for (const auto& shape : shapes)
    for (const char* dt : {"f32", "bf16"})
      for (int64_t T : {64, 128})
        for (const char* policy : {"none", "selective", "full"})
          for (int64_t layers : {int64_t(0), int64_t(1)}) {
            std::vector<std::string> o = shape;
            o.push_back(std::string("train.dtype=") + dt);
            o.push_back(std::string("train.recompute=") + policy);
            o.push_back("train.recompute_layers=" + std::to_string(layers));
            TrainConfig cfg = recipe(o);
            const std::vector<Recompute> plan = recompute_plan(policy, layers, cfg.model.n_layer);
            const Activations planned(cfg.model, cfg.dtype, 3, T, true, kHost, plan);
            EXPECT_EQ(activation_bytes(cfg.model, cfg.dtype, 3, T, plan).total(), planned.bytes())
                << fmt::format("{} {} T={} {} first {} layers", shape[0], dt, T, policy, layers);
          }
}

// A forward-only workspace (a frozen reference copy's, nekton estimate's
// alignment section).
TEST(Estimate, ForwardOnlyActivationsEqualThePlannedWorkspace) {
  for (const auto& shape : kShapes)
    for (const char* dt : {"f32", "bf16"}) {
      std::vector<std::string> o = shape;
      o.push_back(std::string("train.dtype=") + dt);
      TrainConfig cfg = recipe(o);
      const Activations planned(cfg.model, cfg.dtype, 2, 64, false);
      EXPECT_EQ(activation_bytes(cfg.model, cfg.dtype, 2, 64, {}, 1, false, {}, false).total(),
                planned.bytes())
          << shape[0] << " " << dt;
    }
}

TEST(Estimate, ActivationsOfAPipelineStageEqualItsWorkspace) {
  TrainConfig cfg = recipe({"model.preset=llama-tiny", "model.n_layer=4", "train.dtype=bf16"});
  for (int64_t s = 0; s < 2; ++s)
    for (const char* policy : {"none", "full"}) {
      const PipelineStage stage = parallel::pipeline_stage(cfg.model, 2, s);
      const auto plan = recompute_plan(policy, 0, cfg.model.n_layer);
      const Activations planned(cfg.model, cfg.dtype, 2, 64, true, kHost, plan, {}, stage);
      EXPECT_EQ(activation_bytes(cfg.model, cfg.dtype, 2, 64, plan, 1, false, stage).total(),
                planned.bytes())
          << "stage " << s << " " << policy;
    }
}

// A tensor-parallel group of `n` that only sizes buffers: Activations asks
// it for its size, never for a collective.
class SizeOnlyGroup final : public dist::Communicator {
 public:
  explicit SizeOnlyGroup(int n) : Communicator("tp", ranks(n), 0, 1.0) {}

 private:
  static std::vector<int> ranks(int n) {
    std::vector<int> r(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) r[size_t(i)] = i;
    return r;
  }
  [[noreturn]] static dist::WorkPtr no() { fail("SizeOnlyGroup: no collectives"); }
  dist::WorkPtr do_all_reduce(const Tensor&, dist::ReduceOp) override { no(); }
  dist::WorkPtr do_reduce_scatter(const Tensor&, const Tensor&, dist::ReduceOp) override { no(); }
  dist::WorkPtr do_all_gather(const Tensor&, const Tensor&) override { no(); }
  dist::WorkPtr do_all_to_all(const Tensor&, const Tensor&) override { no(); }
  dist::WorkPtr do_all_to_allv(const Tensor&, std::vector<int64_t>, const Tensor&,
                               std::vector<int64_t>) override {
    no();
  }
  dist::WorkPtr do_reduce_scatter_v(const Tensor&, std::vector<int64_t>, dist::ReduceOp) override {
    no();
  }
  dist::WorkPtr do_all_gather_v(const Tensor&, std::vector<int64_t>) override { no(); }
  dist::WorkPtr do_broadcast(const Tensor&, int) override { no(); }
  dist::WorkPtr do_send(const Tensor&, int, int) override { no(); }
  dist::WorkPtr do_recv(const Tensor&, int, int) override { no(); }
  dist::WorkPtr do_barrier() override { no(); }
};

TEST(Estimate, ActivationsUnderTensorAndSequenceParallelismEqualTheWorkspace) {
  int cases = 0;
  for (const auto& shape : kShapes)
    for (int tp : {2, 4})
      for (bool sp : {false, true})
        for (const char* policy : {"none", "selective", "full"}) {
          std::vector<std::string> o = shape;
          o.push_back("train.dtype=bf16");
          TrainConfig cfg = recipe(o);
          try {
            check_tensor_parallel(cfg.model, tp);
          } catch (const Error&) {
            continue;  // heads or MLP that tp does not divide (the vocabulary is padded)
          }
          ++cases;
          SizeOnlyGroup group(tp);
          const auto plan = recompute_plan(policy, 0, cfg.model.n_layer);
          const Activations planned(cfg.model, cfg.dtype, 2, 64, true, kHost, plan,
                                    nn::TensorParallel{&group, sp});
          EXPECT_EQ(activation_bytes(cfg.model, cfg.dtype, 2, 64, plan, tp, sp).total(),
                    planned.bytes())
              << fmt::format("{} tp={} sp={} {}", shape[0], tp, sp, policy);
        }
  EXPECT_GE(cases, 12);
}

// Whole experts under tensor parallelism (parallel.etp = 1): every expert's
// units on each rank, the MoE region's scratch of rows without sp; the
// experts' weights whole per rank, the all-to-all each tp rank's tokens.
TEST(Estimate, WholeExpertsUnderTensorParallelismEqualTheWorkspace) {
  for (bool sp : {false, true})
    for (const char* policy : {"none", "selective", "full"}) {
      TrainConfig cfg = recipe(kShapes.back());
      SizeOnlyGroup group(2);
      const auto plan = recompute_plan(policy, 0, cfg.model.n_layer);
      const Activations planned(cfg.model, cfg.dtype, 2, 64, true, kHost, plan,
                                nn::TensorParallel{&group, sp, true});
      EXPECT_EQ(activation_bytes(cfg.model, cfg.dtype, 2, 64, plan, 2, sp, {}, true, 1, 1).total(),
                planned.bytes())
          << "sp=" << sp << " " << policy;
    }
  std::vector<std::string> o = kShapes.back();
  for (const char* k : {"parallel.tp=2", "parallel.etp=1", "parallel.ep=2", "train.micro_batch=2",
                        "train.seq_len=64", "train.global_batch=8", "train.dtype=f32"})
    o.push_back(k);
  const TrainEstimate e = estimate_training(recipe(o), 2, nullptr);
  EXPECT_EQ(e.etp, 1);
  EXPECT_EQ(e.edp, 1);
  EXPECT_EQ(e.expert_params_computed, e.expert_params / 2);  // half the experts, whole
  // The same layout with the experts split over tp (etp 2, no ep): the same
  // expert share per rank; each tp rank routes its 64 of the 128 tokens.
  std::vector<std::string> split = o;
  std::erase(split, std::string("parallel.etp=1"));
  std::erase(split, std::string("parallel.ep=2"));
  const TrainEstimate t = estimate_training(recipe(split), 2, nullptr);
  EXPECT_EQ(t.etp, 2);
  EXPECT_EQ(e.peak().params, t.peak().params);
  const ModelConfig& c = recipe(o).model;
  EXPECT_EQ(e.a2a_bytes_per_step,
            4 * 4 * c.n_layer * (64 * c.num_experts_per_tok / 2) * c.d_model * 4);
  EXPECT_EQ(estimate_json(e).at("etp"), 1);
}

// Experts split over fewer ranks than tp (parallel.etp = 2 under tp = 4):
// half of every expert's units on each rank, the MoE region's scratch of
// rows without sp; each rank computes half of each expert's weights, and
// each expert-tp group routes half of the tokens.
TEST(Estimate, ExpertsSplitOverEtpBelowTpEqualTheWorkspace) {
  std::vector<std::string> shape = kShapes.back();
  shape.push_back("model.n_kv_head=4");
  for (bool sp : {false, true})
    for (const char* policy : {"none", "selective", "full"}) {
      TrainConfig cfg = recipe(shape);
      SizeOnlyGroup group(4), experts(2), tokens(2);
      nn::TensorParallel tp{&group, sp};
      tp.experts = &experts;
      tp.tokens = &tokens;
      const auto plan = recompute_plan(policy, 0, cfg.model.n_layer);
      const Activations planned(cfg.model, cfg.dtype, 2, 64, true, kHost, plan, tp);
      EXPECT_EQ(activation_bytes(cfg.model, cfg.dtype, 2, 64, plan, 4, sp, {}, true, 1, 2).total(),
                planned.bytes())
          << "sp=" << sp << " " << policy;
    }
  std::vector<std::string> o = shape;
  for (const char* k : {"parallel.tp=4", "parallel.etp=2", "parallel.ep=2", "train.micro_batch=2",
                        "train.seq_len=64", "train.global_batch=8", "train.dtype=f32"})
    o.push_back(k);
  const TrainEstimate e = estimate_training(recipe(o), 4, nullptr);
  EXPECT_EQ(e.etp, 2);
  EXPECT_EQ(e.edp, 1);
  EXPECT_EQ(e.expert_params_computed, e.expert_params / 4);  // half the experts, half of each
  // Against etp 4 (each expert over all four ranks) without ep: the same
  // expert share per rank; each expert-tp group routes 64 of the 128 tokens.
  std::vector<std::string> split = o;
  std::erase(split, std::string("parallel.etp=2"));
  std::erase(split, std::string("parallel.ep=2"));
  const TrainEstimate t = estimate_training(recipe(split), 4, nullptr);
  EXPECT_EQ(t.etp, 4);
  EXPECT_EQ(e.peak().params, t.peak().params);
  const ModelConfig& c = recipe(o).model;
  EXPECT_EQ(e.a2a_bytes_per_step,
            4 * 4 * c.n_layer * (64 * c.num_experts_per_tok / 2) * c.d_model * 4);
  EXPECT_EQ(estimate_json(e).at("etp"), 2);
}

// Context parallel: each rank's workspace holds its T / cp tokens, which is
// what the trainer plans for it (Activations of seq_len / cp).
TEST(Estimate, ActivationsUnderContextParallelismHoldEachRanksTokens) {
  for (int cp : {2, 4}) {
    TrainConfig cfg = recipe({"model.preset=llama-tiny", "model.n_layer=3", "model.vocab_size=1000",
                              "train.seq_len=64", "train.micro_batch=2", "train.global_batch=2",
                              "parallel.cp=" + std::to_string(cp)});
    const Activations planned(cfg.model, cfg.dtype, 2, 64 / cp, true, kHost,
                              recompute_plan("none", 0, cfg.model.n_layer));
    const TrainEstimate e = estimate_training(cfg, cp, nullptr);
    EXPECT_EQ(e.stages[0].per_micro_batch.total(), planned.bytes()) << "cp " << cp;
    // The attention's exchange buffers: the ring's K/V blocks, or under
    // parallel.cp_comm_type=a2a the heads' whole rows.
    const int64_t D = cfg.model.head_dim(), Hq = cfg.model.n_head, Hkv = cfg.model.n_kv_head;
    EXPECT_EQ(e.stages[0].cp_buffer_bytes,
              nn::RingScratch::bytes_for(2, 64 / cp, Hq, Hkv, D, cfg.dtype));
    EXPECT_EQ(estimate_json(e).at("stages")[0].at("cp_buffer_bytes"), e.stages[0].cp_buffer_bytes);
    TrainConfig a2a = cfg;
    a2a.parallel.cp_comm_type = "a2a";
    if (Hq % cp == 0 && Hkv % cp == 0)
      EXPECT_EQ(estimate_training(a2a, cp, nullptr).stages[0].cp_buffer_bytes,
                nn::HeadScratch::bytes_for(2, 64 / cp, Hq, Hkv, D, cfg.dtype));
    else
      EXPECT_THROW(estimate_training(a2a, cp, nullptr), Error);
    EXPECT_LT(planned.bytes(),
              estimate_training(
                  recipe({"model.preset=llama-tiny", "model.n_layer=3", "model.vocab_size=1000",
                          "train.seq_len=64", "train.micro_batch=2", "train.global_batch=2"}),
                  1, nullptr)
                  .stages[0]
                  .per_micro_batch.total());
  }
}

// all_gather and a2a+p2p: their buffers (the whole row's keys and values;
// the all-to-all's and the ring's) and every variant's exchange bytes per
// step: per layer forward and backward, times the micro-batches, a fully
// recomputed layer's forward exchanges again.
TEST(Estimate, ContextParallelVariantsBuffersAndExchangeBytes) {
  const std::vector<std::string> base = {
      "model.preset=llama-tiny", "model.n_layer=3",      "model.vocab_size=1000",
      "model.n_head=4",          "model.n_kv_head=2",    "train.seq_len=64",
      "train.micro_batch=2",     "train.global_batch=4", "parallel.cp=4"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), base.begin(), base.end());
    return recipe(extra);
  };
  const TrainConfig ag = with({"parallel.cp_comm_type=all_gather"});
  const int64_t D = ag.model.head_dim(), Tl = 16, B = 2;
  const TrainEstimate e = estimate_training(ag, 4, nullptr);
  EXPECT_EQ(e.cp, 4);
  EXPECT_EQ(e.stages[0].cp_buffer_bytes, nn::GatherScratch::bytes_for(B, Tl, 4, 2, D, ag.dtype, 4));
  // Its keys and values: O(T), the ring's O(T / cp).
  EXPECT_GT(e.stages[0].cp_buffer_bytes, 3 * nn::RingScratch::bytes_for(B, Tl, 4, 2, D, ag.dtype));
  // 2 micro-batches of 3 layers; each sends its block to the 3 others
  // forward, again backward, and reduce-scatters the f32 gradients.
  const int64_t kv = B * Tl * 2 * 2 * D, s = int64_t(dtype_size(ag.dtype));
  EXPECT_EQ(e.cp_bytes_per_step, 2 * 3 * (3 * kv * s + 3 * kv * s + 3 * kv * 4));
  EXPECT_EQ(estimate_json(e).at("cp_bytes_per_step_per_rank"), e.cp_bytes_per_step);
  // The ring: the same forward, one more gradient hop back to the owner.
  const TrainEstimate p2p = estimate_training(with({}), 4, nullptr);
  EXPECT_EQ(p2p.cp_bytes_per_step, 2 * 3 * (3 * kv * s + 3 * kv * s + 4 * kv * 4));
  // Full recompute: the forward's exchanges once more per layer.
  const TrainEstimate full = estimate_training(
      with({"parallel.cp_comm_type=all_gather", "train.recompute=full"}), 4, nullptr);
  EXPECT_EQ(full.cp_bytes_per_step, e.cp_bytes_per_step + 2 * 3 * 3 * kv * s);
  const TrainConfig h =
      with({"parallel.cp_comm_type=a2a+p2p", "parallel.hierarchical_context_parallel_sizes=2,2"});
  const TrainEstimate he = estimate_training(h, 4, nullptr);
  EXPECT_EQ(he.stages[0].cp_buffer_bytes, nn::HeadScratch::bytes_for(B, Tl, 4, 2, D, h.dtype) +
                                              nn::RingScratch::bytes_for(B, Tl, 4, 2, D, h.dtype));
  // The all-to-all over pairs (half of qkv and out leave forward, twice
  // that backward) and a ring of 2 on the blocks of 2 Tl tokens, 1/2 the heads.
  const int64_t q = B * Tl * 4 * D, w = q + kv;
  const nn::CpExchangeBytes x =
      nn::cp_exchange_bytes(nn::CpComm::A2AP2P, 4, 2, B, Tl, 4, 2, D, h.dtype);
  EXPECT_EQ(x.forward, (w + q) * s / 2 + kv * s);
  EXPECT_EQ(x.backward, (2 * w + 2 * q) * s / 2 + kv * s + 2 * kv * 4);
  EXPECT_EQ(he.cp_bytes_per_step, 2 * 3 * (x.forward + x.backward));
  EXPECT_EQ(estimate_training(
                recipe({"model.preset=llama-tiny", "model.n_layer=3", "model.vocab_size=1000",
                        "train.seq_len=64", "train.micro_batch=2", "train.global_batch=4"}),
                1, nullptr)
                .cp_bytes_per_step,
            0);
}

// Expert parallel: the MoE products sized for ep N k received rows, and the
// exchange's buffers; the expert all-to-all bytes of a step.
TEST(Estimate, ActivationsUnderExpertParallelismEqualTheWorkspace) {
  for (int64_t ep : {2, 4})
    for (const char* policy : {"none", "selective", "full"}) {
      TrainConfig cfg = recipe(kShapes.back());
      const auto plan = recompute_plan(policy, 0, cfg.model.n_layer);
      const Activations planned(cfg.model, cfg.dtype, 2, 64, true, kHost, plan, {}, {}, ep);
      EXPECT_EQ(activation_bytes(cfg.model, cfg.dtype, 2, 64, plan, 1, false, {}, true, ep).total(),
                planned.bytes())
          << "ep=" << ep << " " << policy;
    }
  std::vector<std::string> o = kShapes.back();
  for (const char* k : {"parallel.ep=2", "train.micro_batch=2", "train.seq_len=64",
                        "train.global_batch=8", "train.dtype=f32"})
    o.push_back(k);
  const TrainConfig cfg = recipe(o);
  const TrainEstimate e = estimate_training(cfg, 2, nullptr);
  EXPECT_EQ(e.ep, 2);
  EXPECT_GT(e.expert_params, 0);
  EXPECT_EQ(e.expert_params_computed, e.expert_params / 2);
  // Each rank holds its half of the experts: the same world without
  // parallel.ep holds all of them, 4 bytes more each of f32 master,
  // gradient and both moments.
  std::vector<std::string> dp_only = o;
  std::erase(dp_only, std::string("parallel.ep=2"));
  const TrainEstimate d = estimate_training(recipe(dp_only), 2, nullptr);
  const int64_t other = e.expert_params / 2;
  EXPECT_EQ(e.peak().params, d.peak().params - other);
  EXPECT_EQ(e.peak().weight_bytes, d.peak().weight_bytes - 4 * other);
  EXPECT_EQ(e.peak().grad_bytes, d.peak().grad_bytes - 4 * other);
  EXPECT_EQ(e.peak().optimizer_bytes, d.peak().optimizer_bytes - 8 * other);
  // 2 micro-batches per rank, 3 layers, 4 exchanges of 128 tokens x top-2
  // rows of d_model f32 values, half of them to the other rank.
  const ModelConfig& c = cfg.model;
  EXPECT_EQ(e.a2a_bytes_per_step,
            2 * 4 * c.n_layer * (128 * c.num_experts_per_tok / 2) * c.d_model * 4);
  EXPECT_EQ(estimate_training(recipe(kShapes.back()), 1, nullptr).a2a_bytes_per_step, 0);
  // ZeRO-1 under EP2 x DP2 (4 ranks): the experts' moments over the 2
  // expert-dp ranks holding them, the rest over all 4.
  std::vector<std::string> z = o;
  z.push_back("parallel.shard=optimizer");
  const TrainEstimate s = estimate_training(recipe(z), 4, nullptr);
  const int64_t mine = e.expert_params / 2, rest = s.peak().params - mine;
  EXPECT_NEAR(double(s.peak().optimizer_bytes), 8.0 * (double(rest) / 4 + double(mine) / 2), 8.0);
  // FSDP under EP2 x DP2: the weights (f32 masters) likewise, the experts'
  // over their 2 expert-dp ranks.
  std::vector<std::string> f = o;
  f.push_back("parallel.shard=full");
  const TrainEstimate fs = estimate_training(recipe(f), 4, nullptr);
  EXPECT_NEAR(double(fs.peak().weight_bytes), 4.0 * (double(rest) / 4 + double(mine) / 2), 8.0);
  // Pipelined (2 stages of 2 and 1 layers): a rank exchanges its own stage's
  // layers' rows, the busier stage's 2 here.
  std::vector<std::string> pp = o;
  for (const char* k : {"parallel.pp=2", "parallel.pp_layout=2,1"}) pp.push_back(k);
  EXPECT_EQ(estimate_training(recipe(pp), 4, nullptr).a2a_bytes_per_step,
            2 * 4 * 2 * (128 * c.num_experts_per_tok / 2) * c.d_model * 4);
}

// ZeRO-2 (and FSDP without a pipeline) hold this rank's blocks of the
// gradients, the largest backward stage and a bucket on its way; ZeRO-1 and
// FSDP under a pipeline the whole arena.
TEST(Estimate, ShardedGradientsHoldTheirBlocks) {
  auto peak = [](std::vector<std::string> o) {
    for (const char* k : {"model.preset=gpt-tiny", "train.dtype=f32", "parallel.bucket_mb=0.05",
                          "train.micro_batch=1"})
      o.push_back(k);
    return estimate_training(recipe(o), 4, nullptr).peak();
  };
  const RankEstimate zero1 = peak({"parallel.shard=optimizer"});
  const RankEstimate zero2 = peak({"parallel.shard=grads"});
  const RankEstimate fsdp = peak({"parallel.shard=full"});
  EXPECT_EQ(zero1.grad_bytes, zero1.grad_arena_bytes);
  EXPECT_EQ(zero2.grad_arena_bytes, zero1.grad_arena_bytes);
  const TrainConfig c = recipe({"model.preset=gpt-tiny"});
  const ParamLayout layout = Transformer::layout_for(c.model);
  const int64_t n = layout.trainable_end(), stage = plan_grad_staging(c.model, layout).elems;
  EXPECT_EQ(zero1.grad_arena_bytes, 4 * n);
  EXPECT_NEAR(double(zero2.grad_bytes),
              4.0 * (double(n) / 4 + std::min(0.75 * double(n), double(stage + 13107))), 4.0);
  EXPECT_LT(zero2.grad_bytes, zero1.grad_bytes);
  EXPECT_EQ(fsdp.grad_bytes, zero2.grad_bytes);
  // The optimizer state as under ZeRO-1.
  EXPECT_EQ(zero2.optimizer_bytes, zero1.optimizer_bytes);
  const RankEstimate piped = peak({"parallel.shard=full", "parallel.pp=2"});
  EXPECT_EQ(piped.grad_bytes, piped.grad_arena_bytes);
}

TEST(Estimate, RecomputeShrinksActivationsInOrder) {
  auto saved = [](const char* policy) {
    TrainConfig cfg = recipe({"model.preset=gpt-tiny", std::string("train.recompute=") + policy});
    return estimate_training(cfg, 1, nullptr).peak().per_micro_batch.saved;
  };
  EXPECT_GT(saved("none"), saved("selective"));
  EXPECT_GT(saved("selective"), saved("full"));
}

// The persistent state exactly, and the whole step's tensors within 10% of
// the peak measured over real steps (what the estimate leaves out: the
// batch's token ids, the RoPE table, a gradient-norm scalar or two).
TEST(Estimate, MatchesTheMeasuredPeaks) {
  const fs::path base = fs::path(NK_BINARY_DIR) / "estimate_runs";
  for (size_t i = 0; i < kShapes.size(); ++i)
    for (int64_t T : {64, 128})
      for (const char* policy : {"none", "selective", "full"}) {
        const std::string out = (base / fmt::format("{}_{}_{}", i, T, policy)).string();
        fs::remove_all(out);
        std::vector<std::string> o = kShapes[i];
        for (std::string kv :
             {"train.dtype=bf16", "train.micro_batch=4", "train.global_batch=4", "train.steps=2"})
          o.push_back(kv);
        o.push_back("train.seq_len=" + std::to_string(T));
        o.push_back(std::string("train.recompute=") + policy);
        o.push_back("train.out_dir=" + out);
        TrainConfig cfg = recipe(o);
        const TrainEstimate e = estimate_training(cfg, 1, nullptr);
        const RankEstimate& r = e.peak();
        const std::string what = fmt::format("shape {} T={} {}", i, T, policy);
        Trainer t(cfg);
        Transformer& m = t.model();
        EXPECT_EQ(r.weight_bytes, int64_t(m.weight_bytes())) << what;
        EXPECT_EQ(r.grad_bytes, int64_t(m.grads().nbytes())) << what;
        EXPECT_EQ(r.optimizer_bytes, t.optimizer().state_bytes()) << what;
        EXPECT_EQ(e.params, m.layout().count()) << what;
        Allocator::get(kHost).reset_peak();  // the peak of this run's steps, not an earlier run's
        t.run();
        size_t peak = 0;
        for (const StepStats& s : t.history()) peak = std::max(peak, s.peak_bytes);
        EXPECT_NEAR(double(r.total()), double(peak), 0.10 * double(peak)) << what;
        fs::remove_all(out);
      }
}

// QLoRA on Mixture-of-Experts models: the NF4 base (each expert quantised
// on its own, the routers dense) as the trainer holds it.
TEST(Estimate, QloraMoeBytesAreExact) {
  for (const char* preset : {"mixtral-tiny", "qwen2-moe-tiny"}) {
    const std::string out = (fs::path(NK_BINARY_DIR) / "estimate_qlora_moe").string();
    fs::remove_all(out);
    TrainConfig cfg =
        recipe({std::string("model.preset=") + preset, "train.dtype=bf16", "peft.method=qlora",
                "peft.target_modules=all-linear", "train.out_dir=" + out});
    const RankEstimate r = estimate_training(cfg, 1, nullptr).peak();
    Trainer t(cfg);
    EXPECT_EQ(t.model().frozen_weights(), FrozenWeights::Nf4) << preset;
    EXPECT_EQ(r.weight_bytes, int64_t(t.model().weight_bytes())) << preset;
    EXPECT_EQ(r.optimizer_bytes, t.optimizer().state_bytes()) << preset;
    EXPECT_EQ(r.grad_bytes, int64_t(t.model().grad_bytes())) << preset;
    fs::remove_all(out);
    // Under expert parallelism each rank holds E / ep experts' NF4 runs
    // (Transformer::split_experts) and their adapters' rows: the one-process
    // model's bytes less the other ranks' experts' runs, as the storage
    // sizes them, and adapter rows (an f32 master and a bf16 copy each).
    const int64_t E = cfg.model.num_experts;
    int64_t one_expert = 0;  // every split tensor's part of one expert
    for (const ParamInfo& p : t.model().layout().params())
      if (p.quantized && p.split == Split::Experts)
        one_expert += int64_t(ops::Nf4Weight::empty(nf4_runs(cfg.model, p)[0]).nbytes());
      else if (p.trainable && p.split == Split::Experts)
        one_expert += (4 + 2) * p.numel() / E;
    ASSERT_GT(one_expert, 0) << preset;
    for (int64_t ep : {2, 4}) {
      TrainConfig c =
          recipe({std::string("model.preset=") + preset, "train.dtype=bf16", "peft.method=qlora",
                  "peft.target_modules=all-linear", "parallel.ep=" + std::to_string(ep),
                  "train.micro_batch=2", "train.global_batch=8"});
      EXPECT_EQ(estimate_training(c, 4, nullptr).peak().weight_bytes,
                int64_t(t.model().weight_bytes()) - (E - E / ep) * one_expert)
          << preset << " ep " << ep;
    }
  }
}

// optim.*: the weights, gradients and the optimizer's state as the trainer
// allocates them, for every choice of moments, master and gradients.
TEST(Estimate, OptimizerPrecisionBytesAreExact) {
  for (std::vector<std::string> optim :
       {std::vector<std::string>{"optim.moment_dtype=bf16"},
        {"optim.moment_dtype=f16"},
        {"optim.master_dtype=bf16", "optim.moment_dtype=bf16"},
        {"optim.master_dtype=bf16", "optim.master_compensation=false"},
        {"optim.grad_dtype=bf16", "optim.master_dtype=bf16", "optim.moment_dtype=bf16"}}) {
    const std::string out = (fs::path(NK_BINARY_DIR) / "estimate_optim").string();
    fs::remove_all(out);
    std::vector<std::string> o = {"model.preset=llama-tiny", "train.dtype=bf16",
                                  "train.out_dir=" + out};
    o.insert(o.end(), optim.begin(), optim.end());
    TrainConfig cfg = recipe(o);
    const RankEstimate r = estimate_training(cfg, 1, nullptr).peak();
    Trainer t(cfg);
    EXPECT_EQ(r.weight_bytes, int64_t(t.model().weight_bytes())) << optim[0];
    EXPECT_EQ(r.optimizer_bytes, t.optimizer().state_bytes()) << optim[0];
    EXPECT_EQ(r.grad_bytes, int64_t(t.model().grad_bytes())) << optim[0];
  }
}

TEST(Estimate, ShardingDividesTheOptimizerStateAndPipelineStagesHoldTheirLayers) {
  TrainConfig one = recipe(
      {"model.preset=gpt-tiny", "train.micro_batch=2", "train.global_batch=8", "train.dtype=f32"});
  const TrainEstimate e1 = estimate_training(one, 1, nullptr);
  TrainConfig zero = recipe({"model.preset=gpt-tiny", "train.micro_batch=2", "train.global_batch=8",
                             "train.dtype=f32", "parallel.shard=optimizer"});
  const TrainEstimate e4 = estimate_training(zero, 4, nullptr);
  EXPECT_EQ(e4.dp, 4);
  EXPECT_EQ(e4.peak().optimizer_bytes, e1.peak().optimizer_bytes / 4);
  EXPECT_EQ(e4.peak().weight_bytes, e1.peak().weight_bytes);
  // f32 compute: the masters are the weights the kernels read, whole on every
  // rank. bf16 compute: ZeRO-1 keeps this rank's blocks of the f32 masters
  // (the DDP tests bound what stays resident); with a bf16 master their
  // remainders are optimizer state, sharded too.
  const std::vector<std::string> bf16 = {"model.preset=gpt-tiny", "train.micro_batch=2",
                                         "train.global_batch=8", "train.dtype=bf16",
                                         "parallel.shard=optimizer"};
  const int64_t n = Transformer::layout_for(one.model).count();
  EXPECT_EQ(estimate_training(recipe(bf16), 4, nullptr).peak().weight_bytes, 4 * n / 4 + 2 * n);
  std::vector<std::string> master = bf16;
  master.push_back("optim.master_dtype=bf16");
  const RankEstimate m4 = estimate_training(recipe(master), 4, nullptr).peak();
  EXPECT_EQ(m4.weight_bytes, 2 * n);
  EXPECT_EQ(m4.optimizer_bytes, (4 + 4 + 2) * n / 4);

  TrainConfig pp = recipe({"model.preset=gpt-tiny", "model.n_layer=4", "train.micro_batch=2",
                           "train.global_batch=8", "parallel.pp=2"});
  const TrainEstimate ep = estimate_training(pp, 2, nullptr);
  ASSERT_EQ(ep.stages.size(), 2u);
  // 1F1B: the first stage holds two micro-batches in flight, the last one.
  EXPECT_EQ(ep.stages[0].in_flight, 2);
  EXPECT_EQ(ep.stages[1].in_flight, 1);
  EXPECT_EQ(ep.stages[0].params + ep.stages[1].params,
            Transformer::layout_for(pp.model).count() +
                (pp.model.tied_embeddings ? pp.model.vocab_size * pp.model.d_model : 0));
}

// Under tensor parallelism each rank holds its share of the padded
// vocabulary (ModelConfig::padded_vocab_size): 257 ids at tp 2 are 512 rows,
// 256 a rank, against 258 (129 a rank) with model.make_vocab_size_divisible_by=1.
TEST(Estimate, TensorParallelCountsTheVocabularyPadding) {
  auto at = [](const std::string& divisible_by) {
    return recipe({"model.preset=gpt-tiny", "model.vocab_size=257", "train.micro_batch=2",
                   "train.global_batch=2", "parallel.tp=2",
                   "model.make_vocab_size_divisible_by=" + divisible_by});
  };
  const TrainConfig megatron = at("128"), least = at("1");
  const TrainEstimate e = estimate_training(megatron, 2, nullptr),
                      e1 = estimate_training(least, 2, nullptr);
  const ParamLayout shard = Transformer::layout_for(megatron.model).shard(2);
  EXPECT_EQ(shard.find("wte").shape[0], 256);
  EXPECT_EQ(e.peak().params, shard.count());
  const int64_t C = megatron.model.d_model, tied = megatron.model.tied_embeddings ? 1 : 2;
  EXPECT_EQ(e.peak().params - e1.peak().params, tied * (256 - 129) * C);
  EXPECT_EQ(e.params, e1.params);  // the whole model: 257 rows either way
}

TEST(EstimateCli, PrintsJsonAndWhatFits) {
  const std::string cfg = "model.preset=gpt-tiny data.tokenizer=bytes data.path=" + corpus_path();
  const auto r = run_nekton("estimate --no-time --json --budget 0.1 " + cfg, false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_GT(j["peak_total_bytes"].get<double>(), 0);
  EXPECT_GT(j["flops_per_step"].get<double>(), 0);
  // The largest micro-batch that fits does, and one more does not.
  const auto& fits = j["fits"]["largest_micro_batch"];
  for (const char* p : {"none", "selective", "full"}) {
    const int64_t mb = fits[p].get<int64_t>();
    ASSERT_GT(mb, 0) << p;
    for (int64_t m : {mb, mb + 1}) {
      const auto e = run_nekton(
          fmt::format("estimate --no-time --json {} train.recompute={} train.micro_batch={} "
                      "train.global_batch={}",
                      cfg, p, m, m),
          false);
      ASSERT_EQ(e.code, 0) << e.out;
      const double total = nlohmann::json::parse(e.out.substr(e.out.find('{')))["peak_total_bytes"];
      EXPECT_EQ(total <= 0.1 * 1073741824.0, m == mb) << p << " micro-batch " << m;
    }
  }
  EXPECT_GE(fits["full"].get<int64_t>(), fits["none"].get<int64_t>());
}

// An align recipe: what each reference choice costs (a frozen copy: its
// weights in the compute dtype and a forward-only workspace, equal to what
// the Activations of the copy plan), the recipe's own choice marked; a
// reward model is estimated with its score head and has no reference.
TEST(EstimateCli, AlignRecipesCostTheirReference) {
  const std::string dpo = fmt::format("{}/configs/align_dpo.yaml", NK_SOURCE_DIR);
  const auto r = run_nekton(
      "estimate --no-time --json --config " + dpo + " model.preset=llama-tiny train.seq_len=64",
      false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  const nlohmann::json& a = j["align"];
  EXPECT_EQ(a["reference"], "precompute");
  TrainConfig cfg = recipe({"model.preset=llama-tiny", "train.dtype=bf16"});
  ASSERT_EQ(j["params"].get<int64_t>(), Transformer::layout_for(cfg.model).count());
  EXPECT_EQ(a["copy"]["weight_bytes"].get<int64_t>(), j["params"].get<int64_t>() * 2);
  const Activations fwd(cfg.model, DType::BF16, 2, 64, false);
  EXPECT_EQ(a["copy"]["activation_bytes"].get<int64_t>(), fwd.bytes());
  const auto t = run_nekton("estimate --no-time --config " + dpo +
                                " model.preset=llama-tiny train.seq_len=64 peft.method=lora",
                            false);
  ASSERT_EQ(t.code, 0) << t.out;
  EXPECT_TRUE(test::contains(t.out,
                             "with its adapters off (peft.method): a forward per "
                             "micro-batch  <- align.reference"))
      << t.out;
  const auto rm = run_nekton("estimate --no-time --json --config " + dpo +
                                 " model.preset=llama-tiny train.seq_len=64 align.method=rm",
                             false);
  ASSERT_EQ(rm.code, 0) << rm.out;
  const nlohmann::json k = nlohmann::json::parse(rm.out.substr(rm.out.find('{')));
  EXPECT_FALSE(k["align"]["needs_reference"].get<bool>());
  EXPECT_LT(k["params"].get<int64_t>(), j["params"].get<int64_t>());  // no LM head
}

// PPO with a critic of its own (align.value_model): its weights (f32 and the
// bf16 copy), gradients, AdamW moments and training activations, beside the
// policy's, as align/critic.h holds them; a missing folder named by key.
TEST(EstimateCli, PpoCriticIsCountedBesideThePolicy) {
  test::TempDir d("nk_estimate_critic");
  ModelConfig cc = recipe({"model.preset=llama-tiny"}).model;
  cc.num_labels = 1;
  {
    Transformer rm(cc, DType::F32, 1);
    save_model(d / "rm", rm);
  }
  const std::string args =
      "estimate --no-time model.preset=llama-tiny train.dtype=bf16 train.micro_batch=2 "
      "train.seq_len=64 align.method=ppo align.num_generations=2 align.value_model=" +
      (d / "rm");
  const auto r = run_nekton(args + " --json", false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json c = nlohmann::json::parse(r.out.substr(r.out.find('{')))["align"]["critic"];
  const int64_t n = Transformer::layout_for(cc).count();
  EXPECT_EQ(c["params"].get<int64_t>(), n);
  // What align/critic.h holds: the model in bf16 compute with f32 masters,
  // f32 gradients, AdamW's f32 state, its training activations.
  Transformer held(cc, DType::BF16, 1);
  EXPECT_EQ(c["weight_bytes"].get<int64_t>(),
            int64_t(held.params().nbytes() + held.compute_params().nbytes()));
  EXPECT_EQ(c["gradient_bytes"].get<int64_t>(), int64_t(held.grad_bytes()));
  EXPECT_EQ(c["optimizer_bytes"].get<int64_t>(), AdamW(held, AdamWConfig{}).state_bytes());
  const Activations train(held, 2, 64, true);
  EXPECT_EQ(c["activation_bytes"].get<int64_t>(), train.bytes());
  const auto t = run_nekton(args, false);
  EXPECT_TRUE(test::contains(t.out, "align.value_model: PPO's critic")) << t.out;
  const auto bad = run_nekton(args + "_missing");
  EXPECT_NE(bad.code, 0);
  EXPECT_TRUE(test::contains(bad.out, "align.value_model: '")) << bad.out;
}

// The weights' line says how the base is held: adapters over a bf16 base or
// QLoRA's NF4 one, the trained parameters with their f32 masters.
TEST(EstimateCli, NamesHowAFrozenBaseIsHeld) {
  for (const auto& [method, want] : {std::pair{"lora", "weights (bf16 base, trained f32 masters)"},
                                     std::pair{"qlora", "weights (NF4 base, trained f32 masters)"},
                                     std::pair{"none", "weights (f32 masters, bf16 copy)"}}) {
    const auto r = run_nekton(std::string("estimate --no-time model.preset=mixtral-tiny "
                                          "train.dtype=bf16 peft.method=") +
                                  method,
                              false);
    ASSERT_EQ(r.code, 0) << r.out;
    EXPECT_TRUE(test::contains(r.out, want)) << method << ": " << r.out;
  }
}

// --measure trains two steps and puts its figures beside the estimate; with
// --json stdout is the JSON alone (the run's log goes to stderr).
TEST(EstimateCli, MeasureGivesPureJsonWithTheMeasuredPeak) {
  const auto r = run_nekton(
      "estimate --no-time --measure --json model.preset=gpt-tiny data.tokenizer=bytes "
      "train.seq_len=64 train.micro_batch=2 train.global_batch=2 data.path=" +
          corpus_path(),
      false);
  ASSERT_EQ(r.code, 0) << r.out;
  const nlohmann::json j = nlohmann::json::parse(r.out);
  const double est = j["peak_total_bytes"], got = j["measured"]["peak_tensor_bytes"];
  EXPECT_NEAR(est, got, 0.10 * got);
  EXPECT_EQ(j["measured"]["persistent_bytes"].get<double>(),
            double(j["stages"][0]["weight_bytes"].get<int64_t>() +
                   j["stages"][0]["grad_bytes"].get<int64_t>() +
                   j["stages"][0]["optimizer_bytes"].get<int64_t>()));
  EXPECT_GT(j["measured"]["step_seconds"].get<double>(), 0);
  const auto no_data = run_nekton("estimate --no-time --measure model.preset=gpt-tiny");
  EXPECT_NE(no_data.code, 0);
  EXPECT_TRUE(test::contains(no_data.out, "--measure trains two steps: give it data"))
      << no_data.out;
}

TEST(EstimateCli, BadInputIsAnErrorNamingIt) {
  auto r = run_nekton("estimate --no-time model.n_layr=3");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("model.n_layr"), std::string::npos) << r.out;
  r = run_nekton("estimate --no-time --budget -1");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("--budget"), std::string::npos) << r.out;
  r = run_nekton("estimate --no-time --nproc 3 parallel.tp=2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("parallel"), std::string::npos) << r.out;
  r = run_nekton("estimate --rates /nonexistent/rates.json");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.out.find("/nonexistent/rates.json"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace nk
