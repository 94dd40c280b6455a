#include "serve/engine.h"

#include <map>
#include <utility>

#include "core/log.h"

namespace nk {

namespace {

double seconds(ServeClock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

Engine::Engine(Transformer& model, const Tokenizer& tok, std::unique_ptr<SequenceCache> cache,
               int64_t batch, ServeMetrics& metrics, std::vector<int32_t> end_ids,
               EngineMirror* mirror)
    : model_(model),
      gen_(model, &tok, std::move(cache), batch),
      mirror_(mirror),
      metrics_(metrics) {
  gen_.set_end_ids(std::move(end_ids));
  thread_ = std::thread([this] { loop(); });
}

Engine::~Engine() {
  stop();
}

std::shared_ptr<RequestChannel> Engine::submit(std::vector<GenerationRequest> sequences,
                                               ServeClock::time_point arrival) {
  auto ch = std::make_shared<RequestChannel>(int64_t(sequences.size()), arrival);
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      inbox_.push_back({ch, std::move(sequences)});
      cv_.notify_all();
      return ch;
    }
  }
  ch->fail(ApiError(503, "The server is shutting down", "", "", "server_error"));
  return ch;
}

void Engine::cancel(RequestChannel& channel) {
  channel.cancel();
  std::lock_guard lock(mu_);
  cancels_ = true;
  cv_.notify_all();
}

void Engine::cancel(const std::shared_ptr<RequestChannel>& channel, int64_t choice) {
  std::lock_guard lock(mu_);
  choice_cancels_.emplace_back(channel, choice);
  cancels_ = true;
  cv_.notify_all();
}

std::future<void> Engine::run_job(std::function<void(Transformer&)> job) {
  Job j{std::move(job), {}};
  std::future<void> done = j.done.get_future();
  if (mirror_) {  // the model's forward would need every rank of the group
    j.done.set_exception(std::make_exception_ptr(
        ApiError(400,
                 "the prompt's log-probabilities ('echo' with 'logprobs') and the guardrails' "
                 "perplexity checks are not supported with serve.tp > 1 yet")));
    return done;
  }
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      jobs_.push_back(std::move(j));
      cv_.notify_all();
      return done;
    }
  }
  j.done.set_exception(std::make_exception_ptr(
      ApiError(503, "The server is shutting down", "", "", "server_error")));
  return done;
}

void Engine::run_jobs(std::vector<Job>& jobs) {
  for (Job& j : jobs) {
    try {
      j.fn(model_);
      j.done.set_value();
    } catch (...) {
      j.done.set_exception(std::current_exception());
    }
  }
  jobs.clear();
}

void Engine::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    cv_.notify_all();
  }
  if (thread_.joinable()) thread_.join();
}

void Engine::admit(Pending& p) {
  RequestChannel& ch = *p.channel;
  if (ch.cancelled()) return;
  std::vector<int64_t> ids;
  std::vector<StreamEvent> done;
  for (size_t i = 0; i < p.sequences.size(); ++i) {
    const int64_t prompt = int64_t(p.sequences[i].prompt.size());
    int64_t id = 0;
    try {
      if (mirror_) {
        id = gen_.submit(p.sequences[i]);
        mirror_->submitted(p.sequences[i]);
      } else {
        id = gen_.submit(std::move(p.sequences[i]));
      }
    } catch (const Error& e) {  // what the Generator refuses (checked before, so rare)
      for (int64_t other : ids) {
        end_sequence(other);
        running_.erase(other);
      }
      ch.fail(ApiError(400, e.what()));
      return;
    }
    metrics_.prompt_tokens.inc(double(prompt));
    ids.push_back(id);
    running_[id] = {p.channel, int64_t(i), {}, false};
    ++ch.open;
  }
  // A request with nothing to generate is finished at submission.
  for (int64_t id : ids)
    if (gen_.finished(id)) {
      done.push_back({running_[id].choice, 0, "", true, gen_.result(id).finish, 0, {}});
      release(id);
      running_.erase(id);
      --ch.open;
    }
  if (!done.empty()) ch.push(done);
}

void Engine::drop_cancelled(
    const std::vector<std::pair<std::shared_ptr<RequestChannel>, int64_t>>& choices) {
  auto one = [&](const Running& r) {
    for (const auto& [ch, choice] : choices)
      if (ch == r.channel && choice == r.choice) return true;
    return false;
  };
  for (auto it = running_.begin(); it != running_.end();) {
    const bool alone = !choices.empty() && one(it->second);
    if (alone) --it->second.channel->open;
    if (alone || it->second.channel->cancelled()) {
      end_sequence(it->first);
      it = running_.erase(it);
    } else {
      ++it;
    }
  }
}

void Engine::deliver(std::span<const TokenEvent> events) {
  const ServeClock::time_point now = ServeClock::now();
  // Each channel's events of this step, pushed together (one wake-up each).
  struct Batch {
    std::shared_ptr<RequestChannel> channel;  // alive while we push, whatever the client does
    std::vector<StreamEvent> events;
  };
  std::map<RequestChannel*, Batch> out;
  for (const TokenEvent& e : events) {
    auto it = running_.find(e.id);
    if (it == running_.end()) continue;
    Running& r = it->second;
    if (r.started)
      metrics_.inter_token_latency.observe(seconds(now - r.last));
    else
      metrics_.time_to_first_token.observe(seconds(now - r.channel->arrival()));
    r.started = true;
    r.last = now;
    metrics_.generation_tokens.inc();
    StreamEvent s{r.choice,
                  e.token,
                  std::string(e.piece),
                  e.finished,
                  FinishReason::Length,
                  e.logprob,
                  std::vector<TokenLogprob>(e.top.begin(), e.top.end())};
    Batch& b = out[r.channel.get()];
    if (!b.channel) b.channel = r.channel;
    RequestChannel& ch = *b.channel;
    if (e.finished) {
      s.finish = gen_.result(e.id).finish;
      release(e.id);
      running_.erase(it);
      if (--ch.open == 0) metrics_.request_latency.observe(seconds(now - ch.arrival()));
    }
    b.events.push_back(std::move(s));
  }
  // The gauges first: a client that sees its last token sees them without it.
  {
    std::lock_guard lock(mu_);
    publish_gauges(int64_t(inbox_.size()));
  }
  for (auto& [ch, b] : out) ch->push(b.events);
}

void Engine::fail_all(const ApiError& e) {
  for (auto& [id, r] : running_) {
    end_sequence(id);
    r.channel->fail(e);
  }
  running_.clear();
}

void Engine::end_sequence(int64_t id) {
  gen_.cancel(id);
  if (mirror_) mirror_->cancelled(id);
  release(id);
}

void Engine::release(int64_t id) {
  gen_.release(id);
  if (mirror_) mirror_->released(id);
}

void Engine::publish_gauges(int64_t inbox) {
  metrics_.running.set(double(gen_.running()));
  metrics_.waiting.set(double(gen_.waiting()));
  metrics_.queue_depth.set(double(inbox + gen_.waiting()));
  const SequenceCache& cache = *gen_.cache();
  metrics_.kv_blocks_used.set(double(cache.blocks_used()));
  metrics_.kv_blocks_total.set(double(cache.blocks_total()));
  metrics_.preemptions.inc(
      double(gen_.preemptions() - std::exchange(preemptions_, gen_.preemptions())));
  metrics_.prefix_hit_tokens.inc(
      double(gen_.prefix_hit_tokens() - std::exchange(prefix_hits_, gen_.prefix_hit_tokens())));
}

void Engine::loop() {
  for (;;) {
    std::vector<Pending> fresh;
    std::vector<Job> jobs;
    std::vector<std::pair<std::shared_ptr<RequestChannel>, int64_t>> choices;
    bool cancels = false, beat = false;
    {
      std::unique_lock lock(mu_);
      const auto ready = [&] {
        return stopping_ || !inbox_.empty() || !jobs_.empty() || cancels_ || !gen_.idle();
      };
      if (mirror_)  // an idle engine still tells its followers, each heartbeat
        beat = !cv_.wait_for(lock, mirror_->heartbeat(), ready);
      else
        cv_.wait(lock, ready);
      if (stopping_) {
        for (Pending& p : inbox_)
          p.channel->fail(ApiError(503, "The server is shutting down", "", "", "server_error"));
        inbox_.clear();
        for (Job& j : jobs_)
          j.done.set_exception(std::make_exception_ptr(
              ApiError(503, "The server is shutting down", "", "", "server_error")));
        jobs_.clear();
        break;
      }
      fresh.swap(inbox_);
      jobs.swap(jobs_);
      choices.swap(choice_cancels_);
      cancels = std::exchange(cancels_, false);
    }
    // Jobs first: the request waiting on one (a guardrail) is not decoding.
    run_jobs(jobs);
    // Nothing may escape this thread: a failure here fails the requests it
    // touches (500) and the server carries on.
    try {
      if (cancels) drop_cancelled(choices);
      for (Pending& p : fresh) admit(p);
      publish_gauges(0);
      // The step's state is unknown after a throw: every sequence ends
      // rather than decode from a cache that may be half written.
      if (!gen_.idle()) {
        if (mirror_) mirror_->send(EngineMirror::Then::Step);
        deliver(gen_.step());
      } else if (beat) {
        mirror_->send(EngineMirror::Then::Nothing);
      }
    } catch (const std::exception& e) {
      const ApiError err(500, std::string("Internal error while decoding: ") + e.what(), "", "",
                         "server_error");
      for (Pending& p : fresh) p.channel->fail(err);  // those not admitted yet
      fail_all(err);
      if (mirror_) mirror_->failed(e.what());
    }
  }
  fail_all(ApiError(503, "The server is shutting down", "", "", "server_error"));
  publish_gauges(0);
  if (mirror_) {
    try {
      mirror_->send(EngineMirror::Then::Stop);
    } catch (const std::exception& e) {  // the followers end at their timeout
      NK_WARN("nekton serve: the tensor-parallel ranks were not told to stop: {}", e.what());
    }
  }
}

}  // namespace nk
