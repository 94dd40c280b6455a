// `nekton serve` with SteerLM's steerlm_attributes: a chat or completion
// request conditioned on attribute values is answered exactly as the same
// request with the label string written in by hand (the model folder's
// steerlm.json giving order, range and template), and bad values are a 400
// naming the field.
#include <gtest/gtest.h>
#include <httplib.h>

#include "align/steerlm.h"
#include "serve_test_util.h"

namespace nk {
namespace {

using json = nlohmann::json;
using test::contains;
using test::ServerProcess;

const char* kValues = "verbosity:0,helpfulness:4,correctness:3,coherence:4,complexity:1";
const char* kLabel = "<extra_id_2>helpfulness:4,correctness:3,coherence:4,complexity:1,verbosity:0";

json post(httplib::Client& cli, const std::string& path, const json& body, int status = 200) {
  auto r = cli.Post(path, body.dump(), "application/json");
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, status) << r->body;
  return json::parse(r->body);
}

TEST(ServeSteerLm, ConditionedRequestsEqualTheLabelWrittenByHand) {
  test::TempDir d("nk_serve_steerlm");
  const std::string model = d / "model";
  test::save_ascii_model(model, 2048);
  SteerLmSpec spec;
  spec.names = helpsteer_attributes();
  spec.prompt_template = "<extra_id_2>{attributes}";
  test::write_file(model + "/steerlm.json", spec.to_json().dump());
  ServerProcess server(model, {}, d / "serve.log");
  ASSERT_GT(server.port(), 0) << server.log();
  auto cli = server.client();
  const json user = {{"role", "user"}, {"content", "Hello there"}};
  const json sys = {{"role", "system"}, {"content", "be kind"}};
  const json base = {{"max_tokens", 16}, {"temperature", 0}};
  struct Pair {
    json steered, by_hand;
  } chats[] = {
      {{{"messages", {user}}, {"steerlm_attributes", kValues}},
       {{"messages", {{{"role", "system"}, {"content", kLabel}}, user}}}},
      {{{"messages", {sys, user}}, {"steerlm_attributes", kValues}},
       {{"messages",
         {{{"role", "system"}, {"content", std::string(kLabel) + "\nbe kind"}}, user}}}},
  };
  for (Pair& p : chats) {
    p.steered.update(base);
    p.by_hand.update(base);
    const json a = post(cli, "/v1/chat/completions", p.steered);
    const json b = post(cli, "/v1/chat/completions", p.by_hand);
    EXPECT_EQ(a["choices"][0]["message"]["content"], b["choices"][0]["message"]["content"]);
    EXPECT_EQ(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);
    // Unconditioned, the prompt is the label's bytes shorter (bytes tokenizer).
    json plain = p.steered;
    plain.erase("steerlm_attributes");
    const json c = post(cli, "/v1/chat/completions", plain);
    EXPECT_LT(c["usage"]["prompt_tokens"].get<int>(), a["usage"]["prompt_tokens"].get<int>());
  }
  json steered = {{"prompt", "Q: colour?"}, {"steerlm_attributes", kValues}};
  json by_hand = {{"prompt", std::string(kLabel) + "\nQ: colour?"}};
  steered.update(base);
  by_hand.update(base);
  const json a = post(cli, "/v1/completions", steered), b = post(cli, "/v1/completions", by_hand);
  EXPECT_EQ(a["choices"][0]["text"], b["choices"][0]["text"]);
  EXPECT_EQ(a["usage"]["prompt_tokens"], b["usage"]["prompt_tokens"]);

  // Bad values: 400 naming steerlm_attributes.
  for (const auto& [values, message] : std::vector<std::pair<std::string, std::string>>{
           {"helpfulness:9,correctness:3,coherence:4,complexity:1,verbosity:0",
            "helpfulness: 9 is outside [0, 4]"},
           {"humor:1", "unknown attribute 'humor'"},
           {"helpfulness:4", "attribute 'correctness' has no value"}}) {
    json bad = {{"messages", {user}}, {"steerlm_attributes", values}};
    const json e = post(cli, "/v1/chat/completions", bad, 400);
    EXPECT_EQ(e["error"]["param"], "steerlm_attributes") << e;
    EXPECT_TRUE(contains(e["error"]["message"], message)) << e;
  }
  const json ids = post(cli, "/v1/completions",
                        {{"prompt", json::array({72, 105})}, {"steerlm_attributes", kValues}}, 400);
  EXPECT_EQ(ids["error"]["param"], "steerlm_attributes") << ids;
}

}  // namespace
}  // namespace nk
