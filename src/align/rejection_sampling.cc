#include "align/rejection_sampling.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"
#include "core/log.h"
#include "data/utf8.h"
#include "infer/generate.h"

namespace nk {

void RejectionSamplingOptions::check() const {
  if (num_rollouts < 1) fail("align.num_rollouts_per_prompt: must be >= 1, got {}", num_rollouts);
  if (top_n < 1) fail("align.top_n_rollouts: must be >= 1, got {}", top_n);
  if (top_n > num_rollouts)
    fail(
        "align.top_n_rollouts: {} is more than the {} samples per prompt "
        "(align.num_rollouts_per_prompt)",
        top_n, num_rollouts);
  if (std::isnan(threshold)) fail("align.reward_threshold: not a number");
  if (max_tokens < 1) fail("align.max_tokens: must be >= 1, got {}", max_tokens);
  if (batch < 1) fail("align.rollout_batch_size: must be >= 1, got {}", batch);
  for (const std::string& s : stop)
    if (s.empty()) fail("align.stop: an empty stop string");
  try {
    validate(sampling);
  } catch (const Error& e) {
    throw Error(std::string("align.") + e.what());
  }
}

std::vector<std::vector<std::string>> generate_rollouts(
    Transformer& policy, const Tokenizer& tok, const std::vector<int32_t>& end_ids,
    const std::vector<std::vector<int32_t>>& prompts, const RejectionSamplingOptions& opt,
    size_t first) {
  const int64_t n = opt.num_rollouts;
  Generator gen(policy, &tok, std::min<int64_t>(opt.batch, int64_t(prompts.size()) * n));
  gen.set_end_ids(end_ids);
  std::vector<int64_t> ids;
  for (size_t i = 0; i < prompts.size(); ++i)
    for (int64_t j = 0; j < n; ++j) {
      GenerationRequest r;
      r.prompt = prompts[i];
      r.max_new_tokens = opt.max_tokens;
      r.stop = opt.stop;
      r.sampling = opt.sampling;
      r.sampling.seed = opt.sampling.seed + uint64_t(first + i) * uint64_t(n) + uint64_t(j);
      try {
        ids.push_back(gen.submit(std::move(r)));
      } catch (const Error& e) {
        fail("prompt {} (sample {}): {}", i, j, e.what());
      }
    }
  using clock = std::chrono::steady_clock;
  const auto t0 = clock::now();
  auto last = t0;
  int64_t done = 0, tokens = 0;
  const int64_t total = int64_t(ids.size());
  while (!gen.idle()) {
    for (const TokenEvent& e : gen.step()) {
      ++tokens;
      done += e.finished;
    }
    const auto now = clock::now();
    if (now - last > std::chrono::seconds(10)) {
      const double s = std::chrono::duration<double>(now - t0).count();
      NK_INFO("rejection sampling: {}/{} samples, {:.1f} tokens/s, ETA {:.0f} s", done, total,
              double(tokens) / s, done > 0 ? s * double(total - done) / double(done) : 0.0);
      last = now;
    }
  }
  std::vector<std::vector<std::string>> out(prompts.size());
  // JSONL holds UTF-8: a sample cut inside a character, or bytes a small
  // model made up, keep U+FFFD there, and are scored as written.
  for (size_t k = 0; k < ids.size(); ++k)
    out[k / size_t(n)].push_back(replace_invalid_utf8(gen.release(ids[k]).text));
  return out;
}

std::vector<int64_t> select_rollouts(const std::vector<std::optional<float>>& rewards,
                                     int64_t top_n, double threshold) {
  std::vector<int64_t> idx;
  for (size_t j = 0; j < rewards.size(); ++j)
    if (rewards[j] && double(*rewards[j]) >= threshold) idx.push_back(int64_t(j));
  std::stable_sort(idx.begin(), idx.end(),
                   [&](int64_t a, int64_t b) { return *rewards[size_t(a)] > *rewards[size_t(b)]; });
  if (int64_t(idx.size()) > top_n) idx.resize(size_t(top_n));
  return idx;
}

void score_rollouts(std::vector<PromptRollouts>& rollouts, const PreferenceRenderer& rr,
                    const SequenceScorer& score, int64_t top_n, double threshold,
                    const std::function<std::string(size_t)>& where, int64_t max_len) {
  std::vector<std::vector<int32_t>> seqs;
  std::vector<std::pair<size_t, size_t>> of;  // (prompt, sample) of each sequence
  for (size_t i = 0; i < rollouts.size(); ++i) {
    PromptRollouts& r = rollouts[i];
    r.rewards.assign(r.samples.size(), std::nullopt);
    for (size_t j = 0; j < r.samples.size(); ++j) {
      if (r.samples[j].empty()) continue;  // nothing to score or to learn
      seqs.push_back(render_sequence(r.prompt, r.samples[j], rr, where(i)));
      if (max_len > 0 && int64_t(seqs.back().size()) > max_len)
        fail(
            "{}: sample {} with its prompt is {} tokens for the reward model, more than its "
            "context of {} (a smaller align.max_tokens, or a reward model with a longer context)",
            where(i), j, seqs.back().size(), max_len);
      of.emplace_back(i, j);
    }
  }
  const std::vector<float> s = seqs.empty() ? std::vector<float>{} : score(seqs);
  NK_CHECK(s.size() == seqs.size(), "score_rollouts: {} scores for {} sequences", s.size(),
           seqs.size());
  for (size_t k = 0; k < s.size(); ++k) {
    if (!std::isfinite(s[k]))
      fail("{}: sample {}: the reward model scored it {}", where(of[k].first), of[k].second, s[k]);
    rollouts[of[k].first].rewards[of[k].second] = s[k];
  }
  for (PromptRollouts& r : rollouts) settle_rollouts(r, top_n, threshold);
}

void settle_rollouts(PromptRollouts& r, int64_t top_n, double threshold) {
  double sum = 0, mx = -INFINITY;
  int64_t m = 0;
  for (const auto& x : r.rewards)
    if (x) {
      sum += *x;
      mx = std::max(mx, double(*x));
      ++m;
    }
  r.mean = m ? sum / double(m) : NAN;
  r.max = m ? mx : NAN;
  r.kept = select_rollouts(r.rewards, top_n, threshold);
}

std::string rejection_progress_path(const std::string& output) {
  return output + ".partial.jsonl";
}

std::vector<PromptRollouts> read_rejection_progress(const std::string& output,
                                                    const nlohmann::json& settings,
                                                    size_t max_prompts) {
  std::ifstream f(rejection_progress_path(output), std::ios::binary);
  std::vector<PromptRollouts> done;
  std::string line;
  if (!f || !std::getline(f, line)) return done;
  const nlohmann::json head = nlohmann::json::parse(line, nullptr, false);
  if (!head.is_object() || !head.contains("settings") || head["settings"] != settings) return done;
  // A line cut by a kill does not parse: the prompts from it on are redone.
  while (done.size() < max_prompts && std::getline(f, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object() || !j.contains("samples") || !j.contains("rewards") ||
        !j["samples"].is_array() || !j["rewards"].is_array() ||
        j["samples"].size() != j["rewards"].size())
      break;
    PromptRollouts r;
    for (const auto& x : j["samples"]) r.samples.push_back(x.get<std::string>());
    for (const auto& x : j["rewards"])
      r.rewards.push_back(x.is_number() ? std::optional<float>(x.get<float>()) : std::nullopt);
    done.push_back(std::move(r));
  }
  return done;
}

void append_rejection_progress(const std::string& output, const nlohmann::json& settings,
                               bool fresh, const std::vector<PromptRollouts>& done) {
  std::string text = fresh ? nlohmann::json{{"settings", settings}}.dump() + "\n" : "";
  for (const PromptRollouts& r : done) {
    nlohmann::json rewards = nlohmann::json::array();
    for (const auto& x : r.rewards) rewards.push_back(x ? nlohmann::json(*x) : nullptr);
    text += nlohmann::json{{"samples", r.samples}, {"rewards", rewards}}.dump() + "\n";
  }
  const std::string path = rejection_progress_path(output);
  const std::filesystem::path dir = std::filesystem::path(path).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | (fresh ? O_TRUNC : 0), 0644);
  if (fd < 0) fail("{}: cannot write ({})", path, std::strerror(errno));
  size_t at = 0;
  while (at < text.size()) {
    const ssize_t w = ::write(fd, text.data() + at, text.size() - at);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int e = errno;
      ::close(fd);
      fail("{}: write failed ({})", path, std::strerror(e));
    }
    at += size_t(w);
  }
  ::fsync(fd);
  ::close(fd);
}

nlohmann::ordered_json rejection_sft_record(const nlohmann::json& prompt, const std::string& sample,
                                            float reward) {
  nlohmann::ordered_json j;
  if (prompt.is_array()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::array();
    for (const auto& x : prompt) m.push_back(nlohmann::ordered_json(x));
    m.push_back({{"role", "assistant"}, {"content", sample}});
    j["messages"] = std::move(m);
  } else {
    j["input"] = prompt.get<std::string>();
    j["output"] = sample;
  }
  j["reward"] = reward;
  return j;
}

std::string RejectionSamplingSummary::line() const {
  return fmt::format(
      "{} prompts, {} samples ({} scored): mean reward {:.4f}, mean of the best {:.4f}; {} kept "
      "(mean reward {:.4f})",
      prompts, samples, scored, mean_reward, mean_max_reward, kept, mean_kept_reward);
}

RejectionSamplingSummary summarize(const std::vector<PromptRollouts>& rollouts) {
  RejectionSamplingSummary s;
  double sum = 0, sum_max = 0, sum_kept = 0;
  int64_t with_max = 0;
  for (const PromptRollouts& r : rollouts) {
    ++s.prompts;
    s.samples += int64_t(r.samples.size());
    for (const auto& x : r.rewards)
      if (x) {
        ++s.scored;
        sum += *x;
      }
    if (!std::isnan(r.max)) {
      sum_max += r.max;
      ++with_max;
    }
    for (int64_t k : r.kept) sum_kept += *r.rewards[size_t(k)];
    s.kept += int64_t(r.kept.size());
  }
  s.mean_reward = s.scored ? sum / double(s.scored) : NAN;
  s.mean_max_reward = with_max ? sum_max / double(with_max) : NAN;
  s.mean_kept_reward = s.kept ? sum_kept / double(s.kept) : NAN;
  return s;
}

std::string rejection_stats_path(const std::string& output) {
  return output + ".stats.jsonl";
}

namespace {
nlohmann::json number_or_null(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(nullptr);
}
}  // namespace

void write_rejection_sampling(const std::string& output, const std::string& key,
                              const std::vector<PromptRollouts>& rollouts,
                              const nlohmann::json& settings) {
  const RejectionSamplingSummary sum = summarize(rollouts);
  if (sum.kept == 0)
    fail(
        "{}: no sample kept ({} samples, {} scored; align.reward_threshold and empty samples "
        "decide); nothing written",
        key, sum.samples, sum.scored);
  std::string sft, stats = nlohmann::json{{"settings", settings}}.dump() + "\n";
  for (const PromptRollouts& r : rollouts) {
    for (int64_t k : r.kept)
      sft +=
          rejection_sft_record(r.prompt, r.samples[size_t(k)], *r.rewards[size_t(k)]).dump() + "\n";
    nlohmann::ordered_json s;
    s["line"] = r.line;
    s["mean"] = number_or_null(r.mean);
    s["max"] = number_or_null(r.max);
    s["kept"] = r.kept;
    nlohmann::json rewards = nlohmann::json::array();
    for (const auto& x : r.rewards) rewards.push_back(x ? nlohmann::json(*x) : nullptr);
    s["rewards"] = rewards;
    s["samples"] = r.samples;
    stats += s.dump() + "\n";
  }
  const std::filesystem::path dir = std::filesystem::path(output).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
  // The stats (with the settings a rerun checks) go last: a kill between the
  // two leaves an SFT file that a rerun does not trust.
  std::filesystem::remove(rejection_stats_path(output));
  write_file_atomic(output, sft);
  write_file_atomic(rejection_stats_path(output), stats);
  std::filesystem::remove(rejection_progress_path(output));
}

bool rejection_sampling_done(const std::string& output, const nlohmann::json& settings) {
  namespace fs = std::filesystem;
  const std::string stats = rejection_stats_path(output);
  if (!fs::is_regular_file(output) || !fs::is_regular_file(stats)) return false;
  std::ifstream f(stats);
  std::string first;
  if (!std::getline(f, first)) return false;
  const nlohmann::json j = nlohmann::json::parse(first, nullptr, false);
  return j.is_object() && j.contains("settings") && j["settings"] == settings;
}

}  // namespace nk
