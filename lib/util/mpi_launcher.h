#pragma once
// Whether this process was started by an MPI launcher (mpirun, srun), which sets these.
#include <cstdlib>

namespace dawnpiper {

inline bool under_mpi_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK") ||
         std::getenv("SLURM_STEP_ID");
}

}  // namespace dawnpiper
