#pragma once
// Averaging a stage's gradients over its data-parallel replicas (one rank per replica in the
// communicator): NCCL on CUDA when every replica has a GPU of its own (a build with NCCL), else
// through host memory over MPI (the CPU, and replicas sharing a GPU, which NCCL refuses in one
// communicator).
#include <mpi.h>

#include <memory>
#include <string>
#include <vector>

#include <c10/core/Device.h>

#include "exec/stage_module.h"

namespace dawnpiper {

class ReplicaAverager {
 public:
  virtual ~ReplicaAverager() = default;
  // Every parameter's gradient (zeros where undefined) becomes the mean over the replicas.
  // Collective. Returns the bytes averaged.
  virtual int64_t average(std::vector<StageParameter>& parameters) = 0;
  // Starts averaging every parameter's gradient (zeros where undefined) without waiting for it:
  // called where the stage's last backward of the step has produced them, so that the
  // reductions travel while the pipeline drains; average() then completes them (and averages
  // what was not started). The default starts nothing.
  virtual void start(std::vector<StageParameter>& /*parameters*/) {}
  virtual std::string description() const = 0;  // "mpi" | "nccl"
};

// Collective over `replicas`.
std::unique_ptr<ReplicaAverager> make_replica_averager(MPI_Comm replicas, c10::Device device);

}  // namespace dawnpiper
