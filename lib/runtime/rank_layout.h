#pragma once
// Data x pipeline parallelism: world = replicas x stages. A pipeline's stages exchange activations
// every micro-batch, its replicas only gradients once a step, so a pipeline is kept on one node:
// ranks are ordered by node (the ranks MPI says share memory), then by rank, and consecutive
// ranks in that order form a pipeline. Under block placement this is the plain rank order.
#include <mpi.h>

namespace dawnpiper {

struct RankLayout {
  int stages = 1, replicas = 1;
  int replica = 0, stage = 0;  // this rank's
  int nodes = 1;
  bool pipelines_within_nodes = true;  // false when a node's rank count is no multiple of stages
};

// `stages` and `replicas` as asked (0: derived from the other and the world's size; both 0: one
// pipeline of every rank). Throws ConfigError when they do not fit the world, naming the mpirun
// command that would. Collective over `world`.
RankLayout rank_layout(int stages, int replicas, MPI_Comm world);

// Every stage in one process (--in-process): no MPI layout.
inline RankLayout in_process_layout(int stages) {
  RankLayout l;
  l.stages = stages;
  return l;
}

}  // namespace dawnpiper
