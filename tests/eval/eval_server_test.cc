// `nekton eval tasks` with eval.model=URL against `nekton serve` of a model
// folder gives what the folder gives: a multiple_choice task (acc, acc_norm,
// acc_mutual_info: contexts scored by the server's echoed prompt
// log-probabilities, the empty context as eval.prefix_text), LAMBADA
// (loglikelihood: perplexity, greedy acc), WikiText (loglikelihood_rolling:
// word and byte perplexity, bits per byte) on a random Llama, and a
// generate_until task (stop strings, exact_match) on the counting model,
// greedy and sampled (do_sample with repeats: the server's seeded n
// choices are the folder's seeded repeats). Every per-document
// log-likelihood within 1e-5, every greedy flag and answer equal, every
// metric within 1e-5 relative. Then the errors: a refused connection, a
// server answering 500 or a body that is not JSON, an empty context
// without eval.prefix_text; each names the URL (or the key) and exits
// non-zero.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "eval_tasks_fixture.h"
#include "serve/serve_test_util.h"

namespace nk {
namespace {

using Json = nlohmann::ordered_json;
using test::contains;
using test::run_nekton;

std::vector<Json> read_jsonl(const std::string& path) {
  std::vector<Json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(Json::parse(line));
  return out;
}

class EvalServer : public EvalTaskFolders {
 protected:
  EvalServer() : EvalTaskFolders("nk_evalserver", 256, 5) {}

  test::RunResult eval(const std::string& model, const std::string& tasks, const std::string& out,
                       const std::string& extra = "") {
    return run_nekton(fmt::format(
        "eval tasks eval.model={} eval.tasks={} eval.data={} eval.output={} eval.write_out=1000 "
        "eval.batch_size=3 eval.bootstrap_iters=200 eval.timeout_s=60 {}",
        model, tasks, data_, out, extra));
  }
  // Local and server runs: the same documents, answers and metrics.
  void expect_same(const std::string& local, const std::string& served, int numbers) {
    const Json a = Json::parse(test::read_file(local)), b = Json::parse(test::read_file(served));
    ASSERT_EQ(a["results"].size(), b["results"].size());
    int compared = 0;
    for (auto t = a["results"].begin(); t != a["results"].end(); ++t) {
      const Json& bt = b["results"][t.key()];
      for (auto m = t.value().begin(); m != t.value().end(); ++m) {
        if (!m.value().is_number()) {
          EXPECT_EQ(m.value(), bt[m.key()]) << t.key() << " " << m.key();
          continue;
        }
        const double x = m.value().get<double>(), y = bt[m.key()].get<double>();
        EXPECT_NEAR(x, y, 1e-5 * std::max(1.0, std::abs(x))) << t.key() << " " << m.key();
        ++compared;
      }
    }
    EXPECT_EQ(compared, numbers);
    const std::vector<Json> sa = read_jsonl(local + ".samples.jsonl"),
                            sb = read_jsonl(served + ".samples.jsonl");
    ASSERT_EQ(sa.size(), sb.size());
    double worst = 0;  // largest log-likelihood difference
    for (size_t i = 0; i < sa.size(); ++i) {
      const Json &ra = sa[i]["resps"], &rb = sb[i]["resps"];
      ASSERT_EQ(ra.size(), rb.size()) << sa[i].dump();
      EXPECT_EQ(sa[i]["arguments"], sb[i]["arguments"]);
      for (size_t k = 0; k < ra.size(); ++k) {
        // Log-likelihoods are f32 sums over a document's tokens (-732 for a
        // rolling window): relative to their size, as the metrics above.
        const auto tol = [](double v) { return 1e-5 * std::max(1.0, std::abs(v)); };
        if (ra[k].is_array()) {  // (loglik, greedy)
          EXPECT_NEAR(ra[k][0].get<double>(), rb[k][0].get<double>(), tol(ra[k][0].get<double>()))
              << sa[i].dump();
          worst = std::max(worst, std::abs(ra[k][0].get<double>() - rb[k][0].get<double>()));
          EXPECT_EQ(ra[k][1], rb[k][1]) << sa[i].dump();
        } else if (ra[k].is_number()) {
          EXPECT_NEAR(ra[k].get<double>(), rb[k].get<double>(), tol(ra[k].get<double>()))
              << sa[i].dump();
          worst = std::max(worst, std::abs(ra[k].get<double>() - rb[k].get<double>()));
        } else {
          EXPECT_EQ(ra[k], rb[k]) << sa[i].dump();
        }
      }
      EXPECT_EQ(sa[i].value("filtered_resps", Json()), sb[i].value("filtered_resps", Json()));
    }
    std::cout << sa.size()
              << " documents; largest log-likelihood difference, folder vs server: " << worst
              << "\n";
  }

  // The tasks evaluated on the model folder and through `nekton serve` of
  // it, compared by expect_same; returns the server's log.
  std::string folder_and_server(const std::string& model, const std::string& tasks, int numbers,
                                const std::string& extra = "") {
    const std::string local = d_ / "local.json", served = d_ / "served.json";
    test::RunResult r = eval(model, tasks, local);
    EXPECT_EQ(r.code, 0) << r.out;
    test::ServerProcess server(model, {}, d_ / "serve.log");
    EXPECT_GT(server.port(), 0) << server.log();
    r = eval(server.url() + "/v1", tasks, served, extra);
    EXPECT_EQ(r.code, 0) << r.out << server.log();
    if (r.code == 0) expect_same(local, served, numbers);
    return server.log();
  }
};

TEST_F(EvalServer, LoglikelihoodTasksMatchTheModelFolder) {
  std::vector<Json> mc, lam, wiki;
  for (int i = 0; i < 10; ++i) {
    mc.push_back({{"q", words(4) + "  "},
                  {"choices", {words(1), words(2), words(1 + int(rng_() % 3))}},
                  {"label", int(rng_() % 3)}});
    lam.push_back({{"text", words(4 + int(rng_() % 5))}});
    wiki.push_back({{"page", words(8 + int(rng_() % 20))}});
  }
  write_split("mc", "test", mc);
  write_split("lambada_openai", "test", lam);
  write_split("wikitext", "test", wiki);
  const std::string y = yaml("mc", R"Y(task: mc
output_type: multiple_choice
test_split: test
doc_to_text: "Q: {{q}}"
doc_to_target: label
doc_to_choice: choices
metric_list:
  - metric: acc
  - metric: acc_norm
  - metric: acc_mutual_info
)Y");
  // acc, acc_norm, acc_mutual_info, perplexity, acc (each with its stderr),
  // three rolling metrics.
  const std::string log = folder_and_server(random_, y + ",lambada_openai,wikitext", 13,
                                            "'eval.prefix_text=<|endoftext|>'");
  // The requests were batched: 10 documents x 3 choices x 2 (mutual
  // information) in 3-prompt requests, and one request per 3 texts.
  size_t requests = 0;
  for (size_t at = 0; (at = log.find("/v1/completions 200", at)) != std::string::npos; ++at)
    ++requests;
  EXPECT_EQ(requests, size_t(20 + 4 + 4)) << log;
}

TEST_F(EvalServer, GenerateUntilMatchesTheModelFolder) {
  write_split("counting", "test",
              {{{"q", "count from /"}, {"a", "01234"}},
               {{"q", "letters @"}, {"a", "abcdefgh"}},
               {{"q", "numbers ,"}, {"a", "-./01234"}},
               {{"q", "from 1"}, {"a", "999"}},
               {{"q", "late +"}, {"a", ",-./01"}}});
  write_split("counting", "train", {{{"q", "shot ("}, {"a", ")*+"}}, {{"q", "x 7"}, {"a", "89"}}});
  const std::string y = yaml("counting", R"Y(task: counting
output_type: generate_until
training_split: train
test_split: test
num_fewshot: 1
doc_to_text: "{{q}}"
doc_to_target: "{{a}}"
generation_kwargs:
  until: ["5", "Q:"]
  max_gen_toks: 8
metric_list:
  - metric: exact_match
    ignore_case: true
filter_list:
  - name: raw
    filter:
      - function: take_first
  - name: digits
    filter:
      - function: regex
        regex_pattern: "([0-9]+)"
      - function: take_first
)Y");
  folder_and_server(counting_, y, 4);  // exact_match and its stderr, two filters
  const Json res = Json::parse(test::read_file(d_ / "served.json"))["results"]["counting"];
  EXPECT_GT(res["exact_match,raw"].get<double>(), 0) << res.dump();
}

// Sampled answers (do_sample with temperature, top_p and top_k, repeats 4,
// a vote) on the random Llama: the server seeds a request's n choices as
// the folder seeds a document's repeats, so the answers are the same bytes.
TEST_F(EvalServer, SampledRepeatsMatchTheModelFolder) {
  std::vector<Json> docs;
  for (int i = 0; i < 6; ++i) docs.push_back({{"q", words(3)}, {"a", words(1)}});
  write_split("sampled", "test", docs);
  const std::string y = yaml("sampled", R"Y(task: sampled
output_type: generate_until
test_split: test
doc_to_text: "{{q}}"
doc_to_target: "{{a}}"
repeats: 4
generation_kwargs:
  until: ["Q:"]
  max_gen_toks: 3
  do_sample: true
  temperature: 1.5
  top_p: 0.9
  top_k: 20
filter_list:
  - name: first
    filter:
      - function: take_first
  - name: maj
    filter:
      - function: majority_vote
)Y");
  folder_and_server(random_, y, 4);  // exact_match and its stderr, two filters
  size_t mixed = 0;                  // documents whose answers differ: they were sampled
  for (const Json& s : read_jsonl(d_ / "local.json.samples.jsonl"))
    mixed += s["resps"][0] != s["resps"][1] || s["resps"][0] != s["resps"][2];
  EXPECT_GT(mixed, 0u);
}

// A port nothing listens on (bound, then closed).
int closed_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TEST_F(EvalServer, ServerFailuresNameTheUrl) {
  write_split("piqa", "validation", {{{"goal", "g"}, {"sol1", "a"}, {"sol2", "b"}, {"label", 0}}});
  const std::string out = d_ / "out.json";
  const std::string refused = fmt::format("http://127.0.0.1:{}", closed_port());
  test::RunResult r = eval(refused, "piqa", out);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, refused + "/v1/completions") && contains(r.out, "connecting"))
      << r.out;

  // A server that answers 500, then one whose body is not JSON.
  httplib::Server fake;
  std::atomic<int> status{500};
  fake.Post("/v1/completions", [&](const httplib::Request&, httplib::Response& res) {
    res.status = status;
    res.set_content(status == 500 ? R"({"error": "boom"})" : "<html>", "application/json");
  });
  const int port = fake.bind_to_any_port("127.0.0.1");
  std::thread t([&] { fake.listen_after_bind(); });
  const std::string url = fmt::format("http://127.0.0.1:{}/v1", port);
  r = eval(url, "piqa", out);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, url + "/completions") && contains(r.out, "HTTP status 500") &&
              contains(r.out, "boom"))
      << r.out;
  status = 200;
  r = eval(url, "piqa", out);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, url + "/completions") && contains(r.out, "not JSON")) << r.out;
  fake.stop();
  t.join();
  EXPECT_FALSE(std::filesystem::exists(out));

  // An empty context (rolling log-likelihood) needs the prefix token's text.
  write_split("wikitext", "test", {{{"page", "some text"}}});
  r = eval(url, "wikitext", out);
  EXPECT_EQ(r.code, 1);
  EXPECT_TRUE(contains(r.out, "eval.prefix_text") && contains(r.out, url)) << r.out;
}

}  // namespace
}  // namespace nk
