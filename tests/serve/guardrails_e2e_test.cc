// Guardrails through `nekton serve`: the built binary with a rails file
// (serve.guardrails.config), driven by httplib's client and OpenAI's
// official JavaScript client (guardrails_client.mjs). Each test starts its
// own server over a tiny model and kills it on every path.
#include <gtest/gtest.h>
#include <httplib.h>

#include <regex>

#include "guardrails_test_util.h"
#include "test_paths.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::ServerProcess;

// The events of a streamed response, [DONE] left out.
std::vector<json> sse_events(const std::string& body) {
  std::vector<json> out;
  std::istringstream in(body);
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("data: ") && line != "data: [DONE]")
      out.push_back(json::parse(line.substr(6)));
  return out;
}

// Choice 0's streamed text and finish reason.
std::pair<std::string, std::string> streamed_choice(const std::string& body, bool chat) {
  std::string text, finish;
  for (const json& e : sse_events(body))
    for (const json& c : e["choices"]) {
      if (c["index"] != 0) continue;
      if (chat && c["delta"].contains("content")) text += c["delta"]["content"].get<std::string>();
      if (!chat) text += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) finish = c["finish_reason"];
    }
  return {text, finish};
}

// `s` as a PCRE2 pattern matching it literally.
std::string literal_pattern(const std::string& s) {
  std::string p;
  for (char c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c))) p += '\\';
    p += c;
  }
  return p;
}

// `s` with every (non-overlapping) `what` replaced by `by`.
std::string replace_all(std::string s, const std::string& what, const std::string& by) {
  for (size_t at = 0; (at = s.find(what, at)) != std::string::npos; at += by.size())
    s.replace(at, what.size(), by);
  return s;
}

class GuardrailsE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = d_ / "tiny";
    test::save_ascii_model(model_);
  }
  // Starts the server with `rails` as its guardrails file; fails the test
  // (and returns false) when it does not come up.
  bool start(const std::string& rails, const std::string& model = "") {
    server_ = std::make_unique<ServerProcess>(
        model.empty() ? model_ : model,
        std::vector<std::string>{"serve.guardrails.config=" + test::write_rails(d_, rails)},
        d_ / "serve.log");
    EXPECT_GT(server_->port(), 0) << server_->log();
    return server_->port() > 0;
  }
  httplib::Client client() const { return server_->client(); }
  json post(const std::string& path, const json& body, int status = 200) {
    auto r = client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(r);
    if (!r) return nullptr;
    EXPECT_EQ(r->status, status) << r->body;
    return body.value("stream", false) ? json(r->body) : json::parse(r->body);
  }
  // A labelled counter of /metrics (0 when absent).
  double metric(const std::string& name, const std::string& rail) {
    auto r = client().Get("/metrics");
    if (!r) return -1;
    std::smatch m;
    const std::regex re(name + "\\{rail=\"" + rail + "\"\\} ([0-9.e+-]+)\n");
    return std::regex_search(r->body, m, re) ? std::stod(m[1]) : 0;
  }
  // The greedy chat answer to "Hello there" as `nekton generate` gives it.
  std::string greedy_chat(int max_tokens) {
    return test::greedy_generate(model_, d_.path().string(),
                                 "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n",
                                 max_tokens);
  }
  static json chat(const std::string& content, int max_tokens = 8, bool stream = false) {
    return {{"messages", {{{"role", "user"}, {"content", content}}}},
            {"max_tokens", max_tokens},
            {"temperature", 0},
            {"stream", stream}};
  }

  test::TempDir d_{"nk_guard_e2e"};
  std::string model_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(GuardrailsE2E, InputRailAnswersTheRefusal) {
  ASSERT_TRUE(start("refusal: Nope, not that.\ninput:\n  blocked_keywords: [bomb]\n"));
  EXPECT_TRUE(contains(server_->log(), "input rails: input.blocked_keywords; output rails: none"))
      << server_->log();
  const json r = post("/v1/chat/completions", chat("How do I build a bomb?"));
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Nope, not that.");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "content_filter");
  EXPECT_EQ(r["usage"]["completion_tokens"], 0);
  const json s = post("/v1/chat/completions", chat("a BOMB", 8, true));
  EXPECT_EQ(streamed_choice(s.get<std::string>(), true),
            std::pair(std::string("Nope, not that."), std::string("content_filter")));
  EXPECT_TRUE(s.get<std::string>().ends_with("data: [DONE]\n\n"));
  const json c = post("/v1/completions", {{"prompt", "bomb"}, {"n", 2}, {"max_tokens", 4}});
  ASSERT_EQ(c["choices"].size(), 2u);
  for (const json& ch : c["choices"]) {
    EXPECT_EQ(ch["text"], "Nope, not that.");
    EXPECT_EQ(ch["finish_reason"], "content_filter");
  }
  // A harmless request reaches the model.
  const json ok = post("/v1/chat/completions", chat("Hello there", 8));
  EXPECT_EQ(ok["choices"][0]["message"]["content"], greedy_chat(8));
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(metric("nekton_guardrail_checks_total", "input.blocked_keywords"), 4);
  EXPECT_EQ(metric("nekton_guardrail_triggered_total", "input.blocked_keywords"), 3);
  EXPECT_TRUE(contains(server_->log(), "guardrail input.blocked_keywords refused a request"));
  EXPECT_EQ(server_->stop(SIGTERM), 0) << server_->log();
}

TEST_F(GuardrailsE2E, OnInputErrorIsA400) {
  ASSERT_TRUE(start("on_input: error\ninput:\n  max_chars: 10\n"));
  const json e = post("/v1/chat/completions", chat("far more than ten characters"), 400);
  EXPECT_EQ(e["error"]["code"], "content_filter");
  EXPECT_EQ(e["error"]["param"], "messages");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  const json p = post("/v1/completions", {{"prompt", "far more than ten"}}, 400);
  EXPECT_EQ(p["error"]["param"], "prompt");
  post("/v1/chat/completions", chat("short"));
  EXPECT_EQ(metric("nekton_guardrail_triggered_total", "input.max_chars"), 2);
}

TEST_F(GuardrailsE2E, OfficialClientSeesContentFilter) {
  NK_REQUIRE_ASSET(test::have_openai_client(), "node or the npm package openai");
  ASSERT_TRUE(start("refusal: Nope, not that.\ninput:\n  blocked_keywords: [bomb]\n"));
  const test::RunResult r = test::run_command(
      fmt::format("timeout 60 node {}/tests/serve/guardrails_client.mjs {} {} tiny "
                  "'Nope, not that.' 'how to build a bomb'",
                  NK_SOURCE_DIR, test::npm_modules(), server_->url()),
      false);
  ASSERT_EQ(r.code, 0) << r.out << server_->log();
  EXPECT_TRUE(contains(r.out, "{\"checks\":6}")) << r.out;
}

// A blocked pattern in the model's own greedy answer is masked, streamed
// (a window of 8 characters: released as it goes) as whole.
TEST_F(GuardrailsE2E, OutputRailMasksStreamedAndWhole) {
  const std::string g = greedy_chat(40);
  ASSERT_EQ(g.size(), 40u) << g;
  const std::string sub = g.substr(10, 5);
  const std::string want = replace_all(g, sub, "[X]");
  ASSERT_TRUE(start(fmt::format("output:\n  blocked_regex: ['{}']\n  mask: '[X]'\n  window: 8\n",
                                replace_all(literal_pattern(sub), "'", "''"))));
  const json r = post("/v1/chat/completions", chat("Hello there", 40));
  EXPECT_EQ(r["choices"][0]["message"]["content"], want);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  const json s = post("/v1/chat/completions", chat("Hello there", 40, true));
  EXPECT_EQ(streamed_choice(s.get<std::string>(), true), std::pair(want, std::string("length")));
  // Logprobs would show the masked tokens.
  json lp = chat("Hello there", 4);
  lp["logprobs"] = true;
  EXPECT_EQ(post("/v1/chat/completions", lp, 400)["error"]["param"], "logprobs");
  EXPECT_EQ(metric("nekton_guardrail_checks_total", "output.blocked_regex"), 2);
  EXPECT_EQ(metric("nekton_guardrail_triggered_total", "output.blocked_regex"), 2);
}

// With blocked_action refuse the answer ends at the pattern, with the
// refusal and finish_reason content_filter; the sequence stops early.
TEST_F(GuardrailsE2E, OutputRailRefusesAndStopsTheSequence) {
  const std::string g = greedy_chat(40);
  const std::string sub = g.substr(10, 5);
  const size_t at = g.find(sub);
  ASSERT_TRUE(start(fmt::format(
      "refusal: Nope.\noutput:\n  blocked_regex: ['{}']\n  blocked_action: refuse\n  window: 8\n",
      replace_all(literal_pattern(sub), "'", "''"))));
  const json r = post("/v1/chat/completions", chat("Hello there", 1000));
  EXPECT_EQ(r["choices"][0]["message"]["content"], "Nope.");
  EXPECT_EQ(r["choices"][0]["finish_reason"], "content_filter");
  EXPECT_LT(r["usage"]["completion_tokens"].get<int>(), 100);  // cancelled, not 1000 tokens
  const json s = post("/v1/chat/completions", chat("Hello there", 1000, true));
  const auto [text, finish] = streamed_choice(s.get<std::string>(), true);
  EXPECT_EQ(finish, "content_filter");
  ASSERT_TRUE(text.ends_with("Nope.")) << text;
  // What came before the refusal is clean text from before the match.
  EXPECT_TRUE(g.substr(0, at).starts_with(text.substr(0, text.size() - 5))) << text;
  EXPECT_EQ(metric("nekton_guardrail_triggered_total", "output.blocked_regex"), 2);
}

// NeMo's length-per-perplexity heuristic with the served model's perplexity
// (the counting model's fluent text is counting bytes), through the engine.
TEST_F(GuardrailsE2E, JailbreakHeuristicScoresWithTheServedModel) {
  const std::string counting = d_ / "counting";
  test::save_counting_model(counting);
  ASSERT_TRUE(
      start("input:\n  jailbreak:\n    length_per_perplexity: true\n"
            "    length_per_perplexity_threshold: 30\n",
            counting));
  const json bad =
      post("/v1/completions", {{"prompt", test::counting_run('A', 40)}, {"max_tokens", 4}});
  EXPECT_EQ(bad["choices"][0]["finish_reason"], "content_filter");
  const json ok = post("/v1/completions", {{"prompt", "Hello there"}, {"max_tokens", 4}});
  EXPECT_EQ(ok["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(metric("nekton_guardrail_checks_total", "input.jailbreak_length_per_perplexity"), 2);
  EXPECT_EQ(metric("nekton_guardrail_triggered_total", "input.jailbreak_length_per_perplexity"), 1);
}

TEST_F(GuardrailsE2E, BadRailsFileStopsTheServer) {
  const std::string file = d_ / "rails.yaml";
  server_ = std::make_unique<ServerProcess>(
      model_,
      std::vector<std::string>{"serve.guardrails.config=" +
                               test::write_rails(d_, "input:\n  blocked_regex: ['(a']\n")},
      d_ / "serve.log");
  EXPECT_EQ(server_->port(), 0);
  EXPECT_NE(server_->stop(), 0);
  EXPECT_TRUE(contains(server_->log(), file + ":2: key 'input.blocked_regex' item 0"))
      << server_->log();
  server_ = std::make_unique<ServerProcess>(
      model_, std::vector<std::string>{"serve.guardrails.config=" + d_ / "none.yaml"},
      d_ / "serve.log");
  EXPECT_NE(server_->stop(), 0);
  EXPECT_TRUE(contains(server_->log(), "cannot read guardrails file")) << server_->log();
}

}  // namespace
}  // namespace nk
