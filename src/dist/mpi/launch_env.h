// What the launcher (mpirun, srun) told this process through its environment,
// read before MPI is initialised: a plain start need not initialise MPI at all.
#pragma once

namespace nk::dist {

// True when started by an MPI launcher: OpenMPI's mpirun (OMPI_COMM_WORLD_SIZE),
// a PMIx or PMI launcher such as srun with --mpi=pmix/pmi2 (PMIX_RANK, PMI_RANK).
bool launched_by_mpi();
// Processes of this job on this host (OMPI_COMM_WORLD_LOCAL_SIZE, SLURM's
// tasks per node); 1 when unknown. For splitting the cores between them.
int local_world_size();

}  // namespace nk::dist
