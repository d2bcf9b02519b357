#pragma once
// StageProgram: what one pipeline stage does, derived once from the plan and free of LibTorch:
// its schedule's actions and the plan's evictions, each placed where the stage carries it out.
// The runtime executes it (PipelineStage runs the actions, runtime/evictor the evictions); the
// planner's memory replay (plan/stage_memory.h), the profile's whole-graph replay and
// `run-stage` simulate the very same program. Placement lives here and nowhere else.
//
// Placing a decision on stage nodes [b, e):
//   - the storage leaves after its last reader in the stage (readers of every tensor sharing the
//     storage: views included), or, when a later stage also reads it, once the micro-batch's
//     activations are sent (the send must not see an empty storage);
//   - it is back before the backward of TensorDecision::restore_before (the stage's last saver
//     when the decision does not say); a swap from its prefetch node on;
//   - a recomputation re-runs the producer and, recursively, the producers of its inputs that are
//     not on the device (recomputed themselves, and made in this stage); what those nodes read
//     otherwise (kept or swapped tensors, data, received tensors) is held since the forward.
#include <vector>

#include "plan/cost_model.h"
#include "plan/plan.h"
#include "schedule/action.h"
#include "schedule/schedule.h"

namespace dawnpiper {

struct StageProgram {
  int stage = 0, begin = 0, end = 0;
  std::vector<Action> actions;  // one step's list for the stage, with its tied reductions
  std::vector<Eviction> evictions;
  // Whether its backwards split into I and W (zero-bubble schedules).
  bool splits_backward() const;
};

// Stage x ([b, e)) running `step_actions` (its list of one step of a schedule with `traits`) and
// carrying `evictions`: the tied reductions added where it holds a weight tied across stages
// (holds_tied_across over `tied_owner`, per node). The planner's programs and the runtime's
// stages (runtime/pipeline.h: stage_config) are both made here.
StageProgram stage_program(const ScheduleTraits& traits, std::vector<Action> step_actions,
                           const std::vector<int>& tied_owner, int b, int e, int x, std::vector<Eviction> evictions);

// The evictions carrying out `decisions` (keep entries and autograd-internal buffers kept change
// nothing) on stage nodes [b, e), in the decisions' order. Throws ConfigError for a decision the
// stage cannot carry out: a tensor outside the profile, an internal buffer or a view of a
// parameter evicted, a recomputation of a tensor another stage produces, a tensor no stage node
// produces or reads.
std::vector<Eviction> place_evictions(const CostModel& model, int b, int e,
                                      const std::vector<TensorDecision>& decisions);
// The same, given which tensors the stage receives (per tensor, 1: crosses the cut at b).
std::vector<Eviction> place_evictions(const CostModel& model, int b, int e,
                                      const std::vector<TensorDecision>& decisions, const std::vector<char>& received);

// Stage x ([b, e)) of the model's schedule with `decisions` placed, its list from add_tied_reductions with
// holds_tied_across (schedule/schedule.h) as the runtime's (runtime/pipeline.cpp's rank_actions):
// the profile's tied owners here are the graph's there.
StageProgram stage_program(const CostModel& model, int b, int e, int x, const std::vector<TensorDecision>& decisions);

}  // namespace dawnpiper
