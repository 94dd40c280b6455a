#include "align/rollouts.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <utility>

#include <fmt/format.h>

#include "core/atomic_file.h"
#include "core/error.h"

namespace nk {

namespace fs = std::filesystem;

RolloutDataset::RolloutDataset(RolloutSchedule schedule, int64_t seq_len, int32_t pad_id,
                               std::string name)
    : schedule_(schedule), seq_len_(seq_len), pad_(pad_id), name_(std::move(name)) {
  NK_CHECK(schedule_.steps > 0 && schedule_.global_batch > 0 &&
               schedule_.samples % schedule_.global_batch == 0,
           "RolloutDataset: {} completions in steps of {}", schedule_.samples,
           schedule_.global_batch);
}

void RolloutDataset::sample(int64_t, int32_t*) const {
  NK_CHECK(false, "RolloutDataset holds rows: read them with row()");
}

std::string RolloutDataset::describe(int64_t i) const {
  return fmt::format("{}, round {} completion {}", name_, schedule_.round_of_sample(i),
                     schedule_.index_of_sample(i));
}

const Rollout& RolloutDataset::rollout(int64_t i) const {
  const int64_t round = schedule_.round_of_sample(i);
  NK_CHECK(round_ && round_->index == round, "RolloutDataset: sample {} is round {}'s, {} is set",
           i, round, round_ ? round_->index : -1);
  const int64_t k = schedule_.index_of_sample(i);
  NK_CHECK(k < int64_t(round_->samples.size()), "RolloutDataset: completion {} of {}", k,
           round_->samples.size());
  return round_->samples[size_t(k)];
}

void RolloutDataset::row(int64_t i, int32_t* tokens, int32_t* targets, int32_t* positions,
                         int32_t* cu_seqlens) const {
  rollout_row(rollout(i), seq_len_, pad_, tokens, targets);
  for (int64_t t = 0; positions && t < seq_len_; ++t) positions[t] = int32_t(t);
  if (cu_seqlens) {
    const int64_t T = seq_len_;
    cu_seqlens[0] = 0;
    cu_seqlens[1] = int32_t(T);
  }
}

void rollout_row(const Rollout& r, int64_t T, int32_t pad_id, int32_t* tokens, int32_t* targets) {
  const int64_t n = int64_t(r.tokens.size());
  NK_CHECK(n <= T, "rollout_row: a sequence of {} tokens in rows of {}", n, T);
  for (int64_t t = 0; t < T; ++t) {
    tokens[t] = t < n ? r.tokens[size_t(t)] : pad_id;
    // Position t predicts token t + 1: a completion token's.
    targets[t] = t + 1 >= r.prompt_len && t + 1 < n ? r.tokens[size_t(t + 1)] : -100;
  }
}

std::string rollout_round_path(const std::string& out_dir, int64_t round, int64_t rank) {
  return (fs::path(out_dir) / "rollouts" / fmt::format("round-{}.rank-{}.bin", round, rank))
      .string();
}

namespace {

constexpr char kMagic[8] = {'N', 'K', 'R', 'O', 'L', 'L', '2', '\n'};

template <class T>
void put(std::string& s, const T& v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <class T>
void put_vec(std::string& s, const std::vector<T>& v) {
  put<int64_t>(s, int64_t(v.size()));
  s.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

struct Reader {
  const std::string& s;
  const std::string& path;
  size_t at = 0;
  void need(size_t n) const {
    if (s.size() - at < n)
      fail("{}: a rollouts file cut short (byte {} of {})", path, at, s.size());
  }
  template <class T>
  T get() {
    need(sizeof(T));
    T v;
    std::memcpy(&v, s.data() + at, sizeof(T));
    at += sizeof(T);
    return v;
  }
  template <class T>
  std::vector<T> get_vec() {
    const int64_t n = get<int64_t>();
    if (n < 0 || uint64_t(n) > (s.size() - at) / sizeof(T))
      fail("{}: a rollouts file with a bad length {} at byte {}", path, n, at);
    std::vector<T> v(static_cast<size_t>(n));
    std::memcpy(v.data(), s.data() + at, size_t(n) * sizeof(T));
    at += size_t(n) * sizeof(T);
    return v;
  }
};

}  // namespace

void save_rollout_round(const std::string& path, const std::string& key, const RolloutRound& r) {
  std::string s(kMagic, sizeof(kMagic));
  put_vec(s, std::vector<char>(key.begin(), key.end()));
  put<int64_t>(s, r.index);
  put<int64_t>(s, int64_t(r.samples.size()));
  for (const Rollout& x : r.samples) {
    put<int64_t>(s, x.prompt);
    put_vec(s, x.tokens);
    put<int64_t>(s, x.prompt_len);
    put<uint8_t>(s, x.truncated);
    put<double>(s, x.reward);
    put<double>(s, x.advantage);
    put_vec(s, x.old_logp);
    put_vec(s, x.ref_logp);
    put_vec(s, x.old_value);
    put_vec(s, x.token_adv);
    put_vec(s, x.returns);
  }
  fs::create_directories(fs::path(path).parent_path());
  write_file_atomic(path, s);
}

std::shared_ptr<RolloutRound> load_rollout_round(const std::string& path, const std::string& key) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return nullptr;
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string s = ss.str();
  if (s.size() < sizeof(kMagic) || std::memcmp(s.data(), kMagic, sizeof(kMagic)) != 0)
    fail("{}: not a Nekton rollouts file", path);
  Reader in{s, path, sizeof(kMagic)};
  const std::vector<char> k = in.get_vec<char>();
  if (std::string(k.begin(), k.end()) != key) return nullptr;
  auto r = std::make_shared<RolloutRound>();
  r->index = in.get<int64_t>();
  const int64_t n = in.get<int64_t>();
  if (n < 0 || n > int64_t(s.size())) fail("{}: a rollouts file with {} samples", path, n);
  r->samples.resize(size_t(n));
  for (Rollout& x : r->samples) {
    x.prompt = in.get<int64_t>();
    x.tokens = in.get_vec<int32_t>();
    x.prompt_len = in.get<int64_t>();
    x.truncated = in.get<uint8_t>() != 0;
    x.reward = in.get<double>();
    x.advantage = in.get<double>();
    x.old_logp = in.get_vec<float>();
    x.ref_logp = in.get_vec<float>();
    x.old_value = in.get_vec<float>();
    x.token_adv = in.get_vec<float>();
    x.returns = in.get_vec<float>();
    if (x.prompt_len < 1 || x.prompt_len > int64_t(x.tokens.size()))
      fail("{}: a sample with a prompt of {} of its {} tokens", path, x.prompt_len,
           x.tokens.size());
    for (const std::vector<float>* v :
         {&x.old_logp, &x.ref_logp, &x.old_value, &x.token_adv, &x.returns})
      if (!v->empty() && int64_t(v->size()) != x.completion())
        fail("{}: a sample with {} per-token values for its {} completion tokens", path, v->size(),
             x.completion());
  }
  if (in.at != s.size()) fail("{}: {} bytes after the last sample", path, s.size() - in.at);
  return r;
}

namespace {

// The round of OUT_DIR/rollouts/round-R.rank-K.bin and K, or false for
// another name.
bool parse_round_file(const std::string& name, int64_t& round, int64_t& rank) {
  const auto number = [](const std::string& t, int64_t& v) {
    if (t.empty() || t.size() > 18 || t.find_first_not_of("0123456789") != std::string::npos)
      return false;
    v = std::stoll(t);
    return true;
  };
  const std::string head = "round-", mid = ".rank-", tail = ".bin";
  if (name.rfind(head, 0) != 0 || name.size() <= head.size() + tail.size() ||
      name.compare(name.size() - tail.size(), tail.size(), tail) != 0)
    return false;
  const size_t at = name.find(mid, head.size());
  return at != std::string::npos && number(name.substr(head.size(), at - head.size()), round) &&
         number(name.substr(at + mid.size(), name.size() - tail.size() - at - mid.size()), rank);
}

// (rank, path) of every file of `round` (every round when round < 0), by rank.
std::vector<std::pair<int64_t, fs::path>> round_files(const std::string& out_dir, int64_t round,
                                                      bool before) {
  const fs::path dir = fs::path(out_dir) / "rollouts";
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    int64_t r = 0, k = 0;
    if (parse_round_file(e.path().filename().string(), r, k) && (before ? r < round : r == round))
      out.emplace_back(k, e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

std::shared_ptr<RolloutRound> load_rollout_round_of_every_rank(const std::string& out_dir,
                                                               int64_t round,
                                                               const std::string& key,
                                                               std::vector<std::string>* files) {
  std::shared_ptr<RolloutRound> all;
  std::string first;
  for (const auto& [rank, path] : round_files(out_dir, round, false)) {
    std::shared_ptr<RolloutRound> r = load_rollout_round(path.string(), key);
    if (!r || r->index != round) continue;
    if (files) files->push_back(path.string());
    if (!all) {
      all = std::move(r);
      first = path.string();
      continue;
    }
    if (r->samples.size() != all->samples.size())
      fail("{}: round {} of {} samples, {} in {}", path.string(), round, r->samples.size(),
           all->samples.size(), first);
    for (size_t i = 0; i < r->samples.size(); ++i) {
      Rollout &to = all->samples[i], &from = r->samples[i];
      if (from.tokens != to.tokens || from.prompt != to.prompt)
        fail("{}: sample {} of round {} differs from {}'s", path.string(), i, round, first);
      for (auto [a, b] : {std::pair{&to.old_logp, &from.old_logp},
                          {&to.ref_logp, &from.ref_logp},
                          {&to.old_value, &from.old_value},
                          {&to.token_adv, &from.token_adv},
                          {&to.returns, &from.returns}})
        if (a->empty()) *a = std::move(*b);
    }
  }
  return all;
}

void prune_rollout_rounds(const std::string& out_dir, int64_t round) {
  std::error_code ec;  // another rank may have removed it first
  for (const auto& [rank, path] : round_files(out_dir, round, true)) fs::remove(path, ec);
}

}  // namespace nk
