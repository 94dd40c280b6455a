// For the tests of `nekton serve`: a tiny model folder whose greedy output is
// printable ASCII (so texts compare byte for byte through JSON), and a
// server process that is always killed (RAII) with every wait bounded.
#pragma once
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <httplib.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "ckpt/model_io.h"
#include "data/chat/chat_template.h"
#include "data/tokenizer/tokenizer.h"
#include "model/transformer.h"
#include "ops/ops.h"
#include "test_paths.h"
#include "test_util.h"

namespace nk::test {

// A random GPT-2 over bytes (vocabulary 257) whose head gives printable
// ASCII (32..126) random rows and every other id a zero row: its logits for
// printable ids spread over about +-6 (LayerNorm'd hidden of width 32), so
// greedy and sampled text are printable, the end-of-text id is as good as
// never drawn, and sampling still varies with the seed.
// vocab: the model's rows; past the bytes tokenizer's 257 (padding) each is
// a printable row times 3, so that without the padding mask a padding id
// would win almost every step; below 257, the model is smaller than its
// tokenizer (refused at load).
inline void save_ascii_model(const std::string& dir, int64_t max_seq_len = 2048,
                             bool chatml_config = true, int64_t vocab = 257) {
  ModelConfig c;
  c.arch = "gpt2";
  c.vocab_size = vocab;
  c.max_seq_len = max_seq_len;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_kv_head = 2;
  c.d_model = 32;
  c.d_ff = 64;
  c.tied_embeddings = false;
  c.init_std = 0.5;
  Transformer m(c, DType::F32, 11);
  Tensor head = ParamLayout::view(m.params(), m.layout().find("lm_head.weight"));
  std::vector<float> w(size_t(head.numel()), 0.f);
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.f, 0.9f);
  for (int64_t v = 32; v < std::min<int64_t>(127, vocab); ++v)
    for (int64_t i = 0; i < c.d_model; ++i) w[size_t(v * c.d_model + i)] = normal(rng);
  for (int64_t v = 257; v < vocab; ++v)
    for (int64_t i = 0; i < c.d_model; ++i)
      w[size_t(v * c.d_model + i)] = 3 * w[size_t((32 + v % 95) * c.d_model + i)];
  ops::copy_from_host(head, w.data());
  m.sync_compute_params();
  save_model(dir, m);
  store_tokenizer("bytes", dir);
  if (chatml_config)
    write_file(dir + "/tokenizer_config.json",
               nlohmann::json{{"chat_template", find_chat_template("chatml").jinja()}}.dump());
}

// `nekton serve` on a free port, killed when the object goes.
class ServerProcess {
 public:
  ServerProcess(const std::string& model_dir, const std::vector<std::string>& extra,
                const std::string& log)
      : log_(log) {
    std::vector<std::string> args = {nekton_bin(), "serve", "serve.model=" + model_dir,
                                     "serve.port=0"};
    args.insert(args.end(), extra.begin(), extra.end());
    pid_ = ::fork();
    if (pid_ == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (fd >= 0) {
        ::dup2(fd, 1);
        ::dup2(fd, 2);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    // The startup line names the port.
    const std::regex listening(R"(listening on http://[^:]+:(\d+))");
    for (int i = 0; i < 3000 && port_ == 0; ++i) {
      std::smatch m;
      const std::string text = read_file(log_);
      if (std::regex_search(text, m, listening)) port_ = std::stoi(m[1]);
      if (port_ == 0 && exited()) break;
      if (port_ == 0) ::usleep(10000);
    }
  }
  ~ServerProcess() { stop(SIGKILL); }
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  int port() const { return port_; }  // 0: it did not start (see log())
  pid_t pid() const { return pid_; }  // -1 once it has exited
  // A client of it with timeouts, so a test never hangs on a stuck server.
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30);
    c.set_write_timeout(30);
    c.set_connection_timeout(10);
    return c;
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const { return read_file(log_); }

  void signal(int sig) {
    if (pid_ > 0) ::kill(pid_, sig);
  }
  // Sends `sig`, waits up to `seconds` for the exit, then kills; the exit
  // status (-1 when killed by a signal).
  int stop(int sig = SIGTERM, double seconds = 15) {
    if (pid_ <= 0) return status_;
    ::kill(pid_, sig);
    for (int i = 0; i < int(seconds * 100) && !exited(); ++i) ::usleep(10000);
    if (!exited()) {
      ::kill(pid_, SIGKILL);
      int st = 0;
      ::waitpid(pid_, &st, 0);
      status_ = -1;
    }
    pid_ = -1;
    return status_;
  }

 private:
  bool exited() {
    if (pid_ <= 0) return true;
    int st = 0;
    if (::waitpid(pid_, &st, WNOHANG) != pid_) return false;
    status_ = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    pid_ = -1;
    return true;
  }

  std::string log_;
  pid_t pid_ = -1;
  int port_ = 0;
  int status_ = -1;
};

// The greedy continuation `nekton generate` gives for `prompt` on `model`
// (the prompt goes through a file in `dir`).
inline std::string greedy_generate(const std::string& model, const std::string& dir,
                                   const std::string& prompt, int max_tokens) {
  const std::string file = dir + "/prompt.jsonl";
  write_file(file, nlohmann::json{{"prompt", prompt}}.dump() + "\n");
  const auto r = run_nekton(
      fmt::format("generate generate.model={} generate.prompt_file={} generate.temperature=0 "
                  "generate.max_tokens={}",
                  model, file, max_tokens),
      false);
  EXPECT_EQ(r.code, 0) << r.out;
  // One prompt streams: the prompt, the continuation, a newline.
  EXPECT_TRUE(r.out.starts_with(prompt) && r.out.ends_with("\n")) << r.out;
  return r.out.substr(prompt.size(), r.out.size() - prompt.size() - 1);
}

// The npm packages of scripts/fetch_assets.sh --test.
inline std::string npm_modules() {
  return assets_dir() + "/npm/node_modules";
}

inline bool have_openai_client() {
  return std::system("node --version > /dev/null 2>&1") == 0 &&
         std::filesystem::exists(npm_modules() + "/openai/package.json");
}

// tests/serve/openai_client.mjs in MODE against `server` (at most `seconds`);
// its stdout's JSON, or null with the failure recorded.
inline nlohmann::json run_openai_client(const ServerProcess& server, const std::string& model,
                                        const std::string& mode, int seconds = 60) {
  const RunResult r =
      run_command(fmt::format("timeout {} node {}/tests/serve/openai_client.mjs {} {} {} {}",
                              seconds, NK_SOURCE_DIR, npm_modules(), server.url(), model, mode),
                  false);
  EXPECT_EQ(r.code, 0) << "openai_client.mjs " << mode << " failed (stderr above)\n" << r.out;
  if (r.code != 0) return nullptr;
  const auto nl = r.out.find_last_of('\n', r.out.size() - 2);
  return nlohmann::json::parse(nl == std::string::npos ? r.out : r.out.substr(nl + 1), nullptr,
                               false);
}

}  // namespace nk::test
