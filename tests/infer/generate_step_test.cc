// The step-wise Generator (submit / step / cancel): requests submitted at
// different steps, one cancelled mid-way, give the others exactly the tokens
// they get alone (greedy and seeded sampling, GPT-2 and Llama shapes); cancel
// of unknown, finished and waiting ids; more requests than slots wait and are
// admitted as slots free; a prompt that does not fit the cache is an error at
// submit; events stream each sequence's text; presence and frequency
// penalties count the generated ids only, and at 0 change nothing; a cache
// whose handles are not slot numbers works unchanged (the generator never
// computes an address).
#include <gtest/gtest.h>

#include <map>

#include "core/rng.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/counting_model.h"
#include "infer/generate.h"
#include "tensor_util.h"
#include "test_util.h"

#include "model/tiny_config.h"

namespace nk {
namespace {

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int64_t V) {
  return test::random_id_list(n, V, seed);
}

GenerationRequest request(std::vector<int32_t> prompt, int64_t n, bool sampled, uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  r.sampling.temperature = sampled ? 1.0 : 0.0;
  r.sampling.seed = seed;
  return r;
}

std::vector<int32_t> alone(Transformer& m, const GenerationRequest& r) {
  Generator one(m, nullptr, 1);
  return one.run({r})[0].tokens;
}

// Steps until every id given is finished; collects each id's event tokens.
void drain(Generator& gen, std::map<int64_t, std::vector<int32_t>>& got) {
  while (!gen.idle())
    for (const TokenEvent& e : gen.step()) got[e.id].push_back(e.token);
}

TEST(GenerateStep, SubmittedAtDifferentStepsWithOneCancelledEqualsEachAlone) {
  for (bool llama : {false, true})
    for (bool sampled : {false, true}) {
      SCOPED_TRACE(std::string(llama ? "llama" : "gpt2") + (sampled ? " sampled" : " greedy"));
      Transformer m(test::tiny_config(llama, 60, 64), DType::F32, 8);
      const int64_t V = m.config().vocab_size;
      GenerationRequest a = request(random_tokens(13, 1, V), 20, sampled, 31);
      GenerationRequest b = request(random_tokens(5, 2, V), 20, sampled, 32);
      GenerationRequest c = request(random_tokens(9, 3, V), 12, sampled, 33);
      Generator gen(m, nullptr, 3, /*prefill_chunk=*/4, /*max_len=*/48);
      std::map<int64_t, std::vector<int32_t>> got;
      auto run_steps = [&](int n) {
        for (int i = 0; i < n; ++i)
          for (const TokenEvent& e : gen.step()) got[e.id].push_back(e.token);
      };
      const int64_t ia = gen.submit(a);
      run_steps(5);  // a's 13 prompt tokens in chunks of 4, then decoding
      const int64_t ib = gen.submit(b);
      run_steps(3);
      const int64_t ic = gen.submit(c);  // prefilled beside a's and b's decodes
      run_steps(4);
      EXPECT_EQ(gen.running(), 3);
      ASSERT_FALSE(gen.finished(ib));
      const std::vector<int32_t> b_so_far = gen.result(ib).tokens;
      ASSERT_FALSE(b_so_far.empty());
      EXPECT_TRUE(gen.cancel(ib));
      EXPECT_EQ(gen.running(), 2);
      drain(gen, got);

      EXPECT_EQ(gen.result(ia).tokens, alone(m, a));
      EXPECT_EQ(gen.result(ic).tokens, alone(m, c));
      EXPECT_EQ(got[ia], gen.result(ia).tokens);
      EXPECT_EQ(got[ic], gen.result(ic).tokens);
      EXPECT_EQ(gen.result(ia).finish, FinishReason::Length);
      // b keeps what it had; no token came after the cancel; it is b's prefix.
      EXPECT_EQ(gen.result(ib).finish, FinishReason::Cancelled);
      EXPECT_EQ(gen.result(ib).tokens, b_so_far);
      EXPECT_EQ(got[ib], b_so_far);
      std::vector<int32_t> b_alone = alone(m, b);
      b_alone.resize(b_so_far.size());
      EXPECT_EQ(b_so_far, b_alone);
      // The tokens depend on the request: a differs from a run with another seed
      // or prompt (the test could fail).
      EXPECT_NE(gen.result(ia).tokens, gen.result(ic).tokens);
    }
}

TEST(GenerateStep, CancelOfUnknownFinishedOrWaitingIds) {
  auto m = test::counting_model();
  Generator gen(*m, nullptr, 1);
  EXPECT_FALSE(gen.cancel(0));  // never submitted
  const int64_t a = gen.submit(request({'a'}, 3, false, 0));
  const int64_t b = gen.submit(request({'k'}, 3, false, 0));  // waits: one slot
  const int64_t c = gen.submit(request({'x'}, 2, false, 0));
  EXPECT_EQ(gen.running(), 0);
  EXPECT_EQ(gen.waiting(), 3);
  gen.step();
  EXPECT_EQ(gen.running(), 1);
  EXPECT_EQ(gen.waiting(), 2);
  EXPECT_TRUE(gen.cancel(b));   // waiting: leaves the queue without running
  EXPECT_FALSE(gen.cancel(b));  // already finished (cancelled)
  EXPECT_EQ(gen.waiting(), 1);
  std::map<int64_t, std::vector<int32_t>> got;
  drain(gen, got);
  EXPECT_EQ(gen.result(a).tokens, (std::vector<int32_t>{'b', 'c', 'd'}));
  EXPECT_EQ(gen.result(c).tokens, (std::vector<int32_t>{'y', 'z'}));
  EXPECT_TRUE(gen.result(b).tokens.empty());
  EXPECT_EQ(gen.result(b).finish, FinishReason::Cancelled);
  EXPECT_EQ(got.count(b), 0u);
  EXPECT_FALSE(gen.cancel(a));  // finished (length): nothing changes
  EXPECT_EQ(gen.result(a).finish, FinishReason::Length);
  EXPECT_EQ(gen.release(a).tokens.size(), 3u);
  EXPECT_FALSE(gen.cancel(a));    // released
  EXPECT_FALSE(gen.cancel(-1));   // never an id
  EXPECT_FALSE(gen.cancel(999));  // not yet an id
  EXPECT_TRUE(test::contains(test::error_of([&] { gen.result(a); }), "no sequence 0"));
  EXPECT_TRUE(gen.step().empty());  // nothing left to do
}

TEST(GenerateStep, MoreRequestsThanSlotsWaitAndAreAdmittedAsSlotsFree) {
  auto m = test::counting_model();
  auto tok = load_tokenizer("bytes");
  Generator gen(*m, tok.get(), 2, 256, /*max_len=*/32);
  std::vector<int64_t> ids;
  const std::vector<int64_t> lengths = {2, 5, 3, 1, 4};
  for (size_t i = 0; i < lengths.size(); ++i)
    ids.push_back(gen.submit(request({int32_t('a' + 5 * i)}, lengths[i], false, 0)));
  std::map<int64_t, std::string> text;
  int64_t steps = 0, admitted_late = 0;
  while (!gen.idle()) {
    // A step first fills the slots left free by the last one, in order.
    const int64_t w0 = gen.waiting(), free0 = 2 - gen.running();
    for (const TokenEvent& e : gen.step()) text[e.id] += e.piece;
    ++steps;
    EXPECT_EQ(gen.waiting(), std::max<int64_t>(0, w0 - free0)) << "step " << steps;
    EXPECT_LE(gen.running(), 2);
    admitted_late += steps > 1 && gen.waiting() < w0;
  }
  EXPECT_GE(admitted_late, 2);  // the 3 waiting ones came in over later steps
  for (size_t i = 0; i < ids.size(); ++i) {
    const GenerationResult& r = gen.result(ids[i]);
    std::string want;
    for (int64_t k = 1; k <= lengths[i]; ++k) want += char('a' + 5 * i + k);
    EXPECT_EQ(r.text, want) << i;
    EXPECT_EQ(text[ids[i]], want) << i;
    EXPECT_EQ(r.finish, FinishReason::Length);
  }
  // Two slots: (2 + 5 + 3 + 1 + 4) tokens cannot take fewer than 8 steps.
  EXPECT_GE(steps, 8);
}

TEST(GenerateStep, PromptLongerThanTheCacheIsAnErrorAtSubmit) {
  auto m = test::counting_model();
  Generator gen(*m, nullptr, 2, 256, /*max_len=*/16);
  std::vector<int32_t> p16(16, 'a'), p15(15, 'a');
  const std::string e = test::error_of([&] { gen.submit(request(p16, 4, false, 0)); });
  EXPECT_TRUE(test::contains(e, "prompt 0 has 16 tokens") && test::contains(e, "16 positions"))
      << e;
  EXPECT_TRUE(gen.idle());
  // The refused request took no id; one that fits runs until the cache is full.
  const int64_t id = gen.submit(request(p15, 10, false, 0));
  EXPECT_EQ(id, 0);
  while (!gen.idle()) gen.step();
  EXPECT_EQ(gen.result(id).tokens, (std::vector<int32_t>{'b', 'c'}));
  EXPECT_EQ(gen.result(id).finish, FinishReason::Context);
  // Sized from the requests (max_len 0): the model's max_seq_len is the bound.
  Generator grow(*m, nullptr, 1);
  EXPECT_TRUE(test::contains(
      test::error_of([&] { grow.submit(request(std::vector<int32_t>(64, 'a'), 1, false, 0)); }),
      "model.max_seq_len = 64"));
  EXPECT_TRUE(
      test::contains(test::error_of([&] { grow.submit(request({}, 1, false, 0)); }), "empty"));
}

// With the cache sized from the requests, one longer than the cache waits for
// the running ones to end, then the cache grows and it runs as it would alone.
TEST(GenerateStep, SizedCacheGrowsWhenIdle) {
  Transformer m(test::tiny_config(true, 60, 64), DType::F32, 9);
  Generator gen(m, nullptr, 2);
  GenerationRequest a = request(random_tokens(3, 4, 60), 4, true, 1);
  GenerationRequest b = request(random_tokens(20, 5, 60), 6, true, 2);
  const int64_t ia = gen.submit(a);
  gen.step();
  const int64_t ib = gen.submit(b);
  gen.step();
  EXPECT_EQ(gen.running(), 1);  // a free slot, but b needs 25 positions of a cache of 6
  EXPECT_EQ(gen.waiting(), 1);
  while (!gen.idle()) gen.step();
  EXPECT_EQ(gen.result(ia).tokens, alone(m, a));
  EXPECT_EQ(gen.result(ib).tokens, alone(m, b));
}

TEST(GenerateStep, EventsStreamTextAndFinishReasons) {
  auto m = test::counting_model();
  auto tok = load_tokenizer("bytes");
  Generator gen(*m, tok.get(), 4);
  GenerationRequest stop = request(tok->encode("a"), 10, false, 0), eos = stop, len = stop;
  stop.stop = {"efg"};
  eos.prompt = {252};
  len.max_new_tokens = 2;
  const int64_t is = gen.submit(stop), ie = gen.submit(eos), il = gen.submit(len);
  std::map<int64_t, std::string> text;
  std::map<int64_t, int64_t> events, finished_events;
  while (!gen.idle()) {
    std::map<int64_t, int64_t> per_step;
    for (const TokenEvent& e : gen.step()) {
      text[e.id] += e.piece;
      ++events[e.id];
      ++per_step[e.id];
      finished_events[e.id] += e.finished;
      EXPECT_EQ(gen.finished(e.id), e.finished);
    }
    for (auto [id, n] : per_step) EXPECT_EQ(n, 1) << "one token per sequence and step";
  }
  EXPECT_EQ(text[is], "bcd");  // "efg" held back while it could still be a stop string
  EXPECT_EQ(gen.result(is).finish, FinishReason::Stop);
  EXPECT_EQ(events[is], 6);
  EXPECT_EQ(gen.result(ie).finish, FinishReason::Eos);
  EXPECT_EQ(gen.result(ie).tokens, (std::vector<int32_t>{253, 254, 255}));
  EXPECT_EQ(events[ie], 4);  // the eod id is an event, not a token
  EXPECT_EQ(text[il], "bc");
  EXPECT_EQ(gen.result(il).finish, FinishReason::Length);
  for (int64_t id : {is, ie, il}) EXPECT_EQ(finished_events[id], 1);
  EXPECT_STREQ(finish_reason_name(FinishReason::Cancelled), "cancelled");
  EXPECT_TRUE(test::contains(test::error_of([&] {
                               Generator g(*m, tok.get(), 1);
                               g.submit(request({'a'}, 5, false, 0));
                               g.release(0);
                             }),
                             "still running"));
}

// The generator hands the sampler the prompt and the generated ids apart:
// replaying its logits through a fresh Sampler with the same seed, prompt and
// tokens so far gives back every token, with presence, frequency and
// repetition penalties on (greedy and sampled). Penalties set explicitly to 0
// give exactly the tokens of a request that never mentions them.
TEST(GenerateStep, PenaltiesSeeOnlyGeneratedTokensAndOffChangeNothing) {
  for (bool sampled : {false, true}) {
    SCOPED_TRACE(sampled ? "sampled" : "greedy");
    Transformer m(test::tiny_config(true, 60, 64), DType::F32, 12);
    GenerationRequest r = request(random_tokens(8, 6, 60), 24, sampled, 41);
    r.sampling.top_k = 30;
    r.sampling.top_p = 0.95;
    r.sampling.repetition_penalty = 1.1;
    GenerationRequest zero = r, pen = r;
    zero.sampling.presence_penalty = 0;
    zero.sampling.frequency_penalty = 0;
    pen.sampling.presence_penalty = 1.5;
    pen.sampling.frequency_penalty = 0.5;
    Generator gen(m, nullptr, 3, /*prefill_chunk=*/4, /*max_len=*/40);
    std::vector<std::vector<float>> logits;
    int64_t ipen = -1;
    const LogitsCallback keep = [&](int64_t id, const float* l, int64_t V) {
      if (id == ipen) logits.emplace_back(l, l + V);
    };
    const int64_t ir = gen.submit(r), iz = gen.submit(zero);
    ipen = gen.submit(pen);
    while (!gen.idle()) gen.step(keep);
    EXPECT_EQ(gen.result(iz).tokens, gen.result(ir).tokens);
    EXPECT_EQ(gen.result(ir).tokens, alone(m, r));
    const std::vector<int32_t>& got = gen.result(ipen).tokens;
    ASSERT_EQ(logits.size(), got.size());
    EXPECT_NE(got, gen.result(ir).tokens);  // the penalties do something
    Sampler replay(pen.sampling), as_prompt(pen.sampling);
    int64_t differ = 0;  // steps where counting the prompt too would pick otherwise
    for (size_t i = 0; i < got.size(); ++i) {
      const std::span<const int32_t> gen_so_far = std::span(got).first(i);
      EXPECT_EQ(replay.sample(logits[i].data(), 60, pen.prompt, gen_so_far), got[i]) << i;
      std::vector<int32_t> all = pen.prompt;
      all.insert(all.end(), gen_so_far.begin(), gen_so_far.end());
      differ += as_prompt.sample(logits[i].data(), 60, {}, all) != got[i];
    }
    EXPECT_GT(differ, 0);  // the replay could fail had the prompt been counted
  }
}

// A cache whose handles are not slot numbers (100 + a permuted slot): the
// generator only passes handles back, so its outputs do not change, and every
// opened handle is closed.
class ShuffledCache final : public SequenceCache {
 public:
  ShuffledCache(const Transformer& m, int64_t slots, int64_t max_len)
      : inner_(m.config(), m.compute_dtype(), slots, max_len, slots + 8) {}
  int64_t max_len() const override { return inner_.max_len(); }
  int64_t max_tokens() const override { return inner_.max_tokens(); }
  Opened open(int64_t len, std::span<const int32_t> ids) override {
    const Opened o = inner_.open(len, ids);
    if (o.handle == kNoRoom) return {};
    ++opened;
    return {100 + int32_t(inner_.slots()) - 1 - o.handle, o.cached};
  }
  void close(int32_t h) override {
    ++closed;
    inner_.close(slot(h));
  }
  bool append(int32_t h, int64_t first, std::span<const int32_t> ids, StepBuffer& step) override {
    return inner_.append(slot(h), first, ids, step);
  }
  void forward(Transformer& model, const StepBuffer& step, Tensor logits) override {
    inner_.forward(model, step, logits);
  }
  int64_t blocks_used() const override { return inner_.blocks_used(); }
  int64_t blocks_total() const override { return inner_.blocks_total(); }
  const KVCache& kv() const override { return inner_.kv(); }
  int64_t opened = 0, closed = 0;

 private:
  int32_t slot(int32_t h) const { return int32_t(inner_.slots()) - 1 - (h - 100); }
  SlotCache inner_;
};

TEST(GenerateStep, AnyCacheBehindTheInterface) {
  Transformer m(test::tiny_config(false, 60, 64), DType::F32, 10);
  auto cache = std::make_unique<ShuffledCache>(m, 3, 40);
  ShuffledCache* sc = cache.get();
  Generator gen(m, nullptr, std::move(cache), 3);
  std::vector<GenerationRequest> reqs;
  for (int64_t i = 0; i < 5; ++i)
    reqs.push_back(request(random_tokens(3 + 4 * i, 20 + uint64_t(i), 60), 7, i % 2, uint64_t(i)));
  const int64_t ic = gen.submit(reqs[4]);
  auto res = gen.run({reqs[0], reqs[1], reqs[2], reqs[3]});
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(res[i].tokens, alone(m, reqs[i])) << i;
  while (!gen.idle()) gen.step();
  EXPECT_EQ(gen.result(ic).tokens, alone(m, reqs[4]));
  EXPECT_EQ(sc->opened, 5);
  EXPECT_EQ(sc->closed, 5);
  const std::string e =
      test::error_of([&] { gen.submit(request(random_tokens(40, 1, 60), 1, false, 0)); });
  EXPECT_TRUE(test::contains(e, "40 positions")) << e;
}

}  // namespace
}  // namespace nk
