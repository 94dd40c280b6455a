// `nekton serve` end to end: the built binary on a free port over a tiny
// model, driven by OpenAI's official JavaScript client (openai_client.mjs)
// and, for malformed requests no client would send, by httplib's client.
// Each test starts its own server and kills it on every path.
#include <gtest/gtest.h>
#include <httplib.h>

#include <optional>
#include <regex>
#include <thread>

#include "data/utf8.h"
#include "serve_test_util.h"
#include "test_paths.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::ServerProcess;

class ServeE2E : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = d_ / "tiny";
    test::save_ascii_model(model_);
  }
  // Starts the server; fails the test (and returns false) when it does not come up.
  bool start(const std::vector<std::string>& extra = {}, const std::string& model = "") {
    server_ =
        std::make_unique<ServerProcess>(model.empty() ? model_ : model, extra, d_ / "serve.log");
    EXPECT_GT(server_->port(), 0) << server_->log();
    return server_->port() > 0;
  }
  httplib::Client client() const { return server_->client(); }
  // The greedy continuation `nekton generate` gives for `prompt`.
  std::string generate(const std::string& prompt, int max_tokens) {
    return test::greedy_generate(model_, d_.path().string(), prompt, max_tokens);
  }
  // The value of an unlabelled sample of /metrics, or -1 when absent.
  double metric(const std::string& name) {
    auto r = client().Get("/metrics");
    if (!r || r->status != 200) return -1;
    std::smatch m;
    if (!std::regex_search(r->body, m, std::regex("\n" + name + " ([0-9.e+-]+)\n"))) return -1;
    return std::stod(m[1]);
  }

  test::TempDir d_{"nk_serve"};
  std::string model_;
  std::unique_ptr<ServerProcess> server_;
};

TEST_F(ServeE2E, OfficialClientAgreesWithGenerate) {
  NK_REQUIRE_ASSET(test::have_openai_client(), "node or the npm package openai");
  ASSERT_TRUE(start());
  EXPECT_TRUE(contains(server_->log(), "(model tiny,")) << server_->log();
  EXPECT_TRUE(contains(server_->log(), "chat template chatml")) << server_->log();
  const json out = test::run_openai_client(*server_, "tiny", "api");
  ASSERT_TRUE(out.is_object());
  EXPECT_GE(out["checks"].get<int>(), 70) << out.dump();
  // Greedy output is `nekton generate`'s for the same prompt: the completion
  // prompt as is, the chat prompt as chatml renders it.
  EXPECT_EQ(out["completion"], generate("The quick brown fox", 8));
  const std::string chat_prompt =
      "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\n";
  EXPECT_EQ(out["chat"], generate(chat_prompt, 8));
  // One log line per request, with its token counts.
  EXPECT_TRUE(std::regex_search(
      server_->log(),
      std::regex(R"(POST /v1/completions 200 prompt_tokens=19 completion_tokens=8 )")))
      << server_->log();
  EXPECT_EQ(server_->stop(SIGTERM), 0) << server_->log();
  EXPECT_TRUE(contains(server_->log(), "nekton serve: stopped")) << server_->log();
}

// vLLM's continue_final_message: the assistant's turn the client opened is
// continued, not closed: the answer is `nekton generate`'s after the
// conversation rendered and cut after "Sure:", /tokenize gives that prompt's
// ids, and both flags at once are refused naming the parameter.
TEST_F(ServeE2E, ContinueFinalMessageGoesOnWithTheAssistantsTurn) {
  ASSERT_TRUE(start());
  auto cli = client();
  const json messages = json::array({{{"role", "user"}, {"content", "Hello there"}},
                                     {{"role", "assistant"}, {"content", "Sure:"}}});
  const std::string prompt =
      "<|im_start|>user\nHello there<|im_end|>\n<|im_start|>assistant\nSure:";
  auto r = cli.Post("/v1/chat/completions",
                    json{{"messages", messages},
                         {"add_generation_prompt", false},
                         {"continue_final_message", true},
                         {"max_tokens", 8},
                         {"temperature", 0}}
                        .dump(),
                    "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"], generate(prompt, 8));
  auto t = cli.Post("/tokenize",
                    json{{"messages", messages},
                         {"add_generation_prompt", false},
                         {"continue_final_message", true}}
                        .dump(),
                    "application/json");
  ASSERT_TRUE(t);
  ASSERT_EQ(t->status, 200) << t->body;
  auto d = cli.Post("/detokenize", json{{"tokens", json::parse(t->body)["tokens"]}}.dump(),
                    "application/json");
  ASSERT_TRUE(d);
  EXPECT_EQ(json::parse(d->body)["prompt"], prompt);
  auto both = cli.Post("/v1/chat/completions",
                       json{{"messages", messages}, {"continue_final_message", true}}.dump(),
                       "application/json");
  ASSERT_TRUE(both);
  EXPECT_EQ(both->status, 400);
  EXPECT_EQ(json::parse(both->body)["error"]["param"], "continue_final_message") << both->body;
}

// Every malformed request gets OpenAI's error shape and status, and the
// server answers /health after each.
TEST_F(ServeE2E, BadRequestsGetOpenAIErrors) {
  ASSERT_TRUE(start({"serve.max_body_mb=1", "serve.max_model_len=256"}));
  auto cli = client();
  struct Case {
    const char* what;
    const char* method;
    const char* path;
    std::string body;
    int status;
    json param;              // null: OpenAI's null
    const char* in_message;  // a part of the message
  };
  const std::string chat = R"({"messages": [{"role": "user", "content": "hi"}], )";
  const std::vector<Case> cases = {
      {"malformed JSON", "POST", "/v1/chat/completions", "{\"messages\": [", 400, nullptr,
       "not valid JSON"},
      {"not an object", "POST", "/v1/completions", "[1, 2]", 400, nullptr, "JSON object"},
      {"wrong type", "POST", "/v1/chat/completions", chat + R"("max_tokens": "ten"})", 400,
       "max_tokens", "expected an integer, but got a string"},
      {"wrong type in a message", "POST", "/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": 5}]})", 400, "messages[0].content",
       "got an integer"},
      {"unknown model", "POST", "/v1/chat/completions", chat + R"("model": "gpt-4o"})", 404,
       "model", "gpt-4o"},
      {"max_tokens over the context", "POST", "/v1/completions",
       R"({"prompt": "abcd", "max_tokens": 300})", 400, "max_tokens", "256"},
      {"prompt over the context", "POST", "/v1/completions",
       json{{"prompt", std::string(300, 'a')}}.dump(), 400, "prompt", "300"},
      {"empty messages", "POST", "/v1/chat/completions", R"({"messages": []})", 400, "messages",
       "non-empty"},
      {"missing messages", "POST", "/v1/chat/completions", R"({"max_tokens": 3})", 400, "messages",
       "missing"},
      {"invalid UTF-8", "POST", "/v1/chat/completions",
       "{\"messages\": [{\"role\": \"user\", \"content\": \"a\xff\xfe\"}]}", 400, nullptr, "UTF-8"},
      {"lone surrogate", "POST", "/v1/completions", R"({"prompt": "\ud800"})", 400, nullptr,
       "UTF-8"},
      {"temperature out of range", "POST", "/v1/completions",
       R"({"prompt": "a", "temperature": 2.5})", 400, "temperature", "[0, 2]"},
      {"top_p out of range", "POST", "/v1/completions", R"({"prompt": "a", "top_p": 0})", 400,
       "top_p", "top_p"},
      {"n out of range", "POST", "/v1/completions", R"({"prompt": "a", "n": 0})", 400, "n", "'n'"},
      {"too many stops", "POST", "/v1/completions",
       R"({"prompt": "a", "stop": ["1", "2", "3", "4", "5"]})", 400, "stop", "at most 4"},
      {"token id outside the vocabulary", "POST", "/v1/completions", R"({"prompt": [1, 999]})", 400,
       "prompt", "vocabulary"},
      {"unknown field", "POST", "/v1/completions", R"({"prompt": "a", "best_off": 2})", 400,
       "best_off", "Unrecognized"},
      {"malformed tools", "POST", "/v1/chat/completions",
       chat + R"("tools": [{"type": "function"}]})", 400, "tools[0].function", "function"},
      {"unsupported field", "POST", "/v1/chat/completions", chat + R"("tool_choice": "required"})",
       400, "tool_choice", "not supported"},
      {"unknown route", "GET", "/v1/nothing", "", 404, nullptr, "/v1/nothing"},
      {"wrong method", "GET", "/v1/completions", "", 405, nullptr, "POST"},
      {"detokenize outside the vocabulary", "POST", "/detokenize", R"({"tokens": [65, 300]})", 400,
       "tokens[1]", "vocabulary"},
      {"body over serve.max_body_mb", "POST", "/v1/completions",
       json{{"prompt", std::string(1536 * 1024, 'a')}}.dump(), 413, nullptr, "max_body_mb"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    auto r = std::string(c.method) == "GET" ? cli.Get(c.path)
                                            : cli.Post(c.path, c.body, "application/json");
    ASSERT_TRUE(r) << httplib::to_string(r.error());
    EXPECT_EQ(r->status, c.status) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    const json& e = j["error"];
    EXPECT_TRUE(e["message"].is_string() && contains(e["message"], c.in_message)) << r->body;
    EXPECT_EQ(e["type"], "invalid_request_error") << r->body;
    EXPECT_EQ(e["param"], c.param) << r->body;
    EXPECT_TRUE(e.contains("code")) << r->body;
    auto h = client().Get("/health");
    ASSERT_TRUE(h) << "the server is gone after: " << c.what;
    EXPECT_EQ(h->status, 200);
    EXPECT_EQ(json::parse(h->body), json({{"status", "ok"}}));
  }
  // The requests are counted by endpoint and status, once their response is
  // written (the count may lag the client by a moment: wait up to 5 s).
  const std::string c400 =
      R"(nekton_requests_total{endpoint="/v1/chat/completions",status="400"} 8)";
  const std::string c413 = R"(nekton_requests_total{endpoint="/v1/completions",status="413"} 1)";
  std::string text;
  for (int i = 0; i < 500 && !(contains(text, c400) && contains(text, c413)); ++i) {
    if (i) ::usleep(10000);
    auto m = cli.Get("/metrics");
    ASSERT_TRUE(m);
    text = m->body;
  }
  EXPECT_TRUE(contains(text, c400)) << text;
  EXPECT_TRUE(contains(text, c413)) << text;
  // After all that it still generates, tokenizes and detokenizes.
  auto ok = cli.Post("/v1/completions", R"({"prompt": "abc", "max_tokens": 3, "temperature": 0})",
                     "application/json");
  ASSERT_TRUE(ok);
  EXPECT_EQ(ok->status, 200) << ok->body;
  EXPECT_EQ(json::parse(ok->body)["usage"]["completion_tokens"], 3);
  auto t = cli.Post("/tokenize", R"({"prompt": "héllo"})", "application/json");
  ASSERT_TRUE(t);
  const json tj = json::parse(t->body);
  EXPECT_EQ(tj["count"], 6);
  auto d = cli.Post("/detokenize", json{{"tokens", tj["tokens"]}}.dump(), "application/json");
  ASSERT_TRUE(d);
  EXPECT_EQ(json::parse(d->body)["prompt"], "héllo");
  auto models = cli.Get("/v1/models");
  ASSERT_TRUE(models);
  EXPECT_EQ(json::parse(models->body)["data"][0]["max_model_len"], 256);
  auto one = cli.Get("/v1/models/tiny");
  ASSERT_TRUE(one);
  EXPECT_EQ(json::parse(one->body)["id"], "tiny");
  auto other = cli.Get("/v1/models/gpt-4o");
  ASSERT_TRUE(other);
  EXPECT_EQ(other->status, 404);
  EXPECT_EQ(json::parse(other->body)["error"]["code"], "model_not_found");
}

// 64 concurrent streams all complete (greedy ones with the text of a
// request alone), and a client that aborts mid-stream frees its sequence.
TEST_F(ServeE2E, ConcurrentStreamsAndDisconnect) {
  NK_REQUIRE_ASSET(test::have_openai_client(), "node or the npm package openai");
  ASSERT_TRUE(start({"serve.max_batch=8"}));
  const json load = test::run_openai_client(*server_, "tiny", "load");
  ASSERT_TRUE(load.is_object());
  EXPECT_EQ(load["streams"], 64);
  EXPECT_EQ(load["errors"], 0);
  EXPECT_EQ(metric("nekton_requests_cancelled_total"), 0);

  const json aborted = test::run_openai_client(*server_, "tiny", "abort");
  ASSERT_TRUE(aborted.is_object());
  // The sequence (1900 tokens to go) is cancelled at the next write, well
  // before it could have finished; poll for it, at most 20 s.
  double running = -1, cancelled = -1, kv = -1;
  for (int i = 0; i < 200; ++i) {
    running = metric("nekton_num_requests_running");
    cancelled = metric("nekton_requests_cancelled_total");
    kv = metric("nekton_kv_blocks_used");
    if (running == 0 && cancelled == 1 && kv == 0) break;
    ::usleep(100000);
  }
  EXPECT_EQ(running, 0);
  EXPECT_EQ(cancelled, 1);
  EXPECT_EQ(kv, 0);
  // The default pool: serve.max_batch sequences of 2048 positions in blocks of 16.
  EXPECT_EQ(metric("nekton_kv_blocks_total"), 8 * 2048 / 16);
  // Far fewer than 1900 tokens were generated for it.
  const double generated = metric("nekton_generation_tokens_total");
  EXPECT_LT(generated, 64 * 16 + 1 + 1000) << "the aborted sequence ran on";
  EXPECT_GE(metric("nekton_time_to_first_token_seconds_count"), 65);
}

// SIGTERM: new requests get 503 while the one in flight runs to its end,
// then the server exits 0.
TEST_F(ServeE2E, SigtermFinishesRequestsInFlight) {
  ASSERT_TRUE(start());
  std::optional<httplib::Result> long_one;
  std::thread t([&] {
    long_one = client().Post("/v1/completions",
                             R"({"prompt": "abc", "max_tokens": 2000, "temperature": 0})",
                             "application/json");
  });
  double running = 0;
  for (int i = 0; i < 500 && running != 1; ++i) {
    running = metric("nekton_num_requests_running");
    if (running != 1) ::usleep(10000);
  }
  EXPECT_EQ(running, 1);
  server_->signal(SIGTERM);
  int health = 200;
  for (int i = 0; i < 500 && health == 200; ++i) {
    auto h = client().Get("/health");
    health = h ? h->status : -1;
    if (health == 200) ::usleep(10000);
  }
  EXPECT_EQ(health, 503) << "not draining";
  t.join();
  ASSERT_TRUE(long_one && *long_one) << httplib::to_string(long_one->error());
  const httplib::Response& res = **long_one;
  EXPECT_EQ(res.status, 200) << res.body;
  EXPECT_EQ(json::parse(res.body)["usage"]["completion_tokens"], 2000);
  EXPECT_EQ(server_->stop(SIGTERM), 0) << server_->log();
  EXPECT_TRUE(contains(server_->log(), "finishing 1 requests in flight")) << server_->log();
}

TEST_F(ServeE2E, WithoutChatTemplateChatIsRefusedAndCompletionsWork) {
  const std::string bare = d_ / "bare";
  test::save_ascii_model(bare, 128, false);
  ASSERT_TRUE(start({}, bare));
  EXPECT_TRUE(contains(server_->log(), "no chat template")) << server_->log();
  auto cli = client();
  auto r = cli.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "hi"}]})",
                    "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 400);
  EXPECT_TRUE(contains(r->body, "serve.chat_template=NAME") && contains(r->body, "chatml"))
      << r->body;
  r = cli.Post("/v1/completions", R"({"prompt": "hi", "max_tokens": 4})", "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["finish_reason"], "length");
  server_.reset();
  // Naming a template that does not exist is a start-up error.
  const auto bad =
      test::run_nekton("serve serve.model=" + bare + " serve.port=0 serve.chat_template=nope");
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(contains(bad.out, "serve.chat_template") && contains(bad.out, "chatml")) << bad.out;
}

// A GGUF file served directly (ckpt/gguf_import.h): its tokenizer and chat
// template come with it (the export writes the folder's), its q8_0 blocks
// are multiplied as they are, and a greedy completion equals `nekton
// generate` on the same file. A folder quantised as it loads
// (serve.quantize) serves too; a quantize key with a GGUF is refused.
TEST_F(ServeE2E, GgufFileAndQuantisedFolder) {
  const std::string dir = d_ / "llama";
  {
    ModelConfig c = model_preset("llama-tiny");  // bytes vocabulary, d_model 64
    Transformer m(c, DType::F32, 5);
    save_model(dir, m);
    store_tokenizer("bytes", dir);
    test::write_file(dir + "/tokenizer_config.json",
                     json{{"chat_template", find_chat_template("chatml").jinja()}}.dump());
  }
  const std::string gguf = d_ / "llama-q8_0.gguf";
  auto q = test::run_nekton(fmt::format("quantize {} {} --type q8_0", dir, gguf));
  ASSERT_EQ(q.code, 0) << q.out;
  const auto gen = test::run_nekton(
      fmt::format("generate generate.model={} generate.prompt=Water generate.temperature=0 "
                  "generate.max_tokens=12 generate.ignore_eos=true",
                  gguf),
      false);
  ASSERT_EQ(gen.code, 0) << gen.out;
  ASSERT_TRUE(start({}, gguf));
  EXPECT_TRUE(contains(server_->log(), "chat template chatml")) << server_->log();
  auto cli = client();
  auto r =
      cli.Post("/v1/completions",
               R"({"prompt": "Water", "max_tokens": 12, "temperature": 0, "ignore_eos": true})",
               "application/json");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  // The server's text is JSON: invalid UTF-8 comes as U+FFFD.
  EXPECT_EQ("Water" + json::parse(r->body)["choices"][0]["text"].get<std::string>() + "\n",
            replace_invalid_utf8(gen.out));
  r = cli.Post("/v1/chat/completions",
               R"({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})",
               "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  server_.reset();
  // A log of its own: start() would read the first server's port from the old one.
  server_ = std::make_unique<ServerProcess>(dir, std::vector<std::string>{"serve.quantize=w8a8"},
                                            d_ / "serve_w8a8.log");
  ASSERT_GT(server_->port(), 0) << server_->log();
  r = client().Post("/v1/completions", R"({"prompt": "Water", "max_tokens": 4})",
                    "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  server_.reset();
  const auto bad =
      test::run_nekton("serve serve.model=" + gguf + " serve.port=0 serve.quantize=w8a8");
  EXPECT_EQ(bad.code, 1);
  EXPECT_TRUE(contains(bad.out, "serve.quantize")) << bad.out;
}

TEST_F(ServeE2E, HelpListsEveryKey) {
  const auto r = test::run_nekton("serve --help");
  EXPECT_EQ(r.code, 0);
  for (const char* key :
       {"serve.model", "serve.adapter", "serve.tokenizer", "serve.dtype", "serve.host",
        "serve.port", "serve.model_name", "serve.chat_template", "serve.max_batch",
        "serve.prefill_chunk", "serve.max_model_len", "serve.max_body_mb", "serve.max_connections",
        "serve.default_max_tokens", "serve.block_size", "serve.kv_memory_mb"})
    EXPECT_TRUE(contains(r.out, key)) << key;
  // configs/serve.yaml holds only valid keys: what fails is the model folder.
  const auto cfg = test::run_nekton(std::string("serve --config ") + NK_SOURCE_DIR +
                                    "/configs/serve.yaml --model /nonexistent serve.port=0");
  EXPECT_EQ(cfg.code, 1);
  EXPECT_TRUE(contains(cfg.out, "/nonexistent/config.json")) << cfg.out;
  EXPECT_FALSE(contains(cfg.out, "chat template")) << cfg.out;
  const auto typo = test::run_nekton("serve serve.model=x serve.max_batchh=3");
  EXPECT_EQ(typo.code, 1);
  EXPECT_TRUE(contains(typo.out, "did you mean 'serve.max_batch'")) << typo.out;
  const auto none = test::run_nekton("serve serve.port=0");
  EXPECT_EQ(none.code, 1);
  EXPECT_TRUE(contains(none.out, "serve.model")) << none.out;
}

}  // namespace
}  // namespace nk
