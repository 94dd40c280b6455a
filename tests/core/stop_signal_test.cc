// SIGTERM/SIGINT taken by a thread of their own (core/stop_signal.h). Each
// case runs in a fresh child process (gtest's threadsafe death-test style
// re-executes the binary), since the signal thread must start before any
// other thread and lives until the process ends.
#include "core/stop_signal.h"

#include <gtest/gtest.h>
#include <omp.h>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace nk {
namespace {

class StopSignal : public ::testing::Test {
 protected:
  void SetUp() override { GTEST_FLAG_SET(death_test_style, "threadsafe"); }
};

// stop_signal() once it is non-zero, or 0 after 10 s.
int wait_for_stop_signal() {
  for (int i = 0; i < 1000 && stop_signal() == 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return stop_signal();
}

bool blocked_here(int sig) {
  sigset_t s;
  pthread_sigmask(SIG_BLOCK, nullptr, &s);
  return sigismember(&s, sig) == 1;
}

// Of an OpenMP team of 4 and one std::thread, those with SIGTERM or SIGINT
// unblocked.
int threads_taking_stop_signals() {
  int n = 0;
#pragma omp parallel num_threads(4) reduction(+ : n)
  n += !blocked_here(SIGTERM) || !blocked_here(SIGINT);
  std::thread([&] { n += !blocked_here(SIGTERM) || !blocked_here(SIGINT); }).join();
  return n;
}

// Outside a scope a signal keeps its default action: the process ends by it.
TEST_F(StopSignal, OutsideAScopeTheProcessEndsByTheSignal) {
  EXPECT_EXIT(
      {
        start_stop_signal_thread();
        kill(getpid(), SIGTERM);
        std::this_thread::sleep_for(std::chrono::seconds(10));
        _exit(0);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

// Inside a scope it is recorded, and the process goes on.
TEST_F(StopSignal, InsideAScopeTheSignalIsRecorded) {
  EXPECT_EXIT(
      {
        start_stop_signal_thread();
        StopSignalScope scope;
        kill(getpid(), SIGINT);
        _exit(wait_for_stop_signal() == SIGINT ? 3 : 4);
      },
      ::testing::ExitedWithCode(3), "");
}

// A signal the parent set to SIG_IGN (a background job's SIGINT) stays ignored.
TEST_F(StopSignal, AnInheritedIgnoreStaysIgnored) {
  EXPECT_EXIT(
      {
        signal(SIGINT, SIG_IGN);
        start_stop_signal_thread();
        kill(getpid(), SIGINT);
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        _exit(5);
      },
      ::testing::ExitedWithCode(5), "");
}

// The point of the thread: no thread created after it (OpenMP's pool, where
// oneDNN's JIT kernels run, or any other) can take the signals in a handler.
TEST_F(StopSignal, ComputingThreadsNeverTakeTheSignals) {
  EXPECT_EXIT(
      {
        start_stop_signal_thread();
        _exit(threads_taking_stop_signals() == 0 ? 6 : 7);
      },
      ::testing::ExitedWithCode(6), "");
}

// exec'd programs (mpirun) get the mask main() started with.
TEST_F(StopSignal, UnblockRestoresTheStartingMask) {
  EXPECT_EXIT(
      {
        start_stop_signal_thread();
        const bool was = blocked_here(SIGTERM);
        unblock_stop_signals();
        _exit(was && !blocked_here(SIGTERM) ? 8 : 9);
      },
      ::testing::ExitedWithCode(8), "");
}

// Without the thread (a library user), a scope installs a handler instead.
TEST_F(StopSignal, WithoutTheThreadAScopeUsesAHandler) {
  EXPECT_EXIT(
      {
        {
          StopSignalScope scope;
          raise(SIGTERM);
          if (stop_signal() != SIGTERM) _exit(11);
        }
        raise(SIGTERM);  // the default action again after the scope
        _exit(10);
      },
      ::testing::KilledBySignal(SIGTERM), "");
}

}  // namespace
}  // namespace nk
