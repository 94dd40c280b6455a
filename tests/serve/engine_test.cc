// The engine thread over the counting model (tests/infer/counting_model.h:
// greedy over bytes it continues "abc" with "defg..."): requests from several
// threads, events in order on their channels, refusals, cancellation and
// the metrics it keeps.
#include "serve/engine.h"

#include <gtest/gtest.h>

#include <thread>

#include "infer/counting_model.h"
#include "serve/serve_cache.h"
#include "serve_test_util.h"

namespace nk {
namespace {

GenerationRequest greedy(const std::string& prompt, int64_t max_tokens) {
  GenerationRequest r;
  for (unsigned char c : prompt) r.prompt.push_back(c);
  r.max_new_tokens = max_tokens;
  r.sampling.temperature = 0;
  return r;
}

// Every event of a channel until its `n` sequences finish (at most 20 s).
std::vector<StreamEvent> drain(RequestChannel& ch, int64_t n) {
  std::vector<StreamEvent> all;
  for (int i = 0; i < 200 && n > 0; ++i) {
    const size_t before = all.size();
    ch.wait(all, std::chrono::milliseconds(100));
    for (size_t k = before; k < all.size(); ++k) n -= all[k].finished;
  }
  EXPECT_EQ(n, 0) << "sequences did not finish";
  return all;
}

class EngineTest : public ::testing::Test {
 protected:
  std::unique_ptr<Transformer> model_ = test::counting_model();
  std::unique_ptr<Tokenizer> tok_ = load_tokenizer("bytes");
  ServeMetrics metrics_;
  std::unique_ptr<Engine> engine(int64_t batch = 4) {
    ServeConfig cfg;
    cfg.max_batch = batch;
    cfg.prefill_chunk = 16;
    return std::make_unique<Engine>(*model_, *tok_, make_serve_cache(cfg, *model_), batch,
                                    metrics_);
  }
};

TEST_F(EngineTest, RequestsFromManyThreads) {
  auto e = engine(2);
  std::vector<std::string> texts(6);
  std::vector<std::thread> threads;
  for (int i = 0; i < 6; ++i)
    threads.emplace_back([&, i] {
      const std::string prompt(1, char('a' + 3 * i));
      auto ch = e->submit({greedy(prompt, 4)}, ServeClock::now());
      for (const StreamEvent& ev : drain(*ch, 1)) {
        EXPECT_EQ(ev.choice, 0);
        texts[size_t(i)] += ev.piece;
      }
    });
  for (auto& t : threads) t.join();
  for (int i = 0; i < 6; ++i) {
    std::string want;
    for (int k = 1; k <= 4; ++k) want += char('a' + 3 * i + k);
    EXPECT_EQ(texts[size_t(i)], want);
  }
  EXPECT_EQ(metrics_.generation_tokens.value(), 24);
  EXPECT_EQ(metrics_.prompt_tokens.value(), 6);
  EXPECT_EQ(metrics_.time_to_first_token.count(), 6);
  EXPECT_EQ(metrics_.inter_token_latency.count(), 18);
  EXPECT_EQ(metrics_.request_latency.count(), 6);
  // The paged cache's default pool: max_batch sequences of the model's 64
  // positions in blocks of 16.
  EXPECT_EQ(metrics_.kv_blocks_total.value(), 2 * 64 / 16);
}

TEST_F(EngineTest, ChoicesStopsAndFinishReasons) {
  auto e = engine();
  GenerationRequest stop = greedy("abc", 10);
  stop.stop = {"fg"};
  GenerationRequest eos = greedy("\xfc", 10);  // 253, 254, 255, then the end of text
  eos.logprobs = true;
  eos.top_logprobs = 2;
  auto ch = e->submit({greedy("abc", 3), stop, eos}, ServeClock::now());
  std::vector<std::string> text(3);
  std::vector<FinishReason> why(3);
  std::vector<int> tokens(3);
  for (const StreamEvent& ev : drain(*ch, 3)) {
    text[size_t(ev.choice)] += ev.piece;
    ++tokens[size_t(ev.choice)];
    if (ev.finished) why[size_t(ev.choice)] = ev.finish;
    if (ev.choice == 2) {
      ASSERT_EQ(ev.top.size(), 2u);
      EXPECT_EQ(ev.top[0].token, ev.token);  // greedy: the most likely
      EXPECT_LE(ev.logprob, 0);
    }
  }
  EXPECT_EQ(text[0], "def");
  EXPECT_EQ(why[0], FinishReason::Length);
  EXPECT_EQ(text[1], "de");
  EXPECT_EQ(why[1], FinishReason::Stop);
  EXPECT_EQ(why[2], FinishReason::Eos);
  EXPECT_EQ(tokens[2], 4);  // 253, 254, 255 and the eod
}

TEST_F(EngineTest, RefusedRequestFailsItsChannel) {
  auto e = engine();
  GenerationRequest bad = greedy("a", 2);
  bad.prompt.push_back(999);  // outside the vocabulary of 257
  auto ch = e->submit({greedy("a", 2), bad}, ServeClock::now());
  std::vector<StreamEvent> out;
  try {
    for (int i = 0; i < 100; ++i) ch->wait(out, std::chrono::milliseconds(100));
    FAIL() << "no error";
  } catch (const ApiError& err) {
    EXPECT_EQ(err.status(), 400);
    EXPECT_NE(std::string(err.what()).find("vocabulary"), std::string::npos) << err.what();
  }
  // The request's other sequence went with it; the engine carries on.
  auto ok = e->submit({greedy("x", 2)}, ServeClock::now());
  std::string text;
  for (const StreamEvent& ev : drain(*ok, 1)) text += ev.piece;
  EXPECT_EQ(text, "yz");
  EXPECT_EQ(metrics_.running.value(), 0);
}

TEST_F(EngineTest, CancelFreesTheSlotAndStopFailsTheRest) {
  // A model with room for a long sequence (tests/serve/serve_test_util.h),
  // so that the cancelled one is still running when the cancel comes.
  test::TempDir d("nk_engine");
  test::save_ascii_model(d / "m", 2048, false);
  auto model = load_model(d / "m", DType::F32);
  ServeConfig cfg;
  cfg.max_batch = 1;  // one slot: the next request waits until it is free
  Engine e(*model, *tok_, make_serve_cache(cfg, *model), 1, metrics_);
  auto first = e.submit({greedy("abc", 2000)}, ServeClock::now());
  std::vector<StreamEvent> got;
  first->wait(got, std::chrono::seconds(10));
  ASSERT_FALSE(got.empty());
  e.cancel(*first);
  auto second = e.submit({greedy("k", 2)}, ServeClock::now());
  const std::vector<StreamEvent> done = drain(*second, 1);
  ASSERT_EQ(done.size(), 2u);
  EXPECT_TRUE(done.back().finished);
  // The cancelled request got a few of its 2000 tokens and never a finish.
  first->wait(got, std::chrono::milliseconds(50));
  EXPECT_LT(got.size(), 1000u);
  for (const StreamEvent& ev : got) EXPECT_FALSE(ev.finished);
  EXPECT_EQ(metrics_.kv_blocks_used.value(), 0);
  EXPECT_EQ(metrics_.running.value(), 0);
  e.stop();
  auto late = e.submit({greedy("a", 2)}, ServeClock::now());
  std::vector<StreamEvent> none;
  try {
    late->wait(none, std::chrono::seconds(1));
    FAIL() << "no error after stop";
  } catch (const ApiError& err) {
    EXPECT_EQ(err.status(), 503);
  }
}

// A prompt repeated after its first request ended comes from the prefix
// cache (its 2 full blocks of 16), with the same text; /metrics counts it.
TEST_F(EngineTest, RepeatedPromptHitsThePrefixCache) {
  auto e = engine(2);
  const std::string prompt(40, 'a');
  std::vector<std::string> texts;
  for (int i = 0; i < 2; ++i) {
    auto ch = e->submit({greedy(prompt, 4)}, ServeClock::now());
    std::string t;
    for (const StreamEvent& ev : drain(*ch, 1)) t += ev.piece;
    texts.push_back(t);
    EXPECT_EQ(metrics_.prefix_hit_tokens.value(), i == 0 ? 0 : 32);
  }
  EXPECT_EQ(texts[0], "bcde");
  EXPECT_EQ(texts[1], texts[0]);
  EXPECT_EQ(metrics_.preemptions.value(), 0);
}

// The paged cache's keys: a block size outside [1, positions per sequence]
// or negative memory is refused naming the key; memory sets the pool.
TEST_F(EngineTest, PagedCacheKeys) {
  ServeConfig cfg;
  cfg.block_size = 0;
  EXPECT_TRUE(test::contains(test::error_of([&] { make_serve_cache(cfg, *model_); }),
                             "serve.block_size: must be in [1, 64]"));
  cfg.block_size = 65;
  EXPECT_TRUE(
      test::contains(test::error_of([&] { make_serve_cache(cfg, *model_); }), "serve.block_size"));
  cfg.block_size = 16;
  cfg.kv_memory_mb = -1;
  EXPECT_TRUE(test::contains(test::error_of([&] { make_serve_cache(cfg, *model_); }),
                             "serve.kv_memory_mb: must be >= 0"));
  // One layer, 2 kv heads of 32 f32 values, k and v: 8 KiB a block of 16.
  cfg.kv_memory_mb = 1;
  EXPECT_EQ(make_serve_cache(cfg, *model_)->blocks_total(), 128);
  // serve.kv_cache_dtype: bf16 and f16 keys and values fit twice the blocks
  // in the same memory; a bad value names the key.
  for (const char* dt : {"bf16", "f16"}) {
    cfg.kv_cache_dtype = dt;
    std::unique_ptr<SequenceCache> c = make_serve_cache(cfg, *model_);
    EXPECT_EQ(c->blocks_total(), 256) << dt;
    EXPECT_EQ(dtype_name(c->kv().kv_dtype()), std::string(dt));
    EXPECT_EQ(c->kv().cache_bytes(), int64_t(1) << 20) << dt;
  }
  // q8_0: 34 bytes per 32 values, 2,176 bytes a block.
  cfg.kv_cache_dtype = "q8_0";
  {
    std::unique_ptr<SequenceCache> c = make_serve_cache(cfg, *model_);
    EXPECT_EQ(c->blocks_total(), (1 << 20) / 2176);
    EXPECT_STREQ(kv_cache_dtype_name(c->kv().kv_dtype()), "q8_0");
    EXPECT_EQ(c->kv().cache_bytes(), (1 << 20) / 2176 * 2176);
  }
  cfg.kv_cache_dtype = "f32";
  EXPECT_EQ(make_serve_cache(cfg, *model_)->blocks_total(), 128);
  cfg.kv_cache_dtype = "q8";
  EXPECT_TRUE(test::contains(test::error_of([&] { make_serve_cache(cfg, *model_); }),
                             "serve.kv_cache_dtype: 'q8' is not a KV cache dtype"));
}

// A bf16 or q8_0 cache under the f32 counting model: the engine's greedy
// answers are the f32 cache's (its attention output is zeroed, so the
// rounding cannot show), prefix caching included.
TEST_F(EngineTest, NarrowCachesServe) {
  int64_t hits = 0;
  for (const char* dt : {"bf16", "q8_0"}) {
    SCOPED_TRACE(dt);
    ServeConfig cfg;
    cfg.max_batch = 2;
    cfg.prefill_chunk = 16;
    cfg.kv_cache_dtype = dt;
    Engine e(*model_, *tok_, make_serve_cache(cfg, *model_), 2, metrics_);
    for (int i = 0; i < 2; ++i) {
      auto ch = e.submit({greedy("abcdefghijklmnopqrstuvwxyz0123456789", 4)}, ServeClock::now());
      std::string t;
      for (const StreamEvent& ev : drain(*ch, 1)) t += ev.piece;
      EXPECT_EQ(t, ":;<=");
    }
    hits += 32;
    EXPECT_EQ(metrics_.prefix_hit_tokens.value(), hits);
  }
}

}  // namespace
}  // namespace nk
