#pragma once
// Calibrated planning: plans that hold when measured. A profile times each node inside a whole
// step; a stage run alone can take more or less than its nodes' times add up to (a small
// head-only stage keeps its weights in cache, a long middle one does not), which a plan from the
// profile cannot see. Each round plans, measures every stage alone (a StageTimer: the runtime's
// runtime/stage_alone.h, or a test's model), scales the times of each stage's nodes by its
// measured / predicted ratio and plans again; the plan kept is the one whose measured slowest
// stage was fastest. LibTorch-free.
#include <functional>
#include <string>
#include <vector>

#include "plan/planner.h"

namespace dawnpiper {

// Forward + backward per micro-batch of every stage of a plan, in ms, as measured.
using StageTimer = std::function<std::vector<double>(const Plan&)>;

struct CalibrationRound {
  std::vector<int> cuts;                    // the plan's stage starts after the first
  std::vector<double> predicted, measured;  // forward + backward ms per micro-batch per stage
  double measured_bottleneck() const;
  double measured_spread() const;  // max / min - 1
};

struct CalibratedPlan {
  Plan plan;                             // the round with the fastest measured slowest stage
  Profile profile;                       // node times as the last measurement scaled them
  std::vector<CalibrationRound> rounds;  // in order
  int chosen = 0;                        // index of `plan`'s round
};

// `rounds` >= 1 measurements; the first is of the uncalibrated plan. Throws what make_plan throws.
CalibratedPlan calibrate_plan(const Profile& profile, const PlanOptions& options, int rounds,
                              const StageTimer& measure);

// Scales the node times (forward, backward, re-run, and their batch-size fits) of each stage's
// nodes by the stage's measured / predicted forward and backward (compute and memory
// optimization: the measurement includes the evictor's work).
void scale_stage_times(Profile& profile, const Plan& plan, const std::vector<double>& measured_ms);

// A stage as a traced run measured it: its nodes [begin, end) and its forward plus backward per
// micro-batch without the evictor's work (trace/trace.h, measured_stage_compute).
struct MeasuredStage {
  int begin = 0, end = 0;
  double compute_ms = 0;
};
// Scales the node times so that each traced stage's forward and backward add up to what was
// measured: a node's factor is the geometric mean, over the runs, of measured / profiled time of
// the stage that held it (one run: each stage exactly as measured; several runs with other cuts:
// each node as its stages measured it on average, in any order). Throws ConfigError for stages
// outside the profile's nodes.
void scale_to_measured(Profile& profile, const std::vector<std::vector<MeasuredStage>>& runs);

// scale_to_measured by the traces' runs (`train --trace` files of runs planned from this
// profile, or from this profile as traces corrected it), measured in CPU time where that is
// the stages' own work (trace/trace.h, cpu_time_is_work), else in wall time. Throws ConfigError
// for a trace of another preset, micro-batch size or node count (naming the trace).
void calibrate_from_traces(Profile& profile, const std::vector<std::string>& trace_paths);

}  // namespace dawnpiper
