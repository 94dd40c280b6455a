#include "dist/mpi/state.h"

#include <unistd.h>

#include <cstdio>

#include "core/error.h"

namespace nk::dist::mpi {

std::string error_text(int rc) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) return fmt::format("code {}", rc);
  return std::string(text, len);
}

void State::abort(const std::string& msg, int code) {
  failed = true;
  std::fprintf(stderr, "nekton rank %d: %s\n", rank, msg.c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  ::_exit(code);  // MPI_Abort does not return; this is in case it cannot reach the launcher
}

}  // namespace nk::dist::mpi
