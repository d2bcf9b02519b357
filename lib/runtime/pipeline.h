#pragma once
// Running a pipeline: every stage's PipelineStage executing its schedule's action lists, either
// one stage per MPI rank (the real thing) or all stages in one process in a valid global order
// of the same lists (the reference for the asynchronous schedule, and tests).
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "exec/stage_module.h"
#include "graph/op_graph.h"
#include "schedule/schedule.h"
#include "train/optimizer.h"

namespace dawnpiper {

struct PipelineConfig {
  ScheduleKind schedule = ScheduleKind::GPipe;
  std::vector<std::pair<int, int>> ranges;  // node range [begin, end) of each stage
  int64_t micro_batches = 1;                // per step
  int64_t steps = 1;
  uint64_t seed = 42;
  OptimizerConfig optimizer;
};

// Throws ConfigError unless the ranges tile the graph's nodes in order, non-empty.
void check_ranges(const OpGraph& graph, const std::vector<std::pair<int, int>>& ranges);

// The action lists of one stage for the whole run: for gpipe and 1f1b one schedule per step,
// its micro-batch ids offset by step * micro_batches; for async one stream of
// steps * micro_batches micro-batches.
std::vector<Action> stage_actions(const PipelineConfig& config, int stage);

struct StepLoss {
  int64_t step = 0;
  double loss = 0;
};

struct InProcessResult {
  std::vector<StepLoss> losses;
  std::vector<std::vector<StageParameter>> parameters;  // per stage, after the run
};

// All stages in this process, actions in the order simulate_global gives (a valid global
// order: every receive after its send).
InProcessResult run_pipeline_in_process(const OpGraph& graph, const PipelineConfig& config);

// This rank's stage (rank == stage in `comm`, size == stages). on_loss runs on rank 0 for every
// finished step, in step order. Returns this stage's parameters after the run.
std::vector<StageParameter> run_pipeline_mpi(const OpGraph& graph, const PipelineConfig& config, MPI_Comm comm,
                                             const std::function<void(const StepLoss&)>& on_loss);

}  // namespace dawnpiper
