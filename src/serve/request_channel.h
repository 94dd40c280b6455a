// The tokens of one HTTP request's sequences, passed from the engine thread
// (which owns the Generator) to the HTTP side answering the request: a thread
// that blocks in wait(), or a connection that on_ready() wakes.
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "infer/generate.h"
#include "serve/api_error.h"

namespace nk {

using ServeClock = std::chrono::steady_clock;

// One sampled token of one of the request's sequences (its "choice").
struct StreamEvent {
  int64_t choice = 0;
  int32_t token = 0;
  std::string piece;  // text that became final with it (TokenEvent::piece)
  bool finished = false;
  FinishReason finish = FinishReason::Length;  // when finished; Eos: `token` is the eod id
  float logprob = 0;                           // with the request's logprobs
  std::vector<TokenLogprob> top;
};

class RequestChannel {
 public:
  RequestChannel(int64_t sequences, ServeClock::time_point arrival)
      : sequences_(sequences), arrival_(arrival) {}

  int64_t sequences() const { return sequences_; }
  ServeClock::time_point arrival() const { return arrival_; }

  // HTTP side: waits up to `timeout` (0: not at all) for events and moves
  // them to the end of `out`. Throws the request's error once the engine has
  // failed it and every event before the failure has been taken.
  void wait(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout);
  // HTTP side, for a reader that does not block: `f` is called whenever
  // events or the error arrive (on the engine thread; at once when some are
  // already waiting); null removes it. `f` must be cheap and never throw.
  void on_ready(std::function<void()> f);
  // Asks the engine to end the request's sequences (the client is gone).
  void cancel() { cancelled_.store(true); }
  bool cancelled() const { return cancelled_.load(); }

  // Engine side.
  void push(std::vector<StreamEvent>& events);  // moves them in
  void fail(const ApiError& e);

  // Engine thread only: sequences not finished yet, for the request's latency.
  int64_t open = 0;

 private:
  const int64_t sequences_;
  const ServeClock::time_point arrival_;
  std::atomic<bool> cancelled_{false};
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<StreamEvent> events_;
  std::optional<ApiError> error_;
  std::function<void()> ready_;  // (mu_)
};

}  // namespace nk
