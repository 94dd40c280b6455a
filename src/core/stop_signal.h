#pragma once
// SIGTERM and SIGINT as a request to stop, taken by a thread of their own.
//
// Why not a signal handler: a handler runs on whichever thread the kernel
// picks, on that thread's stack pointer. oneDNN's JIT GEMM kernels (x64;
// oneDNN issue #4845, fixed upstream after 3.11) point rsp into the heap
// while they run, so a handler arriving then writes its frame over heap
// memory and the process aborts later in free() ("corrupted size vs.
// prev_size"). Here no thread ever runs a handler: the signals are blocked
// in every thread, and one thread takes them with sigwait.
//
// start_stop_signal_thread() must run first in main(), before any other
// thread exists (threads inherit the blocked mask from the one that creates
// them). Outside a StopSignalScope a signal does what it did before (the
// default action: the process ends by that signal; an inherited SIG_IGN
// still ignores it). Inside one it only records the signal for
// stop_signal() to report.
//
// A process that never called start_stop_signal_thread() (a library user, a
// test binary) gets a plain handler from StopSignalScope instead, with the
// caveat above.

namespace nk {

void start_stop_signal_thread();
bool stop_signal_thread_running();

// Restores, in the calling thread, the signal mask main() started with; for
// exec (the blocked mask would otherwise pass on to the new program).
void unblock_stop_signals();

// While alive, SIGTERM and SIGINT set stop_signal() instead of ending the
// process. One scope at a time.
class StopSignalScope {
 public:
  StopSignalScope();
  ~StopSignalScope();
  StopSignalScope(const StopSignalScope&) = delete;
  StopSignalScope& operator=(const StopSignalScope&) = delete;

 private:
  bool handler_ = false;  // no signal thread: a handler was installed instead
};

// The signal received inside the current scope (SIGTERM or SIGINT), or 0.
int stop_signal();

}  // namespace nk
