// Log-probabilities from the Generator: each event's logprob is log_softmax of
// the logits the model produced (seen through step()'s LogitsCallback),
// computed here independently in double; the top lists are the largest
// logits in order (ties by lower id); the result vectors line up with tokens;
// penalties and temperature do not change what is reported; the eod event has
// a logprob but no entry in the result; bad top_logprobs is refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>

#include "core/rng.h"
#include "data/tokenizer/tokenizer.h"
#include "infer/counting_model.h"
#include "infer/generate.h"
#include "model/tiny_config.h"
#include "tensor_util.h"
#include "test_util.h"

namespace nk {
namespace {

std::vector<int32_t> random_tokens(int64_t n, uint64_t seed, int64_t V) {
  return test::random_id_list(n, V, seed);
}

// log_softmax(l / temperature) in double, written out plainly.
std::vector<double> log_softmax(const std::vector<float>& l, double temperature = 1.0) {
  double mx = -INFINITY;
  for (float x : l) mx = std::max(mx, double(x) / temperature);
  double z = 0;
  for (float x : l) z += std::exp(double(x) / temperature - mx);
  std::vector<double> out;
  for (float x : l) out.push_back(double(x) / temperature - mx - std::log(z));
  return out;
}

// Every id, most likely first, ties by lower id.
std::vector<int32_t> ranked(const std::vector<float>& l) {
  std::vector<int32_t> ids(l.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) { return l[a] > l[b]; });
  return ids;
}

struct Seen {
  std::vector<std::vector<float>> logits;  // per sampled token
  std::vector<TokenEvent> events;          // top spans copied out below
  std::vector<std::vector<TokenLogprob>> tops;
};

// Steps gen until idle, keeping each id's logits and events (with copies of
// the top lists, checked after the whole step has run).
std::map<int64_t, Seen> drain(Generator& gen) {
  std::map<int64_t, Seen> seen;
  const LogitsCallback keep = [&](int64_t id, const float* l, int64_t V) {
    seen[id].logits.emplace_back(l, l + V);
  };
  while (!gen.idle())
    for (const TokenEvent& e : gen.step(keep)) {
      seen[e.id].events.push_back(e);
      seen[e.id].tops.emplace_back(e.top.begin(), e.top.end());
    }
  return seen;
}

// The checks every request asking for logprobs must pass.
void expect_raw_logprobs(const GenerationRequest& r, const Seen& s, const GenerationResult& res) {
  ASSERT_EQ(s.logits.size(), s.events.size());
  const size_t k = size_t(r.top_logprobs);
  for (size_t i = 0; i < s.events.size(); ++i) {
    SCOPED_TRACE(i);
    const std::vector<double> want = log_softmax(s.logits[i]);
    const std::vector<int32_t> order = ranked(s.logits[i]);
    const TokenEvent& e = s.events[i];
    EXPECT_NEAR(e.logprob, want[size_t(e.token)], 1e-5);
    ASSERT_EQ(s.tops[i].size(), k);
    for (size_t j = 0; j < k; ++j) {
      EXPECT_EQ(s.tops[i][j].token, order[j]) << j;
      EXPECT_NEAR(s.tops[i][j].logprob, want[size_t(order[j])], 1e-5) << j;
    }
  }
  // The result: one entry per token, equal to its event's (no eod here).
  ASSERT_EQ(res.tokens.size(), s.events.size());
  ASSERT_EQ(res.logprobs.size(), res.tokens.size());
  ASSERT_EQ(res.top_logprobs.size(), res.tokens.size());
  for (size_t i = 0; i < res.tokens.size(); ++i) {
    EXPECT_EQ(res.tokens[i], s.events[i].token);
    EXPECT_EQ(res.logprobs[i], s.events[i].logprob);
    ASSERT_EQ(res.top_logprobs[i].size(), k);
    for (size_t j = 0; j < k; ++j) {
      EXPECT_EQ(res.top_logprobs[i][j].token, s.tops[i][j].token);
      EXPECT_EQ(res.top_logprobs[i][j].logprob, s.tops[i][j].logprob);
    }
  }
}

GenerationRequest request(std::vector<int32_t> prompt, int64_t n, double temperature,
                          uint64_t seed) {
  GenerationRequest r;
  r.prompt = std::move(prompt);
  r.max_new_tokens = n;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  return r;
}

TEST(Logprobs, AreTheRawLogSoftmaxWithTheLargestInOrder) {
  for (bool llama : {false, true}) {
    SCOPED_TRACE(llama ? "llama" : "gpt2");
    Transformer m(test::tiny_config(llama, 60, 64), DType::F32, 21);
    const int64_t V = m.config().vocab_size;
    // Three sequences in one step, two with the most top entries allowed (the
    // events' spans all stay valid through the step), one without logprobs.
    GenerationRequest a = request(random_tokens(7, 1, V), 12, 0.0, 0);
    GenerationRequest b = request(random_tokens(4, 2, V), 12, 1.0, 7);
    GenerationRequest c = request(random_tokens(9, 3, V), 12, 0.0, 0);
    GenerationRequest d = request(random_tokens(5, 4, V), 12, 1.0, 8);
    a.logprobs = b.logprobs = d.logprobs = true;
    a.top_logprobs = 5;
    b.top_logprobs = d.top_logprobs = kMaxTopLogprobs;
    Generator gen(m, nullptr, 4, /*prefill_chunk=*/6, /*max_len=*/40);
    const int64_t ia = gen.submit(a), ib = gen.submit(b), ic = gen.submit(c), id = gen.submit(d);
    std::map<int64_t, Seen> seen = drain(gen);
    expect_raw_logprobs(a, seen[ia], gen.result(ia));
    expect_raw_logprobs(b, seen[ib], gen.result(ib));
    expect_raw_logprobs(d, seen[id], gen.result(id));
    // Greedy picks the top entry.
    for (size_t i = 0; i < seen[ia].events.size(); ++i)
      EXPECT_EQ(seen[ia].events[i].token, seen[ia].tops[i][0].token);
    // Not asked: nothing reported, nothing stored.
    for (const TokenEvent& e : seen[ic].events) {
      EXPECT_EQ(e.logprob, 0.f);
      EXPECT_TRUE(e.top.empty());
    }
    EXPECT_TRUE(gen.result(ic).logprobs.empty());
    EXPECT_TRUE(gen.result(ic).top_logprobs.empty());
    // Asking for logprobs changes no token.
    GenerationRequest a0 = a, b0 = b;
    a0.logprobs = b0.logprobs = false;
    a0.top_logprobs = b0.top_logprobs = 0;
    Generator plain(m, nullptr, 2);
    const std::vector<GenerationResult> res = plain.run({a0, b0});
    EXPECT_EQ(res[0].tokens, gen.result(ia).tokens);
    EXPECT_EQ(res[1].tokens, gen.result(ib).tokens);
  }
}

// Temperature, top-k and the penalties shape what is sampled, not what is
// reported: the logprob stays that of the raw distribution.
TEST(Logprobs, IgnorePenaltiesAndTemperature) {
  Transformer m(test::tiny_config(true, 60, 64), DType::F32, 22);
  GenerationRequest r = request(random_tokens(6, 5, 60), 20, 0.7, 3);
  r.sampling.top_k = 10;
  r.sampling.repetition_penalty = 1.3;
  r.sampling.presence_penalty = 0.8;
  r.sampling.frequency_penalty = 0.4;
  r.logprobs = true;
  r.top_logprobs = 3;
  Generator gen(m, nullptr, 1);
  const int64_t id = gen.submit(r);
  std::map<int64_t, Seen> seen = drain(gen);
  expect_raw_logprobs(r, seen[id], gen.result(id));
  // The tempered distribution would have given other numbers (the test could
  // fail).
  double most = 0;
  for (size_t i = 0; i < seen[id].events.size(); ++i) {
    const TokenEvent& e = seen[id].events[i];
    most = std::max(most, std::abs(e.logprob - log_softmax(seen[id].logits[i], 0.7)[e.token]));
  }
  EXPECT_GT(most, 1e-2);
}

// The counting model's eod event (byte 255 is followed by 256) has its
// logprob but no entry in the result vectors, like its token.
TEST(Logprobs, TheEodEventHasALogprobButNoResultEntry) {
  auto m = test::counting_model();
  auto tok = load_tokenizer("bytes");
  Generator gen(*m, tok.get(), 1);
  GenerationRequest r = request({252}, 10, 0.0, 0);
  r.logprobs = true;
  r.top_logprobs = 2;
  const int64_t id = gen.submit(r);
  std::map<int64_t, Seen> seen = drain(gen);
  const Seen& s = seen[id];
  const GenerationResult& res = gen.result(id);
  EXPECT_EQ(res.finish, FinishReason::Eos);
  EXPECT_EQ(res.tokens, (std::vector<int32_t>{253, 254, 255}));
  ASSERT_EQ(s.events.size(), 4u);
  EXPECT_EQ(s.events[3].token, tok->eod_id());
  EXPECT_EQ(res.logprobs.size(), 3u);
  EXPECT_EQ(res.top_logprobs.size(), 3u);
  for (size_t i = 0; i < 4; ++i) {
    const std::vector<double> want = log_softmax(s.logits[i]);
    EXPECT_NEAR(s.events[i].logprob, want[size_t(s.events[i].token)], 1e-5) << i;
    // The next id's logit (64) dwarfs the rest: nearly all the mass.
    EXPECT_GT(s.events[i].logprob, -1e-3) << i;
    EXPECT_LE(s.events[i].logprob, 0.f) << i;
    ASSERT_EQ(s.tops[i].size(), 2u);
    EXPECT_EQ(s.tops[i][0].token, s.events[i].token);
    EXPECT_EQ(s.tops[i][1].token, ranked(s.logits[i])[1]);
    if (i < 3) {
      EXPECT_EQ(res.logprobs[i], s.events[i].logprob);
    }
  }
}

TEST(Logprobs, BadTopLogprobsIsRefusedNamingTheKey) {
  auto m = test::counting_model();
  Generator gen(*m, nullptr, 1);
  GenerationRequest r = request({'a'}, 3, 0.0, 0);
  r.logprobs = true;
  for (int64_t k : {int64_t(21), int64_t(-1), int64_t(1000)}) {
    r.top_logprobs = k;
    const std::string e = test::error_of([&] { gen.submit(r); });
    EXPECT_TRUE(test::contains(e, "top_logprobs") && test::contains(e, "prompt 0")) << e;
  }
  r.logprobs = false;
  r.top_logprobs = 3;
  std::string e = test::error_of([&] { gen.submit(r); });
  EXPECT_TRUE(test::contains(e, "top_logprobs") && test::contains(e, "needs logprobs")) << e;
  // run() checks every request first and names it by its index.
  GenerationRequest ok = request({'a'}, 3, 0.0, 0);
  e = test::error_of([&] { gen.run({ok, r}); });
  EXPECT_TRUE(test::contains(e, "prompt 1") && test::contains(e, "top_logprobs")) << e;
  EXPECT_TRUE(gen.idle());
  // The bounds themselves are fine.
  r.logprobs = true;
  r.top_logprobs = kMaxTopLogprobs;
  EXPECT_NO_THROW(gen.submit(r));
  r.top_logprobs = 0;
  EXPECT_NO_THROW(gen.submit(r));
}

}  // namespace
}  // namespace nk
