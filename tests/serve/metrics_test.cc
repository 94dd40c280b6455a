// The Prometheus text format of /metrics (version 0.0.4).
#include "serve/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>
#include <sstream>
#include <thread>

#include "core/error.h"
#include "serve/serve_metrics.h"

namespace nk {
namespace {

TEST(Metrics, ValueText) {
  EXPECT_EQ(metric_value_text(0), "0");
  EXPECT_EQ(metric_value_text(3), "3");
  EXPECT_EQ(metric_value_text(-2), "-2");
  EXPECT_EQ(metric_value_text(0.25), "0.25");
  EXPECT_EQ(metric_value_text(1e-5), "1e-05");
  EXPECT_EQ(metric_value_text(INFINITY), "+Inf");
  EXPECT_EQ(metric_value_text(-INFINITY), "-Inf");
  EXPECT_EQ(metric_value_text(NAN), "NaN");
  EXPECT_EQ(escape_label_value("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
}

TEST(Metrics, CounterAndGauge) {
  MetricsRegistry reg;
  Counter& c = reg.add<Counter>("x_total", "Things done");
  Gauge& g = reg.add<Gauge>("y", "Level, with a \\ and a\nnewline");
  EXPECT_EQ(reg.render(),
            "# HELP x_total Things done\n# TYPE x_total counter\nx_total 0\n"
            "# HELP y Level, with a \\\\ and a\\nnewline\n# TYPE y gauge\ny 0\n");
  c.inc();
  c.inc(2.5);
  g.set(7);
  g.set(4);
  EXPECT_EQ(c.value(), 3.5);
  EXPECT_NE(reg.render().find("\nx_total 3.5\n"), std::string::npos);
  EXPECT_NE(reg.render().find("\ny 4\n"), std::string::npos);
  EXPECT_THROW(c.inc(-1), InternalError);
  EXPECT_THROW(reg.add<Counter>("not_a_counter", "x"), InternalError);
}

TEST(Metrics, Labels) {
  MetricsRegistry reg;
  Counter& c = reg.add<Counter>("req_total", "Requests", std::vector<std::string>{"path", "code"});
  // A labelled family shows only the label sets it has seen.
  EXPECT_EQ(reg.render(), "# HELP req_total Requests\n# TYPE req_total counter\n");
  c.inc(1, {{"path", "/a"}, {"code", "200"}});
  c.inc(1, {{"path", "/b\"x"}, {"code", "404"}});
  c.inc(1, {{"path", "/a"}, {"code", "200"}});
  EXPECT_EQ(reg.render(),
            "# HELP req_total Requests\n# TYPE req_total counter\n"
            "req_total{path=\"/a\",code=\"200\"} 2\n"
            "req_total{path=\"/b\\\"x\",code=\"404\"} 1\n");
  EXPECT_EQ(c.value({{"path", "/a"}, {"code", "200"}}), 2);
  EXPECT_THROW(c.inc(1, {{"path", "/a"}}), InternalError);
  EXPECT_THROW(c.inc(1, {{"code", "1"}, {"path", "/a"}}), InternalError);
}

TEST(Metrics, HistogramBucketsAreCumulative) {
  MetricsRegistry reg;
  Histogram& h = reg.add<Histogram>("lat_seconds", "Latency", std::vector<double>{0.1, 1});
  for (double v : {0.05, 0.1, 0.5, 3.0}) h.observe(v);
  EXPECT_EQ(reg.render(),
            "# HELP lat_seconds Latency\n# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{le=\"0.1\"} 2\n"  // le is inclusive
            "lat_seconds_bucket{le=\"1\"} 3\n"
            "lat_seconds_bucket{le=\"+Inf\"} 4\n"
            "lat_seconds_sum 3.65\n"
            "lat_seconds_count 4\n");
  EXPECT_EQ(h.count(), 4);
  EXPECT_THROW(reg.add<Histogram>("bad", "x", std::vector<double>{1, 1}), InternalError);
}

TEST(Metrics, ConcurrentUpdatesAreCounted) {
  MetricsRegistry reg;
  Counter& c = reg.add<Counter>("n_total", "n");
  Histogram& h = reg.add<Histogram>("h", "h", std::vector<double>{1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        c.inc();
        h.observe(0.5);
      }
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(c.value(), 4000);
  EXPECT_EQ(h.count(), 4000);
}

// Every line of the server's metrics is a HELP, a TYPE or a sample of the
// family they announce, and each metric the server promises is there.
TEST(Metrics, ServeMetricsExposition) {
  ServeMetrics m;
  m.requests.inc(1, {{"endpoint", "/v1/completions"}, {"status", "200"}});
  m.time_to_first_token.observe(0.02);
  m.kv_blocks_total.set(16);
  const std::string text = m.registry.render();
  const std::regex help(R"(# HELP ([a-z0-9_]+) .+)"),
      type(R"(# TYPE ([a-z0-9_]+) (counter|gauge|histogram))");
  const std::regex sample(R"(([a-z0-9_]+)(\{[a-z_]+="[^"]*"(,[a-z_]+="[^"]*")*\})? (\S+))");
  std::istringstream in(text);
  std::string line, family, kind;
  std::map<std::string, std::string> types;
  while (std::getline(in, line)) {
    std::smatch s;
    if (std::regex_match(line, s, help)) {
      family = s[1];
    } else if (std::regex_match(line, s, type)) {
      EXPECT_EQ(s[1], family) << line;
      kind = s[2];
      types[family] = kind;
    } else {
      ASSERT_TRUE(std::regex_match(line, s, sample)) << line;
      const std::string name = s[1];
      if (kind == "histogram") {
        EXPECT_TRUE(name == family + "_bucket" || name == family + "_sum" ||
                    name == family + "_count")
            << line;
      } else {
        EXPECT_EQ(name, family) << line;
      }
      if (kind == "counter") {
        EXPECT_TRUE(name.ends_with("_total")) << line;
      }
    }
  }
  for (const char* f : {"nekton_requests_total", "nekton_prompt_tokens_total",
                        "nekton_generation_tokens_total", "nekton_requests_cancelled_total"})
    EXPECT_EQ(types[f], "counter") << f;
  for (const char* f : {"nekton_num_requests_running", "nekton_num_requests_waiting",
                        "nekton_queue_depth", "nekton_kv_blocks_used", "nekton_kv_blocks_total"})
    EXPECT_EQ(types[f], "gauge") << f;
  for (const char* f : {"nekton_time_to_first_token_seconds", "nekton_inter_token_latency_seconds",
                        "nekton_e2e_request_latency_seconds"})
    EXPECT_EQ(types[f], "histogram") << f;
  EXPECT_NE(text.find("nekton_time_to_first_token_seconds_bucket{le=\"0.02\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("nekton_time_to_first_token_seconds_bucket{le=\"0.01\"} 0\n"),
            std::string::npos);
  EXPECT_NE(text.find("\nnekton_kv_blocks_total 16\n"), std::string::npos);
}

}  // namespace
}  // namespace nk
