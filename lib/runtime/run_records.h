#pragma once
// What a pipeline run's ranks hand to rank 0 once it is over: the trace of every action with each
// stage's record, and each rank's measured peak. Collective over the world communicator.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "graph/op_graph.h"
#include "plan/plan.h"
#include "runtime/pipeline.h"
#include "runtime/rank_layout.h"

namespace dawnpiper {

// Gathers every rank's actions and stage record (its plan's prediction beside what it measured)
// and writes the trace on rank 0 (docs/trace-format.md).
void write_pipeline_trace(const OpGraph& graph, const Plan& plan, const PipelineConfig& config,
                          const RankLayout& layout, const StageRun& mine, MPI_Comm world, const std::string& path);

struct RankPeak {
  int replica = 0, stage = 0;
  int64_t peak_bytes = 0, reserved_peak_bytes = 0;
  int64_t optimizer_state_bytes = 0, gathered_bytes = 0;
};
// Per rank, in rank order, on rank 0 (empty elsewhere).
std::vector<RankPeak> gather_peaks(const StageRun& mine, const RankLayout& layout, MPI_Comm world);

}  // namespace dawnpiper
