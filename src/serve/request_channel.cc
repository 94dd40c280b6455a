#include "serve/request_channel.h"

namespace nk {

void RequestChannel::wait(std::vector<StreamEvent>& out, std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return !events_.empty() || error_; });
  // Events that came before a failure are still the client's.
  if (events_.empty() && error_) throw *error_;
  for (StreamEvent& e : events_) out.push_back(std::move(e));
  events_.clear();
}

void RequestChannel::on_ready(std::function<void()> f) {
  bool now = false;
  {
    std::lock_guard lock(mu_);
    ready_ = f;
    now = f && (!events_.empty() || error_);
  }
  if (now) f();
}

void RequestChannel::push(std::vector<StreamEvent>& events) {
  std::function<void()> ready;
  {
    std::lock_guard lock(mu_);
    for (StreamEvent& e : events) events_.push_back(std::move(e));
    ready = ready_;
  }
  events.clear();
  cv_.notify_all();
  if (ready) ready();
}

void RequestChannel::fail(const ApiError& e) {
  std::function<void()> ready;
  {
    std::lock_guard lock(mu_);
    if (!error_) error_ = e;
    ready = ready_;
  }
  cv_.notify_all();
  if (ready) ready();
}

}  // namespace nk
