#pragma once
// The link between a stage's data-parallel replicas, measured the way the gradients cross it:
// every stage's replicas allreduce one bucket-sized fp32 buffer at the same time (as at the end of
// a step), through the chunked MPI path level 0's buckets take, and the slowest group's time gives
// the bus bandwidth the planner's collective times use (CostModel::allreduce_ms: an allreduce
// moves 2 (D - 1) / D of its bytes over the link).
#include <mpi.h>

#include <cstdint>
#include <string>

namespace dawnpiper {

struct ReplicaLink {
  double bandwidth = 0;  // bytes/s over the link
  int64_t bytes = 0;     // the buffer each allreduce summed
  double seconds = 0;    // one allreduce, the slowest group's
  int replicas = 1;
  std::string summary() const;  // "measured 1.2 GB/s (a 4 MiB allreduce over 2 replicas took 5.3 ms)"
};

// Collective over `world`: `stage` is this rank's (its replicas have the same), `replicas` > 1.
// `bucket_bytes`: the run's bucket size, measured at 1-8 MiB.
ReplicaLink measure_replica_link(MPI_Comm world, int stage, int replicas, int64_t bucket_bytes);

}  // namespace dawnpiper
