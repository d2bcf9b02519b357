#pragma once
// What a pipeline rank holds at its peak, as the counting allocator sees it: its stages run alone
// through their list of actions over the stand-in transport (which keeps as many sends going as
// the schedule's ranks do), shared by the plan-against-runtime memory tests.
#include <cstdint>
#include <map>
#include <memory>

#include "graph/op_graph.h"
#include "memory/counting_allocator.h"
#include "runtime/pipeline.h"
#include "runtime/pipeline_stage.h"
#include "runtime/transport.h"

namespace dawnpiper::test {

// Rank r's peak above what was allocated before; integer inputs it receives are the real ones.
inline int64_t measured_rank_peak(CountingAllocator& counter, const OpGraph& g, const PipelineConfig& pc, int r) {
  StandInTransport transport(at::Device(at::kCPU), 7, pc.schedule.traits().sends_in_flight);
  std::map<int, at::Tensor> exact;
  for (int x = r; x < static_cast<int>(pc.ranges.size()); x += ranks_of(pc))
    if (x > 0) exact.merge(exact_constant_inputs(g, pc.ranges[static_cast<size_t>(x)].first, pc.seed));
  transport.set_exact(std::move(exact));
  const int64_t base = counter.live_bytes();  // not the stand-in's own copies of the inputs
  std::map<int, std::unique_ptr<PipelineStage>> stages;
  for (int x = r; x < static_cast<int>(pc.ranges.size()); x += ranks_of(pc))
    stages[x] = std::make_unique<PipelineStage>(g, stage_config(g, pc, x), transport);
  counter.reset_peak();
  for (const Action& a : rank_actions(g, pc, r)) stages.at(a.stage)->execute(a);
  return counter.peak_bytes() - base;
}

}  // namespace dawnpiper::test
