// `nekton train --nproc N ...`: the one-host shortcut for
// `mpirun -np N nekton train ...` (shared/DESIGN.md section 4: launch through
// the standard engines). Several hosts: call mpirun (with a hostfile) or srun.
#pragma once
#include <string>
#include <vector>

namespace nk {

// Where mpirun puts `nproc` ranks of this host (always with
// `--oversubscribe`: OpenMPI counts a host's slots by physical cores, so
// ranks for each hardware thread of an SMT host would be refused without
// it). Up to one a core (as std::thread::hardware_concurrency counts
// them): no binding (each rank's threads are sized by nekton from the
// number of local ranks). More ranks than cores (one thread each): round
// robin over the cores, each rank bound to its core, so that the
// ranks of the inner groups (tp, cp, dp: consecutive ranks, which compute
// at the same time) land on different cores. Left to the scheduler, a rank
// waiting at a message (it yields rather than sleeps) counts as load, and
// two computing ranks share one core as often as not: pp 2 x dp 2 on 2
// cores ran at 59 ms a step with each stage's replicas on different cores
// and 98-105 ms with them on one, unbound runs switching between the two
// (BENCHMARKS.md, 2026-12-02).
std::vector<std::string> mpirun_placement(int nproc);

// The mpirun command line that starts `nproc` copies of this executable with
// `args` after it, the ranks placed by mpirun_placement.
std::vector<std::string> mpirun_command(int nproc, const std::string& exe,
                                        const std::vector<std::string>& args);

// Replaces this process with mpirun (OpenMPI's, from PATH); returns only by
// throwing nk::Error when mpirun cannot be started. As root, sets OpenMPI's
// OMPI_ALLOW_RUN_AS_ROOT(_CONFIRM) unless the caller's environment says otherwise.
[[noreturn]] void exec_mpirun(int nproc, const std::vector<std::string>& args);

}  // namespace nk
