#pragma once
// Which device each rank trains on, and which ranks share one. With --device cuda every rank
// takes GPU (local rank mod visible GPUs) on its node, so `mpirun -np 8` on an 8-GPU node gives
// one GPU per stage, and more ranks than GPUs share them round robin. Ranks on one GPU cannot
// be in one NCCL communicator: the transport factory (runtime/pipeline_transport.h) asks
// same_device() which links need another way.
#include <mpi.h>

#include <string>
#include <vector>

#include <c10/core/Device.h>

namespace dawnpiper {

// The rank's index among the ranks on its node.
int node_local_rank(MPI_Comm comm);

// `requested` with the rank's GPU index filled in (cuda), or unchanged (cpu). Makes it the
// rank's current CUDA device.
c10::Device rank_device(c10::Device requested, MPI_Comm comm);

// Intra-op threads of a rank: `requested` if > 0, else OMP_NUM_THREADS if set, else the node's
// cores shared among its ranks (cores / ranks on the node, at least 1, at most the cores the rank
// may run on). Sets them (at::set_num_threads) and returns them with where the number came from
// ("--threads", "OMP_NUM_THREADS", "4 cores / 2 ranks on the node"). Collective over `comm`.
struct ThreadCount {
  int threads = 1;
  std::string why;
};
ThreadCount choose_threads(int requested, MPI_Comm comm);

// The memory per rank a run plans within when the user gives no --device-memory: on CUDA, the
// free memory of each rank's GPU (once every rank has its context) split among the ranks sharing
// it, less kCudaLazyLoadBytes each; the least over all ranks. Unlimited on the CPU. With `why`
// saying where the number came from. ConfigError when a GPU has nothing left to share.
// Collective over `comm`.
struct DeviceBudget {
  int64_t bytes = 0;
  std::string why;
};
DeviceBudget default_device_memory(c10::Device device, MPI_Comm comm);

// One string per rank (in rank order) naming the physical device it trains on: host name and
// GPU UUID on CUDA, host name and rank on the CPU (never shared). Collective over `comm`.
std::vector<std::string> device_identities(c10::Device device, MPI_Comm comm);

}  // namespace dawnpiper
