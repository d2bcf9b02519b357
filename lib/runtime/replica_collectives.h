#pragma once
// The collectives of one stage's data-parallel replicas over flat buckets (level 0's
// allreduces, ZeRO's reduce-scatters and all-gathers), started without waiting. NCCL on the parameters' GPU when every
// replica has a GPU of its own (a build with NCCL): the collectives run in order on a stream of
// their own, each after the compute stream's queued work, and a wait makes the compute stream
// wait for one without holding the host. Else MPI over host memory: the CPU, and replicas
// sharing a GPU, which NCCL refuses in one communicator (their tensors are staged through the
// host). Every replica starts the same collectives in the same order.
#include <mpi.h>

#include <memory>
#include <string>

#include <ATen/ATen.h>

namespace dawnpiper {

// One collective under way. Its tensors stay allocated while it runs, also where it is dropped
// unfinished (an error unwinding the stage).
class ReplicaCollective {
 public:
  virtual ~ReplicaCollective() = default;
  // Whether it is complete; never blocks (MPI advances it: Open MPI moves a non-blocking
  // collective only inside MPI calls).
  virtual bool test() = 0;
  // Complete for whatever runs next on this rank: MPI waits, sleeping between tests
  // (runtime/mpi_wait.h); NCCL makes the compute stream wait for it.
  virtual void wait() = 0;
};

class ReplicaCollectives {
 public:
  virtual ~ReplicaCollectives() = default;
  // Whether the collectives take tensors on the parameters' device; else host tensors.
  virtual bool on_device() const = 0;
  virtual std::string name() const = 0;  // "mpi" | "nccl"
  int replicas() const { return replicas_; }
  int replica() const { return replica_; }
  // `recv` (fp32, n elements) receives the sum over the replicas of their `send`'s chunk number
  // replica() (fp32, replicas() x n elements).
  virtual std::unique_ptr<ReplicaCollective> reduce_scatter(const at::Tensor& send, const at::Tensor& recv) = 0;
  // In place: every replica's chunk r of `all` (replicas() x n contiguous elements, fp32 or bf16,
  // this replica's own in its place) into every replica's `all`. Moves elements, adds none.
  virtual std::unique_ptr<ReplicaCollective> all_gather(const at::Tensor& all) = 0;
  // In place: `buffer` (fp32, contiguous) becomes the sum over the replicas of their `buffer`.
  // MPI sends it in messages of at most `chunk_bytes` (0: one), all started at once: Open MPI
  // moves a large message in fragments that need both ranks inside MPI, and each message done
  // restarts the waiting's pause (runtime/mpi_wait.h). NCCL: one.
  virtual std::unique_ptr<ReplicaCollective> all_reduce(const at::Tensor& buffer, int64_t chunk_bytes) = 0;
  // The sum of `value` over the replicas, in double (blocking, over MPI in either case).
  double sum(double value) const;

 protected:
  explicit ReplicaCollectives(MPI_Comm comm);
  MPI_Comm comm_;
  int replicas_ = 1, replica_ = 0;
};

// Collective over `replicas` (NCCL's communicator is created here). `device`: the parameters'.
std::unique_ptr<ReplicaCollectives> make_replica_collectives(MPI_Comm replicas, c10::Device device);

}  // namespace dawnpiper
