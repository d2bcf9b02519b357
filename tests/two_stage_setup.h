#pragma once
// The set-up the plan-against-runtime memory tests share: fixed cuts of a graph into two stages
// (not the planner's, which follow the profiled timings) and, per cut and schedule, the cost
// model and the pipeline configuration of those two stages.
#include <set>

#include "graph/op_graph.h"
#include "plan/cost_model.h"
#include "profile/profile.h"
#include "runtime/pipeline.h"

namespace dawnpiper::test {

// Every block boundary and every eighth of the graph.
inline std::set<int> block_and_eighth_cuts(const OpGraph& g, const Profile& profile) {
  std::set<int> cuts;
  for (int n = 1; n < g.size(); ++n)
    if (profile.nodes[static_cast<size_t>(n)].block != profile.nodes[static_cast<size_t>(n) - 1].block) cuts.insert(n);
  for (int q = 1; q < 8; ++q) cuts.insert(g.size() * q / 8);
  return cuts;
}

// Stages [0, cut) and [cut, end) under `kind`, 3 micro-batches a step; pc.evictions left empty.
struct TwoStages {
  TwoStages(const Profile& profile, int nodes, int cut, ScheduleKind kind, int64_t steps)
      : model(profile, plan_options(kind)) {
    pc.schedule = kind;
    pc.ranges = {{0, cut}, {cut, nodes}};
    pc.micro_batches = 3;
    pc.steps = steps;
  }
  static PlanOptions plan_options(ScheduleKind kind) {
    PlanOptions po;
    po.stages = 2;
    po.schedule = kind;
    po.micro_batches = 3;
    return po;
  }
  CostModel model;
  PipelineConfig pc;
};

}  // namespace dawnpiper::test
