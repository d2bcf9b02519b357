#pragma once
// Averaging a stage's gradients over its data-parallel replicas (one rank per replica in the
// communicator), ZeRO level 0: through runtime/replica_collectives.h, NCCL on the device where
// every replica has a GPU of its own (a build with NCCL), else MPI through host memory (the CPU,
// and replicas sharing a GPU, which NCCL refuses in one communicator).
//
// The gradients travel in flat buckets of whole parameters, about `bucket_bytes` each, closed
// only between two nodes' parameters (ZeRO's shard_layout with one replica: the planner's
// replay places them alike). During the step's last weight pass (B, or W of a split backward)
// autograd's post-accumulate hooks count each parameter's accumulations; a bucket is packed
// into one buffer (its gradients released) and its allreduce started once every parameter in it
// has all of its accumulations of the pass and every bucket before it in a fixed order (the last
// bucket first, as a backward makes them) has started, so that the replicas start the same
// collectives in the same order. The buckets holding a weight tied across stages (`deferred`),
// and those the hooks did not start, start when that pass ends. average() waits for them,
// divides by D, and the gradients become views of the buffers: what each element sums is what
// one allreduce per parameter sums. A bucket size of 0 averages parameter by parameter in place,
// each allreduce started when the pass ends (the averaging before buckets: kept to compare with).
#include <mpi.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "exec/stage_module.h"

namespace dawnpiper {

class ReplicaAverager {
 public:
  using Clock = std::chrono::steady_clock;
  // A reduction's time in flight: bucket `bucket` of `bytes` from its start until it was seen
  // complete (by the hooks' tests during the pass, else by average()).
  using Listener = std::function<void(int bucket, int64_t bytes, Clock::time_point start, Clock::time_point end)>;

  virtual ~ReplicaAverager() = default;
  // Every parameter's gradient (zeros where undefined) becomes the mean over the replicas.
  // Collective. Returns the bytes averaged.
  virtual int64_t average(std::vector<StageParameter>& parameters) = 0;
  // A weight pass (B, or W of a split backward) begins; `last`: the step's last, whose buckets
  // start as it makes them. The default does nothing.
  virtual void begin_pass(bool /*last*/) {}
  // Starts averaging what has not started (zeros where undefined) without waiting for it:
  // called where the stage's last backward of the step has produced them, so that the
  // reductions travel while the pipeline drains; average() then completes them (and averages
  // what was not started). The default starts nothing.
  virtual void start(std::vector<StageParameter>& /*parameters*/) {}
  virtual void set_listener(Listener /*listener*/) {}
  virtual std::string description() const = 0;  // "mpi in N buckets", "nccl, parameter by parameter", ...
};

// Collective over `replicas`. `parameters`: the stage's (their hooks are set here, MPI only);
// `deferred`: per parameter, tied across stages (empty: none); `split_backward`: the stage's
// weight passes are W (each node's parameters accumulated by a call of their own).
std::unique_ptr<ReplicaAverager> make_replica_averager(MPI_Comm replicas, c10::Device device,
                                                       const std::vector<StageParameter>& parameters = {},
                                                       int64_t bucket_bytes = 0, std::vector<bool> deferred = {},
                                                       bool split_backward = false);

}  // namespace dawnpiper
