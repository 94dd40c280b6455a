// The serving engine: one thread owns the Generator (which is not
// thread-safe) and loops: take newly submitted requests from the inbox,
// submit them, run one decode step, hand each token to its request's
// channel. New requests join between steps (in-flight batching, first come
// first served: the Generator's queue). HTTP threads only touch the inbox
// and their own RequestChannel.
#pragma once
#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "infer/generate.h"
#include "serve/request_channel.h"
#include "serve/serve_metrics.h"

namespace nk {

class Engine {
 public:
  // batch: sequences decoded together; the cache must hold at least that many.
  Engine(Transformer& model, const Tokenizer& tok, std::unique_ptr<SequenceCache> cache,
         int64_t batch, ServeMetrics& metrics);
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
  // Ends the loop: every unfinished request is failed with 503. Idempotent.
  void stop();

 private:
  struct Pending {
    std::shared_ptr<RequestChannel> channel;
    std::vector<GenerationRequest> sequences;
  };
  struct Running {
    std::shared_ptr<RequestChannel> channel;
    int64_t choice = 0;
    ServeClock::time_point last;  // its previous token
    bool started = false;         // a token came
  };

  void loop();
  void admit(Pending& p);
  void drop_cancelled();
  void deliver(std::span<const TokenEvent> events);
  void fail_all(const ApiError& e);
  void publish_gauges(int64_t inbox);

  Generator gen_;
  ServeMetrics& metrics_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Pending> inbox_;  // guarded by mu_
  bool cancels_ = false;        // a channel was cancelled since the last look (mu_)
  bool stopping_ = false;       // (mu_)

  std::unordered_map<int64_t, Running> running_;  // by Generator id; engine thread only
  int64_t preemptions_ = 0, prefix_hits_ = 0;     // the Generator's counts published so far
  std::thread thread_;
};

}  // namespace nk
