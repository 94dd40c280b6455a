#include "train/train_parallel.h"

#include <gtest/gtest.h>

#include "core/error.h"
#include "parallel/pipeline_parallel.h"
#include "test_util.h"

namespace nk {
namespace {

TrainConfig config(const std::vector<std::string>& extra) {
  std::vector<std::string> o = {"data.path=unused.txt", "train.micro_batch=4",
                                "train.global_batch=8"};
  o.insert(o.end(), extra.begin(), extra.end());
  ConfigSchema s = train_schema();
  return train_config_from(Config::load(s, "", o));
}

std::string error_of(const TrainConfig& cfg, int world) {
  try {
    train_mesh(cfg, world, 0);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(TrainParallel, KeysAreInTheTrainingSchema) {
  TrainConfig c = config(
      {"parallel.bucket_mb=0.5", "parallel.overlap_grad_reduce=false", "parallel.timeout_s=7"});
  EXPECT_EQ(c.ddp.bucket_mb, 0.5);
  EXPECT_FALSE(c.ddp.overlap_grad_reduce);
  EXPECT_EQ(c.parallel.timeout_s, 7);
  EXPECT_THROW(config({"parallel.bucket_mb=0"}), Error);
}

TEST(TrainParallel, GlobalBatchMustDivideOverTheDataParallelRanks) {
  TrainConfig c = config({});
  EXPECT_EQ(error_of(c, 1), "");
  EXPECT_EQ(error_of(c, 2), "");   // 8 = 2 ranks × 4
  std::string e = error_of(c, 4);  // 8 is not a multiple of 4 × 4
  EXPECT_NE(e.find("train.global_batch"), std::string::npos) << e;
  EXPECT_NE(e.find("train.micro_batch"), std::string::npos) << e;
  EXPECT_NE(e.find("4 × 4 = 16"), std::string::npos) << e;
  // 12 = 3 ranks × 4 works; 12 over 2 ranks is 1.5 micro-batches each.
  EXPECT_EQ(error_of(config({"train.global_batch=12"}), 3), "");
  EXPECT_NE(error_of(config({"train.global_batch=12"}), 2).find("train.global_batch"),
            std::string::npos);
}

TEST(TrainParallel, WorldSizeMustFitTheLayout) {
  std::string e = error_of(config({"parallel.dp=2"}), 3);
  EXPECT_NE(e.find("parallel."), std::string::npos) << e;
  e = error_of(config({"parallel.pp=2"}), 3);
  EXPECT_NE(e.find("parallel.pp"), std::string::npos) << e;
  // A layout the mesh accepts but nekton train cannot run yet.
  e = error_of(config({"parallel.tp=2", "peft.method=adapter", "peft.target_modules=all-linear"}),
               2);
  EXPECT_NE(e.find("peft.target_modules: a bottleneck adapter on"), std::string::npos) << e;
}

// Context parallelism cuts each row into 2·cp chunks and trains a
// decoder's language-model loss with data, tensor and pipeline parallelism,
// dense or Mixture-of-Experts (with expert parallelism, dropless); the rest
// is refused before any work, naming the key.
TEST(TrainParallel, ContextParallelRefusesWhatItCannotRun) {
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"model.preset=llama-tiny", "model.vocab_size=264",
                                 "train.seq_len=32", "train.global_batch=8"});
    return config(extra);
  };
  EXPECT_EQ(error_of(with({"parallel.cp=2"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.cp=4"}), 4), "");
  EXPECT_EQ(error_of(with({"parallel.cp=2"}), 4), "");                              // cp 2 × dp 2
  EXPECT_EQ(error_of(with({"parallel.cp=2", "parallel.tp=2"}), 4), "");             // cp 2 × tp 2
  EXPECT_EQ(error_of(with({"parallel.cp=2", "parallel.shard=optimizer"}), 2), "");  // ZeRO-1
  EXPECT_EQ(error_of(with({"parallel.cp=2", "parallel.shard=full"}), 4), "");       // FSDP
  EXPECT_EQ(error_of(with({"parallel.cp=2", "data.path=", "data.sft_path=chats.jsonl"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.cp=2", "peft.method=lora"}), 2), "");
  // p-tuning: each rank places the virtual positions among its chunks.
  EXPECT_EQ(error_of(with({"parallel.cp=2", "peft.method=p_tuning", "data.pack=false",
                           "data.path=", "data.sft_path=chats.jsonl"}),
                     2),
            "");
  // cp 2 × pp 2, 1F1B and interleaved
  EXPECT_EQ(error_of(with({"parallel.cp=2", "parallel.pp=2", "model.n_layer=4"}), 4), "");
  EXPECT_EQ(
      error_of(with({"parallel.cp=2", "parallel.pp=2", "parallel.vp=2", "model.n_layer=4"}), 4),
      "");
  // Mixture of Experts: CP2, CP2 × EP2 (ep carved out of dp × cp), the
  // sequence-wise balancing loss, CP2 × PP2
  const std::vector<std::string> moe = {"parallel.cp=2", "model.preset=mixtral-tiny"};
  auto moe_with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), moe.begin(), moe.end());
    return with(extra);
  };
  EXPECT_EQ(error_of(moe_with({}), 2), "");
  EXPECT_EQ(error_of(moe_with({"parallel.ep=2"}), 2), "");
  EXPECT_EQ(error_of(moe_with({"parallel.ep=2"}), 4), "");
  EXPECT_EQ(error_of(moe_with({"model.moe_aux_loss_type=seq"}), 2), "");
  EXPECT_EQ(error_of(moe_with({"parallel.pp=2", "model.n_layer=4"}), 4), "");
  // Sequence parallelism splits each rank's local tokens over its tp group.
  EXPECT_EQ(error_of(with({"parallel.cp=2", "parallel.tp=2", "parallel.sp=true"}), 4), "");
  EXPECT_EQ(error_of(with({"parallel.cp=2", "parallel.cp_comm_type=a2a"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.cp=2", "parallel.cp_comm_type=a2a", "parallel.tp=2",
                           "parallel.sp=true", "model.n_head=8", "model.n_kv_head=4"}),
                     4),
            "");
  std::string e = error_of(with({"parallel.cp=2", "train.seq_len=30"}), 2);
  EXPECT_NE(e.find("parallel.cp = 2: train.seq_len = 30 is not a multiple of 2 × parallel.cp = 4"),
            std::string::npos)
      << e;
  const std::pair<std::vector<std::string>, const char*> refused[] = {
      {{"peft.method=lora", "peft.lora_dropout=0.1"}, "peft.lora_dropout"},
      {{"model.preset=mixtral-tiny", "model.moe_capacity_factor=1.25"},
       "model.moe_capacity_factor"}};
  for (const auto& [extra, key] : refused) {
    std::vector<std::string> o = {"parallel.cp=2"};
    o.insert(o.end(), extra.begin(), extra.end());
    e = error_of(with(o), extra[0].starts_with("parallel.tp") ? 4 : 2);
    EXPECT_NE(e.find(key), std::string::npos) << extra[0] << ": " << e;
    EXPECT_NE(e.find("parallel.cp"), std::string::npos) << extra[0] << ": " << e;
  }
}

// The all-to-all variant gives each cp rank whole query and key/value heads
// (of its tp rank's share): both counts must divide by tp × cp.
TEST(TrainParallel, ContextParallelAllToAllNeedsDivisibleHeads) {
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"model.preset=llama-tiny", "model.vocab_size=264",
                                 "train.seq_len=32", "train.global_batch=8"});
    if (extra.back() != "parallel.cp_comm_type=p2p") extra.push_back("parallel.cp_comm_type=a2a");
    return config(extra);
  };
  // 4 query heads, 2 key/value heads.
  EXPECT_EQ(error_of(with({"parallel.cp=2", "model.n_head=4", "model.n_kv_head=2"}), 2), "");
  std::string e = error_of(with({"parallel.cp=4", "model.n_head=4", "model.n_kv_head=2"}), 4);
  EXPECT_NE(
      e.find("parallel.cp = 4, parallel.cp_comm_type = a2a: model.n_head = 4 and "
             "model.n_kv_head = 2 must both be multiples of parallel.tp × parallel.cp = 1 × 4"),
      std::string::npos)
      << e;
  e = error_of(with({"parallel.cp=2", "parallel.tp=2", "model.n_head=4", "model.n_kv_head=2"}), 4);
  EXPECT_NE(e.find("parallel.tp × parallel.cp = 2 × 2"), std::string::npos) << e;
  e = error_of(with({"parallel.cp=2", "model.n_head=6", "model.n_kv_head=3", "model.d_model=48"}),
               2);
  EXPECT_NE(e.find("model.n_kv_head = 3"), std::string::npos) << e;
  // The ring has no such need.
  EXPECT_EQ(error_of(with({"parallel.cp=4", "model.n_head=4", "model.n_kv_head=2",
                           "parallel.cp_comm_type=p2p"}),
                     4),
            "");
}

// all_gather needs nothing of the heads; a2a+p2p whole heads per rank of
// each a2a group (of its tp rank's share): both counts divide by tp × a.
TEST(TrainParallel, ContextParallelAllGatherAndHierarchicalHeads) {
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"model.preset=llama-tiny", "model.vocab_size=264",
                                 "train.seq_len=32", "train.global_batch=8"});
    return config(extra);
  };
  const std::string hs = "parallel.hierarchical_context_parallel_sizes";
  EXPECT_EQ(error_of(with({"parallel.cp=4", "parallel.cp_comm_type=all_gather", "model.n_head=6",
                           "model.n_kv_head=3", "model.d_model=48"}),
                     4),
            "");
  EXPECT_EQ(error_of(with({"parallel.cp=2", "parallel.tp=2", "parallel.cp_comm_type=all_gather",
                           "model.n_head=4", "model.n_kv_head=2"}),
                     4),
            "");
  EXPECT_EQ(error_of(with({"parallel.cp=4", "parallel.cp_comm_type=a2a+p2p", hs + "=2,2",
                           "model.n_head=4", "model.n_kv_head=2"}),
                     4),
            "");
  std::string e = error_of(with({"parallel.cp=4", "parallel.cp_comm_type=a2a+p2p", hs + "=4,1",
                                 "model.n_head=4", "model.n_kv_head=2"}),
                           4);
  EXPECT_NE(e.find("parallel.cp = 4, parallel.cp_comm_type = a2a+p2p, " + hs +
                   " = 4,1: model.n_head = 4 and model.n_kv_head = 2 must both be multiples of "
                   "parallel.tp × the a2a size = 1 × 4"),
            std::string::npos)
      << e;
  e = error_of(with({"parallel.cp=2", "parallel.tp=2", "parallel.cp_comm_type=a2a+p2p", hs + "=2,1",
                     "model.n_head=4", "model.n_kv_head=2"}),
               4);
  EXPECT_NE(e.find("parallel.tp × the a2a size = 2 × 2"), std::string::npos) << e;
}

// Tensor parallelism splits heads, key/value heads, MLP units and the
// vocabulary: a size that does not divide heads or MLP units is refused
// before any work, naming the key and both numbers; the vocabulary is padded.
TEST(TrainParallel, TensorParallelSizeMustDivideTheModel) {
  const std::vector<std::string> tiny = {"model.preset=llama-tiny", "model.vocab_size=264",
                                         "train.seq_len=32"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), tiny.begin(), tiny.end());
    return config(extra);
  };
  EXPECT_EQ(error_of(with({"parallel.tp=2"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.tp=2", "parallel.sp=true"}), 4), "");  // dp 2 × tp 2
  std::string e = error_of(with({"parallel.tp=4"}), 4);  // llama-tiny: 2 kv heads
  EXPECT_NE(e.find("model.n_kv_head = 2 is not divisible by parallel.tp = 4"), std::string::npos)
      << e;
  e = error_of(with({"parallel.tp=4", "model.n_head=6", "model.d_model=96"}), 4);
  EXPECT_NE(e.find("model.n_head = 6 is not divisible by parallel.tp = 4"), std::string::npos) << e;
  e = error_of(with({"parallel.tp=2", "model.d_ff=175"}), 2);
  EXPECT_NE(e.find("model.d_ff = 175"), std::string::npos) << e;
  // The vocabulary is padded instead (Megatron's make_vocab_size_divisible_by).
  EXPECT_EQ(error_of(with({"parallel.tp=2", "model.vocab_size=257"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.tp=2", "model.vocab_size=257",
                           "model.make_vocab_size_divisible_by=1"}),
                     2),
            "");
  e = test::error_of([&] { with({"parallel.tp=2", "model.make_vocab_size_divisible_by=0"}); });
  EXPECT_NE(e.find("model.make_vocab_size_divisible_by: must be positive, got 0"),
            std::string::npos)
      << e;
  // Sequence parallelism splits each sequence's tokens over the tp ranks.
  e = error_of(with({"parallel.tp=2", "parallel.sp=true", "train.seq_len=31"}), 2);
  EXPECT_NE(e.find("train.seq_len = 31 is not divisible by parallel.tp = 2"), std::string::npos)
      << e;
  EXPECT_THROW(with({"parallel.sp=true"}), Error);  // needs tp > 1
  // ZeRO-1 and FSDP shard a tensor-parallel model's pieces over its replicas.
  EXPECT_EQ(error_of(with({"parallel.tp=2", "parallel.shard=optimizer"}), 4), "");  // ZeRO-1 × TP
  EXPECT_EQ(error_of(with({"parallel.tp=2", "parallel.shard=full"}), 4), "");       // FSDP × TP
  // Adapters split as their layers (tests/apps/mpi/peft_model_parallel_ranks.sh);
  // what a split model cannot hold yet is named by key.
  EXPECT_EQ(error_of(with({"parallel.tp=2", "peft.method=lora"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.tp=2", "peft.method=ia3"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.tp=2", "peft.method=adapter"}), 2), "");  // NeMo's targets
  EXPECT_EQ(error_of(with({"parallel.pp=2", "model.n_layer=2", "peft.method=qlora"}), 2), "");
  // QLoRA: each rank's share cut from the whole tensor's NF4 blocks, so a
  // share must be whole blocks of 64 (refused before launch otherwise).
  EXPECT_EQ(
      error_of(with({"parallel.tp=2", "peft.method=qlora", "model.d_model=128", "model.d_ff=256"}),
               2),
      "");
  e = error_of(with({"parallel.tp=2", "peft.method=qlora", "model.d_model=64"}), 2);
  EXPECT_NE(e.find("peft.method=qlora under parallel.tp = 2: 'h.0.attn.proj.weight' [64, 64]: "
                   "rank 0 holds 32 of its values from flat index 0, not whole NF4 blocks of 64"),
            std::string::npos)
      << e;
  e = error_of(with({"parallel.tp=2", "peft.method=qlora", "model.d_model=128", "model.d_ff=192"}),
               2);
  EXPECT_NE(e.find("'h.0.mlp.down.weight' [128, 192]: rank 0 holds 96 of its values"),
            std::string::npos)
      << e;
  EXPECT_EQ(error_of(with({"parallel.pp=2", "model.n_layer=2", "peft.method=adapter"}), 2), "");
  // p-tuning under sequence parallelism: each rank places its rows' virtual positions.
  for (std::vector<std::string> o : std::vector<std::vector<std::string>>{
           {"parallel.tp=2"}, {"parallel.pp=2"}, {"parallel.tp=2", "parallel.sp=true"}}) {
    const std::string layout = o.back();
    o.insert(o.end(), {"model.n_layer=2", "peft.method=p_tuning",
                       "data.path=", "data.sft_path=chats.jsonl", "data.pack=false"});
    EXPECT_EQ(error_of(with(o), 2), "") << layout;
  }
  for (const auto& [extra, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"parallel.tp=2", "peft.method=adapter", "peft.target_modules=all-linear"},
            "parallel.tp = 2: peft.target_modules: a bottleneck adapter on"}}) {
    e = error_of(with(extra), 2);
    EXPECT_NE(e.find(want), std::string::npos) << e;
  }
  // Fine-tuning data: tensor parallel and pipelined (tests/apps/mpi/finetune_ranks.sh).
  EXPECT_EQ(error_of(with({"parallel.tp=2", "data.path=", "data.sft_path=chats.jsonl"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.pp=2", "data.path=", "data.sft_path=chats.jsonl"}), 2), "");
}

// Pipeline stages split the layers evenly, or as parallel.pp_layout lists;
// a split that does not fit is refused naming the key and the numbers.
TEST(TrainParallel, PipelineStagesMustSplitTheLayers) {
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), {"model.preset=llama-tiny", "model.n_layer=4", "train.seq_len=32"});
    return config(extra);
  };
  EXPECT_EQ(error_of(with({"parallel.pp=2"}), 2), "");
  EXPECT_EQ(error_of(with({"parallel.pp=2", "parallel.pp_layout=1,3"}), 2), "");
  EXPECT_EQ(
      error_of(with({"parallel.pp=2", "parallel.tp=2", "parallel.sp=true", "model.vocab_size=264"}),
               8),
      "");
  std::string e = error_of(with({"parallel.pp=3"}), 3);
  EXPECT_NE(e.find("model.n_layer = 4 is not divisible by parallel.pp = 3"), std::string::npos)
      << e;
  e = error_of(with({"parallel.pp=2", "parallel.pp_layout=1,2"}), 2);
  EXPECT_NE(e.find("parallel.pp_layout: the stages' layers add up to 3, model.n_layer = 4"),
            std::string::npos)
      << e;
  EXPECT_THROW(with({"parallel.pp=2", "parallel.pp_layout=1,x"}), Error);
  EXPECT_THROW(with({"parallel.pp=2", "parallel.pp_layout=4"}), Error);  // one stage of two
  // ZeRO-1 and FSDP shard each stage's state (FSDP: and weights) over its
  // replicas.
  EXPECT_EQ(error_of(with({"parallel.pp=2", "parallel.shard=optimizer"}), 4), "");
  EXPECT_EQ(error_of(with({"parallel.pp=2", "parallel.tp=2", "parallel.shard=optimizer"}), 8), "");
  EXPECT_EQ(error_of(with({"parallel.pp=2", "parallel.shard=full"}), 4), "");
  EXPECT_EQ(error_of(with({"parallel.pp=2", "parallel.tp=2", "parallel.shard=full"}), 8), "");
  // ZeRO-2 under a pipeline would shard nothing at the peak: refused, naming both keys.
  e = error_of(with({"parallel.pp=2", "parallel.shard=grads"}), 4);
  EXPECT_NE(e.find("parallel.shard=grads with parallel.pp = 2"), std::string::npos) << e;
  EXPECT_EQ(error_of(with({"parallel.tp=2", "parallel.shard=grads"}), 4), "");
  EXPECT_THROW(with({"parallel.shard=zero2"}), Error);  // one of none, optimizer, grads, full
  const ModelConfig m = with({}).model;
  const PipelineStage mid = parallel::pipeline_stage(m, 4, 2, {0, 2, 1, 1});
  EXPECT_EQ(mid.chunks, (std::vector<std::pair<int64_t, int64_t>>{{2, 3}}));
  EXPECT_FALSE(mid.embedding || mid.head);
  EXPECT_TRUE(parallel::pipeline_stage(m, 4, 0, {0, 2, 1, 1}).embedding);
  EXPECT_TRUE(parallel::pipeline_stage(m, 4, 3, {0, 2, 1, 1}).head);
  // Interleaved: rank 1 of 2 with 2 virtual stages holds layers 1 and 3.
  EXPECT_EQ(parallel::pipeline_stage(m, 2, 1, {}, 2).chunks,
            (std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {3, 4}}));
  e = error_of(with({"parallel.pp=2", "parallel.vp=4"}), 2);
  EXPECT_NE(e.find("model.n_layer = 4 is not divisible by parallel.pp × parallel.vp = 2 × 4"),
            std::string::npos)
      << e;
  EXPECT_THROW(with({"parallel.vp=2"}), Error);  // needs a pipeline
  // Interleaved and uneven: pp × vp virtual stages in model order, rank r's
  // chunk c the (c·pp + r)-th; a virtual stage may have none (the last rank's
  // last chunk the head alone).
  EXPECT_EQ(parallel::pipeline_stage(m, 2, 0, {2, 1, 1, 0}, 2).chunks,
            (std::vector<std::pair<int64_t, int64_t>>{{0, 2}, {3, 4}}));
  EXPECT_EQ(parallel::pipeline_stage(m, 2, 1, {2, 1, 1, 0}, 2).chunks,
            (std::vector<std::pair<int64_t, int64_t>>{{2, 3}, {4, 4}}));
  EXPECT_EQ(error_of(with({"parallel.pp=2", "parallel.vp=2", "parallel.pp_layout=2,1,1,0"}), 2),
            "");
  EXPECT_EQ(error_of(with({"parallel.pp=2", "parallel.vp=3", "parallel.pp_layout=1,1,1,0,1,0",
                           "train.global_batch=8"}),
                     2),
            "");
  e = error_of(with({"parallel.pp=2", "parallel.vp=2", "parallel.pp_layout=2,1,1,1"}), 2);
  EXPECT_NE(e.find("parallel.pp_layout: the stages' layers add up to 5, model.n_layer = 4"),
            std::string::npos)
      << e;
  // Each rank's micro-batches in multiples of pp: 8 / (1 × 4) = 2 works, 12 / 4 = 3 does not.
  EXPECT_EQ(error_of(with({"parallel.pp=2", "parallel.vp=2", "train.global_batch=8"}), 2), "");
  e = error_of(with({"parallel.pp=2", "parallel.vp=2", "train.global_batch=12"}), 2);
  EXPECT_NE(e.find("the interleaved schedule needs"), std::string::npos) << e;
}

}  // namespace
}  // namespace nk
