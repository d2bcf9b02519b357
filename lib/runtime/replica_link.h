#pragma once
// The link between a stage's data-parallel replicas, measured the way the gradients cross it:
// every stage's replicas allreduce one bucket-sized fp32 buffer at the same time (as at the end of
// a step), through the chunked MPI path level 0's buckets take, and the slowest group's time gives
// the bus bandwidth the planner's collective times use (CostModel::allreduce_ms: an allreduce
// moves 2 (D - 1) / D of its bytes over the link).
//
// Then what a collective costs a rank that computes meanwhile (the drag): on the CPU, Open MPI
// moves a non-blocking collective only inside MPI calls, which the computing rank makes between
// its nodes, so a collective in flight beside a pass lengthens the pass; NCCL runs beside the
// compute on a stream of its own.
#include <mpi.h>

#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace dawnpiper {

struct ReplicaLink {
  double bandwidth = 0;  // bytes/s over the link
  int64_t bytes = 0;     // the buffer each allreduce summed
  double seconds = 0;    // one allreduce, the slowest group's
  int replicas = 1;
  // The time a computing rank's work took longer with an allreduce in flight beside it (started
  // before, tested between pieces of the work as the runtime tests between nodes, waited for at
  // the end), per second of the same allreduce alone: the slowest rank's, median of the rounds.
  // Negative: not measured (on a GPU).
  double drag = -1;
  int64_t drag_bytes = 0;       // the allreduce it was measured with
  std::string summary() const;  // "measured 1.2 GB/s (a 4 MiB allreduce over 2 replicas took 5.3 ms), ..."
};

// Collective over `world`: `stage` is this rank's (its replicas have the same), `replicas` > 1.
// `bucket_bytes`: the run's bucket size, measured at 1-8 MiB. `device`: the stage's; the drag
// is measured on the CPU only (a GPU computes beside the host's MPI calls; NCCL beside both).
ReplicaLink measure_replica_link(MPI_Comm world, int stage, int replicas, int64_t bucket_bytes, c10::Device device);

}  // namespace dawnpiper
