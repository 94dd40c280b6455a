#include "align/online_objective.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "align/preference_data.h"
#include "align/reference.h"
#include "align/rewards/reward_tally.h"
#include "core/error.h"
#include "core/log.h"
#include "data/dataset/dp_slice.h"
#include "data/dataset/epoch_order.h"
#include "infer/generate.h"
#include "infer/paged_cache.h"

namespace nk {

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace

OnlinePrompts render_online_prompts(PromptRecords records, const PreferenceRenderer& renderer,
                                    const std::string& key, int64_t max_prompt_length) {
  OnlinePrompts p;
  p.records = std::move(records);
  for (size_t i = 0; i < p.records.prompts.size(); ++i) {
    std::vector<int32_t> t = render_prompt(p.records.prompts[i], renderer,
                                           p.records.file.where(p.records.file.records[i], key));
    if (int64_t(t.size()) > max_prompt_length) {  // keep the end, as TRL cuts prompts
      t.erase(t.begin(), t.end() - max_prompt_length);
      ++p.truncated;
    }
    p.tokens.push_back(std::move(t));
  }
  if (p.tokens.empty()) fail("align.data_path: '{}' holds no prompt", p.records.file.path);
  return p;
}

OnlineObjective::OnlineObjective(const TrainConfig& cfg, const OnlineRlConfig& rl,
                                 std::shared_ptr<const OnlinePrompts> prompts,
                                 std::shared_ptr<Tokenizer> tok, std::vector<int32_t> end_ids,
                                 OnlineScorer scorer, ReferenceSource reference)
    : cfg_(cfg),
      rl_(rl),
      prompts_(std::move(prompts)),
      tok_(std::move(tok)),
      end_ids_(std::move(end_ids)),
      scorer_(std::move(scorer)),
      reference_(reference) {
  NK_CHECK(rl_.samples > 0 && rl_.rounds_steps > 0, "OnlineObjective: an unchecked config");
  schedule_.samples = rl_.samples;
  schedule_.global_batch = cfg_.global_batch;
  schedule_.steps = rl_.rounds_steps;
  dataset_ = std::make_shared<RolloutDataset>(
      schedule_, cfg_.seq_len, std::max(0, tok_->eod_id()),
      fmt::format("rollouts of '{}'", prompts_->records.file.path));
}

TrainData OnlineObjective::data(const TrainConfig&) {
  TrainData d;
  d.train = dataset_;
  const RejectionSamplingOptions& s = rl_.sampling;
  d.summary = fmt::format(
      "align.method={}; {} prompts from '{}'{}; rounds of {} prompts x {} generations (up to {} "
      "tokens each), {} optimizer steps each",
      rl_algorithm_name(rl_.loss.algorithm), prompts_->tokens.size(), prompts_->records.file.path,
      prompts_->truncated ? fmt::format(" ({} cut to their last tokens)", prompts_->truncated) : "",
      rl_.rollout_prompts, s.num_rollouts, s.max_tokens, rl_.rounds_steps);
  return d;
}

void OnlineObjective::prepare(Transformer& model, bool fresh) {
  NK_CHECK(rl_.loss.algorithm != RlAlgorithm::Ppo || model.config().value_head || critic_,
           "align.method=ppo: the policy has no value head and there is no critic");
  NK_CHECK(!critic_ || rl_.loss.algorithm == RlAlgorithm::Ppo, "a critic without ppo");
  critic_pending_ = critic_ && !fresh;
  if (model.tensor_parallel().active() && !ranks_.whole_policy)
    NK_INFO(
        "align: each tensor-parallel group generates from its pieces of the policy (a cache of "
        "its heads on every rank; no whole copy)");
  model.set_logit_temperature(float(rl_.sampling.sampling.temperature));
  if (rl_.loss.kl_coef == 0) {
    NK_INFO("align: no reference model (align.kl_coef = 0)");
    return;
  }
  if (reference_ == ReferenceSource::Copy) {
    ref_model_ = initial_model(cfg_, true);
    ref_model_->set_logit_temperature(float(rl_.sampling.sampling.temperature));
    NK_INFO("align: reference = a frozen copy of the initial model ({:.1f} MiB of weights)",
            double(ref_model_->weight_bytes()) / 1048576.0);
  } else {
    NK_CHECK(reference_ == ReferenceSource::AdapterOff, "OnlineObjective: reference {}",
             int(reference_));
    NK_INFO("align: reference = the policy with its adapters switched off (its base)");
  }
}

std::string OnlineObjective::round_key() const {
  std::string k;
  for (const auto& [key, v] : rl_.signature()) k += key + "=" + v + ";";
  return k + fmt::format("seed={};prompts={};T={};GB={};B={}", cfg_.seed,
                         prompts_->records.file.path, cfg_.seq_len, cfg_.global_batch,
                         cfg_.micro_batch);
}

void OnlineObjective::before_step(Transformer& model, int64_t step) {
  if (critic_pending_) {  // resumed: the critic of the step the policy resumes
    critic_->load_checkpoint(step);
    critic_pending_ = false;
  }
  const int64_t r = schedule_.round_of_step(step);
  if (round_ && round_->index == r) return;
  const std::string path = rollout_round_path(cfg_.out_dir, r, ranks_.dp_rank);
  if (step != schedule_.first_step(r)) {
    // Resumed mid-way through a round: the weights that made it are gone, so
    // its rollouts come back from the files written when it was made, every
    // replica's (the layout may have changed since).
    // They lie beside the checkpoint resumed (train.resume_from's run).
    std::vector<std::string> files;
    const std::string from = cfg_.resumed_run_dir();
    std::shared_ptr<RolloutRound> loaded =
        load_rollout_round_of_every_rank(from, r, round_key(), &files);
    if (!loaded)
      fail(
          "{}: resuming at step {}, mid-way through round {} (steps {}-{}), needs the round's "
          "rollouts, written when it was made; they are missing or were made with other settings",
          rollout_round_path(from, r, 0), step + 1, r, schedule_.first_step(r) + 1,
          schedule_.first_step(r + 1));
    check_round_values(*loaded, files);
    // Resumed into another OUT_DIR: the round's files copied into it, so a
    // checkpoint this run saves mid-way through the round resumes too.
    if (ranks_.writes && !std::filesystem::equivalent(from, cfg_.out_dir))
      for (const std::string& f : files) {
        const std::filesystem::path to =
            std::filesystem::path(rollout_round_path(cfg_.out_dir, r, 0)).parent_path() /
            std::filesystem::path(f).filename();
        std::filesystem::create_directories(to.parent_path());
        std::filesystem::copy_file(f, to, std::filesystem::copy_options::overwrite_existing);
      }
    round_ = loaded;
    dataset_->set_round(round_);
    NK_INFO("align: round {} read back from {}", r, fmt::format("{}", fmt::join(files, ", ")));
    return;
  }
  round_ = make_round(model, r);
  dataset_->set_round(round_);
  if (schedule_.steps > 1 && ranks_.replica_writes) save_rollout_round(path, round_key(), *round_);
}

void OnlineObjective::checkpoint_saved(int64_t step) {
  if (ranks_.replica_writes) prune_rollout_rounds(cfg_.out_dir, schedule_.round_of_step(step));
}

void OnlineObjective::check_round_values(const RolloutRound& round,
                                         const std::vector<std::string>& files) const {
  // What head_micro_batch reads of each sample this rank trains.
  const bool need_old = needs_old_logps(), ppo = rl_.loss.algorithm == RlAlgorithm::Ppo;
  const bool with_ref = steps_read_ref_logps();
  for (int64_t k : own_samples()) {
    const Rollout& x = round.samples[size_t(k)];
    if (x.completion() == 0 || (rl_.mask_truncated && x.truncated)) continue;
    const auto has = [&](const std::vector<float>& v) {
      return int64_t(v.size()) == x.completion();
    };
    if ((need_old && !has(x.old_logp)) || (ppo && !has(x.token_adv)) ||
        (with_ref && !has(x.ref_logp)))
      fail(
          "{}: round {}'s files hold no per-token values for its sample {}, which this rank "
          "trains: a run resumed under another layout reads every replica's file of the round "
          "(rollouts/round-{}.rank-*.bin in train.out_dir); one is missing",
          fmt::format("{}", fmt::join(files, ", ")), round.index, k, round.index);
  }
}

OnlineObjective::Batch OnlineObjective::generate_batch(Transformer& model,
                                                       const OnlinePrompts& from,
                                                       std::span<const int64_t> prompts,
                                                       uint64_t seed_first) {
  const RejectionSamplingOptions& s = rl_.sampling;
  const int64_t n = int64_t(prompts.size()), G = s.num_rollouts, K = n * G;
  std::vector<int64_t> own, prompt_of(static_cast<size_t>(K));
  std::vector<GenerationRequest> requests;
  for (int64_t k = 0; k < K; ++k) {
    prompt_of[size_t(k)] = prompts[size_t(k / G)];
    if (k % ranks_.generators != ranks_.generator) continue;
    own.push_back(k);
    GenerationRequest q;
    q.prompt = from.tokens[size_t(prompt_of[size_t(k)])];
    q.max_new_tokens = s.max_tokens;
    q.stop = s.stop;
    q.sampling = s.sampling;
    q.sampling.seed =
        s.sampling.seed + (seed_first + uint64_t(k / G)) * uint64_t(G) + uint64_t(k % G);
    requests.push_back(std::move(q));
  }
  // The generator over the live weights, its cache made for this batch.
  const int64_t batch = std::max<int64_t>(1, std::min<int64_t>(s.batch, int64_t(own.size())));
  const int64_t max_len = cfg_.seq_len;
  PagedCacheOptions o;
  o.block_size = 16;
  o.max_len = max_len;
  o.max_seqs = batch;
  o.max_tokens = batch + 256;
  o.tp = model.tensor_parallel().size();  // a tp group's pieces: each rank its heads
  o.etp = model.tensor_parallel().expert_size();
  o.blocks = rl_.kv_cache_mb > 0
                 ? PagedCache::blocks_for_memory(model.config(), model.compute_dtype(),
                                                 o.block_size, rl_.kv_cache_mb, o.tp)
                 : batch * ((max_len + o.block_size - 1) / o.block_size);
  std::vector<GenerationResult> results;
  std::vector<int32_t> last(requests.size(), -1);
  const auto t0 = Clock::now();
  if (!requests.empty()) {
    Generator gen(
        model, tok_.get(),
        std::make_unique<PagedCache>(model.config(), model.compute_dtype(), o, model.device()),
        batch);
    gen.set_end_ids(end_ids_);
    results = gen.run(requests,
                      [&](int64_t i, int32_t token, std::string_view) { last[size_t(i)] = token; });
  }
  gen_seconds_ += seconds_since(t0);
  // This rank's completions scored.
  std::vector<RewardInput> to_score(own.size());
  for (size_t j = 0; j < own.size(); ++j) {
    GenerationResult& g = results[j];
    if (g.finish == FinishReason::Eos) g.tokens.push_back(last[j]);  // trained on: it stops
    gen_tokens_ += int64_t(g.tokens.size());
    const size_t p = size_t(prompt_of[size_t(own[j])]);
    to_score[j].record = &from.records.file.records[p].value;
    to_score[j].prompt = &from.records.prompts[p];
    to_score[j].completion = g.text;
    to_score[j].completion_tokens = int64_t(g.tokens.size());
    to_score[j].truncated = g.finish == FinishReason::Length || g.finish == FinishReason::Context;
    to_score[j].where = from.records.file.where(from.records.file.records[p]);
  }
  // A tensor-parallel group generates together: its rank 0 scores them and
  // fills their rows of the sum (the others add zeros).
  const std::span<const RewardInput> scored =
      ranks_.scores ? std::span<const RewardInput>(to_score) : std::span<const RewardInput>();
  const auto t1 = Clock::now();
  RewardScores sc = scorer_(scored);
  score_seconds_ += seconds_since(t1);
  NK_CHECK(sc.total.size() == scored.size(), "reward functions: {} scores for {} completions",
           sc.total.size(), scored.size());
  if (parts_.empty()) {
    for (const RewardScores::Part& q : sc.parts)
      parts_.push_back({q.name, q.weight, q.verifiable, {}});
  }
  NK_CHECK(sc.parts.size() == parts_.size(), "reward functions: {} parts, {} before",
           sc.parts.size(), parts_.size());
  // Every rank's completions summed in: [length, truncated, total, parts..., tokens...].
  const int64_t P = int64_t(parts_.size()), W = 3 + P + s.max_tokens + 1;
  std::vector<double> v(size_t(K * W), 0.0);
  for (size_t j = 0; j < scored.size(); ++j) {
    double* row = v.data() + own[j] * W;
    const GenerationResult& g = results[j];
    NK_CHECK(int64_t(g.tokens.size()) <= s.max_tokens + 1, "a completion of {} tokens",
             g.tokens.size());
    row[0] = double(g.tokens.size());
    row[1] = to_score[j].truncated;
    row[2] = sc.total[j];
    if (!std::isfinite(sc.total[j]))
      fail("reward functions: a non-finite reward {} for the completion of {}", sc.total[j],
           to_score[j].where);
    for (int64_t q = 0; q < P; ++q) row[3 + q] = sc.parts[size_t(q)].values[j];
    for (size_t t = 0; t < g.tokens.size(); ++t) row[3 + P + int64_t(t)] = g.tokens[t];
  }
  ranks_.sum_over_generators(v);
  Batch b;
  b.parts.assign(size_t(P), std::vector<double>(size_t(K)));
  for (int64_t k = 0; k < K; ++k) {
    const double* row = v.data() + k * W;
    Rollout r;
    r.prompt = prompt_of[size_t(k)];
    r.tokens = from.tokens[size_t(r.prompt)];
    r.prompt_len = int64_t(r.tokens.size());
    for (int64_t t = 0; t < int64_t(row[0]); ++t) r.tokens.push_back(int32_t(row[3 + P + t]));
    r.truncated = row[1] != 0;
    r.reward = row[2];
    for (int64_t q = 0; q < P; ++q) b.parts[size_t(q)][size_t(k)] = row[3 + q];
    b.samples.push_back(std::move(r));
  }
  return b;
}

std::shared_ptr<RolloutRound> OnlineObjective::make_round(Transformer& policy, int64_t round) {
  // A model in pieces (pipeline or expert parallel, FSDP) or in chunks of
  // rows (context parallel): the round
  // is made with the live weights gathered whole on every rank
  // (ranks_.whole_policy), freed after it; over a frozen base the copy is
  // kept for the next round, which gathers the trainable parameters alone.
  // Split by tensor parallelism alone: each tp group generates from its
  // pieces, as it trains.
  const auto t_gather = Clock::now();
  const bool kept = whole_ != nullptr;
  std::unique_ptr<Transformer> whole =
      ranks_.whole_policy ? ranks_.whole_policy(std::move(whole_)) : nullptr;
  const double gather_s = seconds_since(t_gather);
  Transformer& model = whole ? *whole : policy;
  const int64_t P = rl_.rollout_prompts, G = rl_.sampling.num_rollouts;
  const int64_t batches = rl_.dynamic_sampling ? rl_.dynamic_sampling_max_batches : 1;
  gen_seconds_ = score_seconds_ = 0;
  gen_tokens_ = 0;
  auto r = std::make_shared<RolloutRound>();
  r->index = round;
  std::vector<std::vector<double>> parts;
  std::vector<Rollout> spare;  // dynamic sampling: groups of equal rewards, in order
  std::vector<std::vector<double>> spare_parts;
  int64_t made = 0, zero_std = 0, total_groups = 0;
  const EpochOrder order(int64_t(prompts_->tokens.size()), cfg_.seed, true);
  for (int64_t b = 0; b < batches && int64_t(r->samples.size()) < P * G; ++b) {
    // Prompt positions [first, first + P) of the stream, each epoch in its
    // own order.
    const int64_t first = (round * batches + b) * P;
    std::vector<int64_t> at(static_cast<size_t>(P));
    for (int64_t i = 0; i < P; ++i) at[size_t(i)] = order.at(first + i);
    Batch bt = generate_batch(model, *prompts_, at, uint64_t(first));
    ++made;
    if (parts.empty()) parts.assign(bt.parts.size(), {});
    if (spare_parts.empty()) spare_parts.assign(bt.parts.size(), {});
    std::vector<double> rewards;
    for (const Rollout& x : bt.samples) rewards.push_back(x.reward);
    const std::vector<bool> varied = groups_with_variance(rewards, G);
    for (int64_t g = 0; g < P; ++g) {
      ++total_groups;
      zero_std += !varied[size_t(g)];
      const bool keep = !rl_.dynamic_sampling || varied[size_t(g)];
      const bool room = int64_t(r->samples.size()) < P * G;
      for (int64_t i = g * G; i < (g + 1) * G; ++i) {
        std::vector<Rollout>& to = keep && room ? r->samples : spare;
        std::vector<std::vector<double>>& to_parts = keep && room ? parts : spare_parts;
        to.push_back(std::move(bt.samples[size_t(i)]));
        for (size_t q = 0; q < bt.parts.size(); ++q) to_parts[q].push_back(bt.parts[q][size_t(i)]);
      }
    }
  }
  int64_t filled = 0;
  for (size_t i = 0; int64_t(r->samples.size()) < P * G; ++i) {  // dynamic sampling ran out
    r->samples.push_back(std::move(spare[i]));
    for (size_t q = 0; q < parts.size(); ++q) parts[q].push_back(spare_parts[q][i]);
    filled += int64_t(i % size_t(G) == 0);
  }
  r->parts = parts_;
  for (size_t q = 0; q < parts_.size(); ++q) r->parts[q].values = std::move(parts[q]);
  const auto t0 = Clock::now();
  const ObjectiveMetrics extra = finish_round(model, *r);
  const double logp_s = seconds_since(t0);

  // The round's figures (every rank holds the whole round).
  ObjectiveMetrics& m = round_metrics_;
  m.clear();
  const double n = double(r->samples.size());
  double sum = 0, len = 0, max_len = 0, clipped = 0;
  for (const Rollout& x : r->samples) {
    sum += x.reward;
    len += double(x.completion());
    max_len = std::max(max_len, double(x.completion()));
    clipped += x.truncated;
  }
  RewardScores all;  // the whole round's, as the tally reads a batch
  for (const Rollout& x : r->samples) all.total.push_back(x.reward);
  all.parts = r->parts;
  RewardTally tally;
  tally.add(all);
  m = tally.figures();
  m.emplace_back("completions/mean_length", len / n);
  m.emplace_back("completions/max_length", max_len);
  m.emplace_back("completions/clipped_ratio", clipped / n);
  if (G > 1)  // PPO's single generations have no groups
    m.emplace_back("frac_reward_zero_std", double(zero_std) / double(total_groups));
  if (rl_.dynamic_sampling) {
    m.emplace_back("dynamic_sampling/batches", double(made));
    m.emplace_back("dynamic_sampling/filled_groups", double(filled));
  }
  m.insert(m.end(), extra.begin(), extra.end());
  m.emplace_back("generate_s", gen_seconds_);
  m.emplace_back("score_s", score_seconds_);
  m.emplace_back("logps_s", logp_s);
  if (whole) m.emplace_back("gather_policy_s", gather_s);
  m.emplace_back("generate_tokens_per_s",
                 gen_seconds_ > 0 ? double(gen_tokens_) / gen_seconds_ : 0.0);
  NK_INFO(
      "align: round {}: {} completions, reward {:.4f}, mean length {:.1f}; generated {} tokens "
      "in {:.2f} s ({:.0f} tokens/s, this rank), scored in {:.2f} s",
      round, r->samples.size(), sum / n, len / n, gen_tokens_, gen_seconds_,
      gen_seconds_ > 0 ? double(gen_tokens_) / gen_seconds_ : 0.0, score_seconds_);
  if (rl_.log_completions_every > 0 && round % rl_.log_completions_every == 0 && ranks_.writes)
    log_completions(*r);
  // (Kept only while another round follows in this run: the export at the
  // end gathers the whole model again.)
  const bool more = schedule_.round_of_step(cfg_.steps - 1) > round;
  if (whole && more && whole->layout().trainable_end() < whole->layout().total()) {
    if (!kept)
      NK_INFO(
          "align: the policy gathered whole on every rank ({:.1f} MiB of weights) is kept for "
          "the next rounds, which gather its {} trainable parameters alone",
          double(whole->weight_bytes()) / 1048576.0, whole->layout().trainable_end());
    whole_ = std::move(whole);
  }
  return r;
}

ObjectiveMetrics OnlineObjective::validate(Transformer& policy) {
  if (!valid_prompts_) return {};
  // The round's timers are the round's: put back after.
  const double gen_s = gen_seconds_, score_s = score_seconds_;
  const int64_t gen_tokens = gen_tokens_;
  gen_seconds_ = score_seconds_ = 0;
  gen_tokens_ = 0;
  // With the live weights, gathered whole where the model is in pieces (as
  // a round is; a copy kept over a frozen base stays kept).
  const bool kept = whole_ != nullptr;
  std::unique_ptr<Transformer> whole =
      ranks_.whole_policy ? ranks_.whole_policy(std::move(whole_)) : nullptr;
  Transformer& model = whole ? *whole : policy;
  // Every validation prompt in file order, G completions each, in batches of
  // a round's prompts, drawn from seeds of their own (the same at every
  // validation, none of the rounds').
  const int64_t n = int64_t(valid_prompts_->tokens.size()), P = rl_.rollout_prompts;
  RewardTally tally;
  double count = 0, len = 0, clipped = 0;
  for (int64_t first = 0; first < n; first += P) {
    std::vector<int64_t> at(static_cast<size_t>(std::min(P, n - first)));
    for (size_t i = 0; i < at.size(); ++i) at[i] = first + int64_t(i);
    Batch b = generate_batch(model, *valid_prompts_, at, kValidSeeds + uint64_t(first));
    RewardScores sc;
    for (const Rollout& x : b.samples) {
      sc.total.push_back(x.reward);
      count += 1;
      len += double(x.completion());
      clipped += x.truncated;
    }
    for (size_t q = 0; q < parts_.size(); ++q)
      sc.parts.push_back({parts_[q].name, parts_[q].weight, parts_[q].verifiable, b.parts[q]});
    tally.add(sc);
  }
  ObjectiveMetrics m = tally.figures();
  m.emplace_back("completions/mean_length", len / count);
  m.emplace_back("completions/clipped_ratio", clipped / count);
  NK_INFO("align: validation on {} prompts x {}: reward {:.4f}, mean length {:.1f}", n,
          rl_.sampling.num_rollouts, m.empty() ? 0.0 : m.front().second, len / count);
  if (kept) whole_ = std::move(whole);
  gen_seconds_ = gen_s, score_seconds_ = score_s;
  gen_tokens_ = gen_tokens;
  return m;
}

std::vector<int64_t> OnlineObjective::own_samples() const {
  const int64_t GB = cfg_.global_batch, B = cfg_.micro_batch;
  const int64_t local = cfg_.grad_accum() / ranks_.dp;
  std::vector<int64_t> own;
  for (int64_t u = 0; u < schedule_.samples / GB; ++u)
    for (int64_t m = 0; m < local; ++m) {
      const int64_t first = dp_micro_batch_first_sample(u * GB, m, ranks_.dp, ranks_.dp_rank, B);
      for (int64_t k = first; k < first + B; ++k) own.push_back(k);
    }
  std::sort(own.begin(), own.end());
  return own;
}

void OnlineObjective::token_logps(Transformer& model, const std::vector<const Rollout*>& rows,
                                  std::vector<std::vector<float>>& out,
                                  std::vector<std::vector<float>>* values) {
  const int64_t peers = ranks_.replica_peers;
  if (peers == 1) return rows_token_logps(model, rows, out, values);
  // The replica's peers (each with the whole policy) split its rows, then
  // sum every row's values in: [logps..., values...] per row, row by row.
  std::vector<const Rollout*> mine;
  for (size_t i = size_t(ranks_.replica_peer); i < rows.size(); i += size_t(peers))
    mine.push_back(rows[i]);
  std::vector<std::vector<float>> lp, v;
  rows_token_logps(model, mine, lp, values ? &v : nullptr);
  const int64_t per = values ? 2 : 1;
  std::vector<size_t> at(rows.size() + 1, 0);
  for (size_t i = 0; i < rows.size(); ++i) at[i + 1] = at[i] + size_t(per * rows[i]->completion());
  std::vector<double> sum(at.back(), 0.0);
  for (size_t j = 0; j < mine.size(); ++j) {
    const size_t i = size_t(ranks_.replica_peer) + j * size_t(peers), n = lp[j].size();
    std::copy(lp[j].begin(), lp[j].end(), sum.begin() + int64_t(at[i]));
    if (values) std::copy(v[j].begin(), v[j].end(), sum.begin() + int64_t(at[i] + n));
  }
  ranks_.sum_over_replica_peers(sum);
  out.assign(rows.size(), {});
  if (values) values->assign(rows.size(), {});
  for (size_t i = 0; i < rows.size(); ++i) {
    const auto first = sum.begin() + int64_t(at[i]);
    const int64_t n = rows[i]->completion();
    out[i].assign(first, first + n);
    if (values) (*values)[i].assign(first + n, first + 2 * n);
  }
}

void OnlineObjective::rows_token_logps(Transformer& model, const std::vector<const Rollout*>& rows,
                                       std::vector<std::vector<float>>& out,
                                       std::vector<std::vector<float>>* values) {
  const int64_t B = cfg_.micro_batch, T = cfg_.seq_len;
  out.assign(rows.size(), {});
  if (values) values->assign(rows.size(), {});
  std::vector<float> v(values ? size_t(B * T) : 0);
  if (rows.empty()) return;
  Activations a(model, B, T, false);
  std::vector<int32_t> tokens(size_t(B * T)), targets(size_t(B * T));
  std::vector<float> nll(size_t(B * T));
  Tensor tt = Tensor::empty({B, T}, DType::I32, model.device()),
         tg = Tensor::empty({B, T}, DType::I32, model.device());
  const int32_t pad = std::max(0, tok_->eod_id());
  for (size_t first = 0; first < rows.size(); first += size_t(B)) {
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = first + size_t(b);
      int32_t* tk = tokens.data() + b * T;
      int32_t* tr = targets.data() + b * T;
      if (i < rows.size()) {
        rollout_row(*rows[i], T, pad, tk, tr);
      } else {
        std::fill(tk, tk + T, pad);
        std::fill(tr, tr + T, -100);
      }
    }
    ops::copy_bytes_from_host(tt, tokens.data());
    ops::copy_bytes_from_host(tg, targets.data());
    model.embed_forward(a, tt);
    model.blocks_forward(a, 0, model.config().n_layer);
    model.head_token_nll(a, tg, nll);
    if (values && critic_)
      critic_->forward(tt, v);
    else if (values)
      model.value_forward(a, v);
    for (int64_t b = 0; b < B && first + size_t(b) < rows.size(); ++b) {
      const Rollout& r = *rows[first + size_t(b)];
      std::vector<float>& o = out[first + size_t(b)];
      o.resize(size_t(r.completion()));
      for (int64_t c = 0; c < r.completion(); ++c)  // position prompt_len - 1 + c predicts it
        o[size_t(c)] = -nll[size_t(b * T + r.prompt_len - 1 + c)];
      if (!values) continue;
      std::vector<float>& ov = (*values)[first + size_t(b)];
      ov.assign(v.begin() + b * T + r.prompt_len - 1,
                v.begin() + b * T + r.prompt_len - 1 + r.completion());
    }
  }
}

ObjectiveMetrics OnlineObjective::finish_round(Transformer& model, RolloutRound& r) {
  const int64_t G = rl_.sampling.num_rollouts;
  NK_CHECK(int64_t(r.samples.size()) == schedule_.samples, "a round of {} completions, not {}",
           r.samples.size(), schedule_.samples);
  const bool rloo_kl = rl_.loss.algorithm == RlAlgorithm::Rloo && rl_.loss.kl_coef > 0;
  const bool need_ref = rl_.loss.kl_coef > 0;
  const bool need_old = needs_old_logps();
  std::vector<const Rollout*> rows;
  const std::vector<int64_t> own = own_samples();
  for (int64_t k : own) rows.push_back(&r.samples[size_t(k)]);
  const bool ppo = rl_.loss.algorithm == RlAlgorithm::Ppo;
  std::vector<std::vector<float>> lp, values;
  if (need_old) {
    token_logps(model, rows, lp, ppo ? &values : nullptr);
    for (size_t j = 0; j < own.size(); ++j) {
      Rollout& x = r.samples[size_t(own[j])];
      x.old_logp = std::move(lp[j]);
      if (ppo) x.old_value = std::move(values[j]);
    }
  }
  if (need_ref) {
    if (ref_model_) {
      token_logps(*ref_model_, rows, lp);
    } else {
      const bool on = model.adapters_enabled();
      model.set_adapters_enabled(false);
      token_logps(model, rows, lp);
      model.set_adapters_enabled(on);
    }
    for (size_t j = 0; j < own.size(); ++j) r.samples[size_t(own[j])].ref_logp = std::move(lp[j]);
  }
  if (ppo) return ppo_advantages(r, own);
  std::vector<double> rewards;
  for (const Rollout& x : r.samples) rewards.push_back(x.reward);
  if (rloo_kl) {  // RLOO: the sequence's KL (k1, the sampling policy's) taken off its reward
    std::vector<double> kl(r.samples.size(), 0.0);
    for (int64_t k : own) {
      const Rollout& x = r.samples[size_t(k)];
      for (size_t c = 0; c < x.old_logp.size(); ++c)
        kl[size_t(k)] += double(x.old_logp[c]) - double(x.ref_logp[c]);
    }
    ranks_.sum_over_ranks(kl);
    for (size_t k = 0; k < rewards.size(); ++k) rewards[k] -= rl_.loss.kl_coef * kl[k];
  }
  const std::vector<double> adv = rl_advantages(rl_.loss, rewards, G);
  for (size_t k = 0; k < r.samples.size(); ++k) r.samples[k].advantage = adv[k];
  return {};
}

ObjectiveMetrics OnlineObjective::ppo_advantages(RolloutRound& r, const std::vector<int64_t>& own) {
  const RlLossConfig& c = rl_.loss;
  const bool with_ref = c.kl_coef > 0;
  auto trained = [&](const Rollout& x) {
    return x.completion() > 0 && !(rl_.mask_truncated && x.truncated);
  };
  // Per-token rewards: -kl_coef x k1 KL, the score on the last token.
  std::vector<std::vector<double>> rewards(own.size());
  std::vector<double> sums(5, 0.0);  // sequences, KL sums, and the rewards' moments
  for (size_t j = 0; j < own.size(); ++j) {
    const Rollout& x = r.samples[size_t(own[j])];
    std::vector<double>& rw = rewards[j];
    rw.assign(size_t(x.completion()), 0.0);
    double kl = 0;
    for (int64_t t = 0; t < x.completion() && with_ref; ++t) {
      const double k1 = double(x.old_logp[size_t(t)]) - double(x.ref_logp[size_t(t)]);
      kl += k1;
      rw[size_t(t)] = -c.kl_coef * k1;
    }
    if (!rw.empty()) rw.back() += x.reward;
    sums[0] += 1;
    sums[1] += kl;
    if (!trained(x)) continue;
    for (double v : rw) {
      sums[2] += 1;
      sums[3] += v;
      sums[4] += v * v;
    }
  }
  ranks_.sum_over_ranks(sums);
  const Moments reward_moments{sums[2], sums[3], sums[4]};
  // GAE over each sequence, then the advantages' moments over the round.
  std::vector<double> adv_sums(3, 0.0);
  std::vector<std::vector<double>> adv(own.size()), ret(own.size());
  for (size_t j = 0; j < own.size(); ++j) {
    Rollout& x = r.samples[size_t(own[j])];
    std::vector<double>& rw = rewards[j];
    if (c.whiten_rewards && reward_moments.n >= 2)
      for (double& v : rw) v = reward_moments.whiten(v, false);
    const std::vector<double> values(x.old_value.begin(), x.old_value.end());
    adv[j].assign(rw.size(), 0.0);
    ret[j].assign(rw.size(), 0.0);
    gae(rw, values, c.gamma, c.lam, adv[j], ret[j]);
    if (!trained(x)) continue;
    for (double v : adv[j]) {
      adv_sums[0] += 1;
      adv_sums[1] += v;
      adv_sums[2] += v * v;
    }
  }
  ranks_.sum_over_ranks(adv_sums);
  const Moments adv_moments{adv_sums[0], adv_sums[1], adv_sums[2]};
  for (size_t j = 0; j < own.size(); ++j) {
    Rollout& x = r.samples[size_t(own[j])];
    x.token_adv.resize(adv[j].size());
    x.returns.resize(ret[j].size());
    for (size_t t = 0; t < adv[j].size(); ++t) {
      x.token_adv[t] = float(adv_moments.n >= 2 ? adv_moments.whiten(adv[j][t], true) : 0.0);
      x.returns[t] = float(ret[j][t]);
    }
  }
  // TRL's objective/ figures: per-sequence KL sums, their penalty, and the
  // score less it.
  const double kl = sums[0] > 0 ? sums[1] / sums[0] : 0.0;
  double score = 0;
  for (const Rollout& x : r.samples) score += x.reward;
  score /= double(r.samples.size());
  ObjectiveMetrics m;
  if (with_ref) {
    m.emplace_back("objective/kl", kl);
    m.emplace_back("objective/non_score_reward", -c.kl_coef * kl);
  }
  m.emplace_back("objective/rlhf_reward", score - c.kl_coef * kl);
  return m;
}

bool OnlineObjective::steps_read_ref_logps() const {
  // GRPO's per-token KL term (RLOO's and PPO's KL is in the round's rewards).
  return rl_.loss.kl_coef > 0 && rl_.loss.algorithm == RlAlgorithm::Grpo;
}

bool OnlineObjective::needs_old_logps() const {
  // Several updates a round: later ones are off-policy. RLOO's KL penalty
  // reads the sampling policy's log-probabilities; PPO's values come from
  // the same pass.
  return schedule_.steps > 1 || rl_.loss.algorithm == RlAlgorithm::Ppo ||
         (rl_.loss.algorithm == RlAlgorithm::Rloo && rl_.loss.kl_coef > 0);
}

void OnlineObjective::set_round(Transformer& model, std::shared_ptr<RolloutRound> round) {
  round_ = std::move(round);
  finish_round(model, *round_);
  dataset_->set_round(round_);
}

double OnlineObjective::train_micro_batch(Transformer& model, Activations& a,
                                          const MicroBatch& batch, float grad_scale) {
  return whole_micro_batch(model, a, batch, true,
                           [&] { return head_micro_batch(model, a, batch, grad_scale, true); });
}

double OnlineObjective::eval_micro_batch(Transformer&, Activations&, const MicroBatch&) {
  NK_CHECK(false, "online RL has no validation micro-batches");
  return 0;
}

double OnlineObjective::head_micro_batch(Transformer& model, Activations& a,
                                         const MicroBatch& batch, float grad_scale, bool train) {
  NK_CHECK(train, "online RL has no validation micro-batches");
  const int64_t B = a.B, T = a.T, GB = cfg_.global_batch;
  std::vector<float> nll(size_t(B * T));
  model.head_token_nll(a, batch.targets, nll);
  const bool need_old = needs_old_logps();
  const bool with_ref = steps_read_ref_logps();
  const bool ppo = rl_.loss.algorithm == RlAlgorithm::Ppo;
  auto masked = [&](const Rollout& r) { return rl_.mask_truncated && r.truncated; };
  std::vector<float> values(ppo ? size_t(B * T) : 0), value_grad(values.size(), 0.f);
  // The step's completion tokens (dapo's denominator), over every rank's samples.
  double step_tokens = 0;
  if (rl_.loss.loss_type == RlLossType::Dapo) {
    const int64_t s0 = batch.first_sample / GB * GB;
    for (int64_t i = s0; i < s0 + GB; ++i) {
      const Rollout& r = dataset_->rollout(i);
      if (!masked(r)) step_tokens += double(r.completion());
    }
  }
  const double accum = double(cfg_.grad_accum());
  std::vector<float> scale(size_t(B * T), 0.f);
  const int32_t* tg = batch.host_targets.data<int32_t>();
  // Context parallel: this rank holds chunks of each row, position j of
  // them at the row's position pos[j] (every row alike); each token's term
  // is its own, so a rank adds those of its tokens and the cp ranks' sums
  // make the loss and the gradient.
  std::vector<int64_t> pos(static_cast<size_t>(T));
  for (int64_t j = 0; j < T; ++j) pos[size_t(j)] = j;
  if (ranks_.cp > 1) {
    NK_CHECK(batch.packed && batch.packed->position_ids.defined() &&
                 batch.packed->position_ids.device() == kHost,
             "online RL under context parallelism: the micro-batch's positions");
    const int32_t* p = batch.packed->position_ids.data<int32_t>();
    for (int64_t j = 0; j < T; ++j) pos[size_t(j)] = p[j];
  }
  // A critic of its own is whole: it reads whole rows (under context
  // parallelism every cp rank the same ones, of which it keeps its chunks'
  // positions: critic_at).
  const Tensor& critic_rows = batch.whole_tokens ? *batch.whole_tokens : batch.tokens;
  const int64_t CT = critic_rows.dim(1);
  const auto critic_at = [&](int64_t b, int64_t j) { return size_t(b * CT + pos[size_t(j)]); };
  if (ppo && critic_) {
    std::vector<float> v(size_t(B * CT));
    critic_->forward(critic_rows, v);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < T; ++j) values[size_t(b * T + j)] = v[critic_at(b, j)];
  } else if (ppo) {
    model.value_forward(a, values);
  }
  double loss = 0;
  for (int64_t b = 0; b < B; ++b) {
    const Rollout& r = dataset_->rollout(batch.first_sample + b);
    if (masked(r) || r.completion() == 0) continue;
    NK_CHECK(!need_old || int64_t(r.old_logp.size()) == r.completion(),
             "online RL: sample {} has no old log-probabilities on this rank",
             batch.first_sample + b);
    NK_CHECK(!ppo || int64_t(r.token_adv.size()) == r.completion(),
             "ppo: sample {} has no advantages on this rank", batch.first_sample + b);
    double w = 0;  // the weight of each of its token terms in the step's loss
    switch (rl_.loss.loss_type) {
      case RlLossType::Grpo:
        w = 1.0 / (double(r.completion()) * double(GB));
        break;
      case RlLossType::DrGrpo:
        w = 1.0 / (double(GB) * double(rl_.sampling.max_tokens));
        break;
      case RlLossType::Dapo:
        w = step_tokens > 0 ? 1.0 / step_tokens : 0.0;
        break;
    }
    for (int64_t j = 0; j < T; ++j) {
      const int64_t t = pos[size_t(j)], c = t - (r.prompt_len - 1), at = b * T + j;
      if (c < 0 || c >= r.completion()) continue;  // position t predicts token t + 1
      NK_CHECK(tg[at] == r.tokens[size_t(t + 1)], "online RL: row {} position {}", b, t);
      const double logp = -double(nll[size_t(at)]);
      const double old = need_old ? double(r.old_logp[size_t(c)]) : logp;
      const double ref = with_ref ? double(r.ref_logp[size_t(c)]) : 0.0;
      const double adv = ppo ? double(r.token_adv[size_t(c)]) : r.advantage;
      const RlTokenTerm term = rl_token_term(rl_.loss, logp, old, ref, with_ref, adv);
      loss += w * term.loss;
      // d loss / d nll = -d loss / d logp, with the loop's scale (1 / accum).
      scale[size_t(at)] = float(-term.dlogp * w * accum * double(grad_scale));
      if (ppo) {
        const RlValueTerm vt =
            ppo_value_term(rl_.loss, double(values[size_t(at)]), double(r.old_value[size_t(c)]),
                           double(r.returns[size_t(c)]));
        const double vw = w * rl_.loss.vf_coef;
        loss += vw * vt.loss;
        value_grad[size_t(at)] = float(vt.dvalue * vw * accum * double(grad_scale));
        sums_.pg += term.loss;
        sums_.vf += vt.loss;
        sums_.vclip += vt.clipped;
      }
      sums_.tokens += 1;
      sums_.kl += term.kl;
      sums_.low += term.low_clipped;
      sums_.high += term.high_clipped;
      sums_.nll += -logp;
    }
  }
  if (critic_ && ranks_.own_grads) {
    std::vector<float> dv(size_t(B * CT), 0.f);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < T; ++j) dv[critic_at(b, j)] = value_grad[size_t(b * T + j)];
    critic_->backward(critic_rows, dv);
  }
  model.head_token_backward(a, batch.targets, scale,
                            critic_ ? std::span<const float>() : std::span<const float>(value_grad),
                            moe_grad_scale(grad_scale));
  return loss * accum + moe_loss(model, a);
}

double OnlineObjective::own_grad_norm_squared() {
  return critic_ ? critic_->reduce_grads(ranks_.sum_own_grads) : 0.0;
}

void OnlineObjective::own_step(double lr, float clip) {
  // align.critic_lr: the policy's schedule scaled to the critic's peak.
  if (critic_) critic_->step(rl_.critic_lr > 0 ? lr * rl_.critic_lr / cfg_.lr.lr : lr, clip);
}

void OnlineObjective::save_state(int64_t step) {
  if (!critic_) return;
  critic_->save_checkpoint(step, ranks_.writes);
  if (step == cfg_.steps && ranks_.writes) critic_->export_model();
}

ObjectiveMetrics OnlineObjective::take_metrics(bool eval) {
  ObjectiveMetrics m;
  if (eval) return m;
  std::vector<double> v = {sums_.tokens, sums_.kl, sums_.low, sums_.high,
                           sums_.nll,    sums_.pg, sums_.vf,  sums_.vclip};
  ranks_.sum_over_sequence(v);  // context parallel: each rank's tokens
  sum_figures(v, false);
  sums_ = Sums();
  if (v[0] > 0) {
    if (rl_.loss.kl_coef > 0 && rl_.loss.algorithm == RlAlgorithm::Grpo)
      m.emplace_back("kl", v[1] / v[0]);
    m.emplace_back("clip_ratio/low_mean", v[2] / v[0]);
    m.emplace_back("clip_ratio/high_mean", v[3] / v[0]);
    m.emplace_back("clip_ratio/region_mean", (v[2] + v[3]) / v[0]);
    m.emplace_back("entropy", v[4] / v[0]);
    if (rl_.loss.algorithm == RlAlgorithm::Ppo) {  // TRL's loss/policy_avg, loss/value_avg, ...
      m.emplace_back("loss/policy", v[5] / v[0]);
      m.emplace_back("loss/value", v[6] / v[0]);
      m.emplace_back("val/clipfrac", v[7] / v[0]);
    }
  }
  m.insert(m.end(), round_metrics_.begin(), round_metrics_.end());
  round_metrics_.clear();
  return m;
}

void OnlineObjective::log_completions(const RolloutRound& r) {
  const std::string path = (std::filesystem::path(cfg_.out_dir) / "completions.jsonl").string();
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) fail("{}: cannot append: {}", path, std::strerror(errno));
  for (size_t k = 0; k < r.samples.size(); ++k) {
    const Rollout& x = r.samples[k];
    nlohmann::ordered_json j;
    j["round"] = r.index;
    j["step"] = schedule_.first_step(r.index) + 1;
    j["prompt"] = prompts_->records.prompts[size_t(x.prompt)];
    j["completion"] =
        tok_->decode(std::span<const int32_t>(x.tokens).subspan(size_t(x.prompt_len)));
    j["reward"] = x.reward;
    if (rl_.loss.algorithm != RlAlgorithm::Ppo)
      j["advantage"] = x.advantage;  // PPO's are per token
    for (const RewardScores::Part& q : r.parts) j["rewards"][q.name] = q.values[k];
    j["truncated"] = x.truncated;
    const std::string line =
        j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
    if (std::fwrite(line.data(), 1, line.size(), f) != line.size()) {
      std::fclose(f);
      fail("{}: cannot append: {}", path, std::strerror(errno));
    }
  }
  if (std::fclose(f) != 0) fail("{}: cannot append: {}", path, std::strerror(errno));
}

}  // namespace nk
