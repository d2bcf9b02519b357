#pragma once
// The set-up the plan-against-runtime memory tests share: fixed cuts of a graph into two stages
// (not the planner's, which follow the profiled timings) and, per cut and schedule, the cost
// model and the pipeline configuration of those two stages.
#include <algorithm>
#include <random>
#include <set>
#include <vector>

#include "graph/op_graph.h"
#include "plan/cost_model.h"
#include "plan/plan.h"
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
  TwoStages(const Profile& profile, int nodes, int cut, const ScheduleChoice& kind, int64_t steps)
      : model(profile, plan_options(kind)) {
    pc.schedule = kind;
    pc.ranges = {{0, cut}, {cut, nodes}};
    pc.micro_batches = 3;
    pc.steps = steps;
  }
  static PlanOptions plan_options(const ScheduleChoice& kind) {
    PlanOptions po;
    po.stages = 2;
    po.schedule = kind;
    po.micro_batches = 3;
    return po;
  }
  CostModel model;
  PipelineConfig pc;
};

// Random decisions for the tensors stage [b, e) saves: each evictable one kept, swapped or
// recomputed (recomputed only where the stage produces it, else swapped). With
// `random_prefetch`, a swap comes back from a random point between its restore and the stage's
// last node.
inline std::vector<TensorDecision> random_decisions(const CostModel& model, const Profile& profile, int b, int e,
                                                    std::mt19937& rng, bool random_prefetch = false) {
  std::set<int> saved;
  for (int n = b; n < e; ++n) saved.insert(model.saved_at(n).begin(), model.saved_at(n).end());
  std::vector<TensorDecision> ds;
  for (int tensor : saved) {
    const TensorProfile& t = profile.tensors[static_cast<size_t>(tensor)];
    const std::vector<int>& savers = model.saved_by(tensor);
    TensorDecision d{tensor, t.bytes, TensorAction::Keep, *(std::lower_bound(savers.begin(), savers.end(), e) - 1)};
    const bool recomputable = !t.is_data && t.producer >= b && t.producer < e;
    const int pick = static_cast<int>(rng() % 3);
    if (model.evictable(tensor) && pick > 0)
      d.action = pick == 1 || !recomputable ? TensorAction::Swap : TensorAction::Recompute;
    if (random_prefetch && d.action == TensorAction::Swap)
      d.prefetch_at = d.restore_before + static_cast<int>(rng() % static_cast<unsigned>(e - d.restore_before));
    ds.push_back(d);
  }
  return ds;
}

}  // namespace dawnpiper::test
