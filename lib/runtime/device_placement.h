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

// One string per rank (in rank order) naming the physical device it trains on: host name and
// GPU UUID on CUDA, host name and rank on the CPU (never shared). Collective over `comm`.
std::vector<std::string> device_identities(c10::Device device, MPI_Comm comm);

}  // namespace dawnpiper
