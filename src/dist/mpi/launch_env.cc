#include "dist/mpi/launch_env.h"

#include <cstdlib>
#include <initializer_list>

namespace nk::dist {

bool launched_by_mpi() {
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK"})
    if (std::getenv(v)) return true;
  return false;
}

int local_world_size() {
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* s = std::getenv(v)) {
      int n = std::atoi(s);
      if (n > 0) return n;
    }
  return 1;
}

}  // namespace nk::dist
