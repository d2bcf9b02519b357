#pragma once
// Calibrated planning: plans that hold when measured. A profile times each node inside a whole
// step; a stage run alone can take more or less than its nodes' times add up to (a small
// head-only stage keeps its weights in cache, a long middle one does not), which a plan from the
// profile cannot see. Each round plans, measures every stage alone (a StageTimer: the runtime's
// runtime/stage_alone.h, or a test's model), scales the times of each stage's nodes by its
// measured / predicted ratio and plans again; the plan kept is the one whose measured slowest
// stage was fastest. LibTorch-free.
#include <functional>
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

}  // namespace dawnpiper
