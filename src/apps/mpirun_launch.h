// `nekton train --nproc N ...`: the one-host shortcut for
// `mpirun -np N nekton train ...` (shared/DESIGN.md section 4: launch through
// the standard engines). Several hosts: call mpirun (with a hostfile) or srun.
#pragma once
#include <string>
#include <vector>

namespace nk {

// The mpirun command line that starts `nproc` copies of this executable with
// `args` after it: `--oversubscribe` when nproc exceeds this host's cores, and
// no core binding (each rank's threads are sized by nekton from the number of
// local ranks instead).
std::vector<std::string> mpirun_command(int nproc, const std::string& exe,
                                        const std::vector<std::string>& args);

// Replaces this process with mpirun (OpenMPI's, from PATH); returns only by
// throwing nk::Error when mpirun cannot be started. As root, sets OpenMPI's
// OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) unless the caller's environment says otherwise.
[[noreturn]] void exec_mpirun(int nproc, const std::vector<std::string>& args);

}  // namespace nk
