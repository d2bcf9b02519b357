#pragma once
// What every stage knows of a finished step travels to rank 0 on its own communicator, apart
// from the activations: its peak memory during the step, and the last stage's loss. Rank 0 reports
// a step to options.on_loss, in step order, once every stage's record of it has arrived.
#include <mpi.h>

#include <array>
#include <cstdint>
#include <map>
#include <vector>

#include "runtime/pipeline.h"

namespace dawnpiper {

class StepRelay {
 public:
  StepRelay(const PipelineConfig& c, const RunConfig& options, MPI_Comm control, int rank, int stages);
  ~StepRelay();
  // This stage finished `step`: its peak bytes during it; on the last stage the step's mean loss
  // (averaged over the replicas), on rank 0 the global gradient norm.
  void send(int64_t step, int64_t peak_bytes, double loss, double grad_norm);
  // Rank 0: reports the steps whose records have all arrived, waiting for those up to
  // `wait_through` (every stage sends its record of a step before anything that follows it).
  void poll(int64_t wait_through = -1);
  // `end`: the first step not run (c.steps, or where a stop signal ended the run).
  void finish(int64_t end);

 private:
  struct Pending {
    StepReport report;
    std::vector<bool> arrived;  // per stage
    int records = 0;
  };
  const PipelineConfig& c_;
  const RunConfig& options_;
  MPI_Comm control_;
  int rank_, stages_;
  int64_t reported_, end_;
  std::map<int64_t, Pending> pending_;
  std::vector<std::array<double, 2>> outgoing_;
  std::vector<MPI_Request> requests_;
};

}  // namespace dawnpiper
