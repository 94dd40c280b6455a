#include "apps/cli.h"
#include "core/stop_signal.h"

int main(int argc, char** argv) {
  // First, before any thread exists: SIGTERM and SIGINT go to a thread of
  // their own, never to a handler on a computing thread (core/stop_signal.h).
  nk::start_stop_signal_thread();
  return nk::run_cli(argc, argv);
}
