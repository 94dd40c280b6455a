#include "core/stop_signal.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <thread>

#include "core/error.h"

namespace nk {
namespace {

std::atomic<int> g_signal{0};
std::atomic<bool> g_in_scope{false};
std::atomic<bool> g_thread_running{false};
sigset_t g_start_mask;  // the mask main() began with, for exec

sigset_t stop_set() {
  sigset_t s;
  sigemptyset(&s);
  sigaddset(&s, SIGTERM);
  sigaddset(&s, SIGINT);
  return s;
}

[[noreturn]] void take_signals() {
  const sigset_t set = stop_set();
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) != 0) continue;
    if (g_in_scope.load()) {
      g_signal.store(sig);
      continue;
    }
    // No scope: the signal's own disposition, as if it had never been
    // blocked (SIG_DFL ends the process by this signal, here and now).
    sigset_t one;
    sigemptyset(&one);
    sigaddset(&one, sig);
    pthread_sigmask(SIG_UNBLOCK, &one, nullptr);
    raise(sig);
    pthread_sigmask(SIG_BLOCK, &one, nullptr);  // a handler someone installed returned
  }
}

extern "C" void on_stop_signal(int sig) {
  g_signal.store(sig);  // lock-free atomic: async-signal-safe
}

struct sigaction g_old_term {
}, g_old_int{};

}  // namespace

void start_stop_signal_thread() {
  if (g_thread_running.exchange(true)) return;
  const sigset_t set = stop_set();
  NK_CHECK(pthread_sigmask(SIG_BLOCK, &set, &g_start_mask) == 0, "cannot block SIGTERM/SIGINT");
  std::thread(take_signals).detach();
}

bool stop_signal_thread_running() {
  return g_thread_running.load();
}

void unblock_stop_signals() {
  if (g_thread_running.load()) pthread_sigmask(SIG_SETMASK, &g_start_mask, nullptr);
}

StopSignalScope::StopSignalScope() {
  NK_CHECK(!g_in_scope.exchange(true), "StopSignalScope: one scope at a time");
  g_signal.store(0);
  if (g_thread_running.load()) return;
  handler_ = true;  // SA_RESTART: an interrupted read or write resumes
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, &g_old_term);
  sigaction(SIGINT, &sa, &g_old_int);
}

StopSignalScope::~StopSignalScope() {
  if (handler_) {
    sigaction(SIGTERM, &g_old_term, nullptr);
    sigaction(SIGINT, &g_old_int, nullptr);
  }
  g_in_scope.store(false);
}

int stop_signal() {
  return g_signal.load();
}

}  // namespace nk
