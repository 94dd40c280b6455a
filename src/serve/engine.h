// The serving engine: one thread owns the Generator (which is not
// thread-safe) and loops: take newly submitted requests from the inbox,
// submit them, run one decode step, hand each token to its request's
// channel. New requests join between steps (in-flight batching, first come
// first served: the Generator's queue). HTTP threads only touch the inbox
// and their own RequestChannel. Other work on the model (the guardrails'
// perplexity) comes as jobs the loop runs between two steps: the model's
// kernels keep scratch buffers and may run on one thread only.
#pragma once
#include <condition_variable>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "infer/generate.h"
#include "serve/engine_mirror.h"
#include "serve/request_channel.h"
#include "serve/serve_metrics.h"

namespace nk {

class Engine {
 public:
  // batch: sequences decoded together; the cache must hold at least that many.
  // end_ids: ids besides the eod that end a sequence (Generator::set_end_ids).
  // mirror: under tensor parallelism (serve.tp) rank 0's, which the other
  // ranks follow (serve/engine_mirror.h); jobs are then refused (400).
  Engine(Transformer& model, const Tokenizer& tok, std::unique_ptr<SequenceCache> cache,
         int64_t batch, ServeMetrics& metrics, std::vector<int32_t> end_ids = {},
         EngineMirror* mirror = nullptr);
  ~Engine();  // stop()
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Queues one request's sequences (its choices, in order); their events
  // arrive on the returned channel. A sequence the Generator refuses fails
  // the request (400) and cancels its other sequences. After stop(), the
  // channel is failed at once (503).
  std::shared_ptr<RequestChannel> submit(std::vector<GenerationRequest> sequences,
                                         ServeClock::time_point arrival);
  // Ends the channel's sequences at the next step boundary, freeing their
  // cache room. From any thread; idempotent.
  void cancel(RequestChannel& channel);
  // Ends one sequence of the channel (choice `choice`) at the next step
  // boundary; its channel gets no more events for it (an output guardrail
  // refused it). From any thread; idempotent.
  void cancel(const std::shared_ptr<RequestChannel>& channel, int64_t choice);
  // Runs `job` on the engine thread between two decode steps, with the
  // model. The future is ready once it ran (holding what it threw), or with
  // ApiError 503 when the engine stops first.
  std::future<void> run_job(std::function<void(Transformer&)> job);
  // Ends the loop: every unfinished request is failed with 503. Idempotent.
  void stop();

 private:
  struct Pending {
    std::shared_ptr<RequestChannel> channel;
    std::vector<GenerationRequest> sequences;
  };
  struct Job {
    std::function<void(Transformer&)> fn;
    std::promise<void> done;
  };
  struct Running {
    std::shared_ptr<RequestChannel> channel;
    int64_t choice = 0;
    ServeClock::time_point last;  // its previous token
    bool started = false;         // a token came
  };

  void loop();
  void admit(Pending& p);
  void drop_cancelled(
      const std::vector<std::pair<std::shared_ptr<RequestChannel>, int64_t>>& choices);
  void run_jobs(std::vector<Job>& jobs);
  void deliver(std::span<const TokenEvent> events);
  void fail_all(const ApiError& e);
  void publish_gauges(int64_t inbox);
  // The Generator's changes, recorded for the mirror's followers.
  void end_sequence(int64_t id);  // cancel and release
  void release(int64_t id);

  Transformer& model_;
  Generator gen_;
  EngineMirror* mirror_;
  ServeMetrics& metrics_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> inbox_;  // guarded by mu_
  std::vector<Job> jobs_;       // (mu_)
  bool cancels_ = false;        // a channel was cancelled since the last look (mu_)
  // Single sequences to end: (channel, choice), cancel(channel, choice) (mu_).
  std::vector<std::pair<std::shared_ptr<RequestChannel>, int64_t>> choice_cancels_;
  bool stopping_ = false;  // (mu_)

  std::unordered_map<int64_t, Running> running_;  // by Generator id; engine thread only
  int64_t preemptions_ = 0, prefix_hits_ = 0;     // the Generator's counts published so far
  std::thread thread_;
};

}  // namespace nk
