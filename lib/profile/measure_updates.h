#pragma once
// What one optimizer update costs on the device the profile runs on: the step's last action on
// every rank, which the planner puts on the step's timeline (CostModel::update_ms).
#include "graph/op_graph.h"
#include "profile/profile.h"
#include "profile/profiler.h"

namespace dawnpiper {

// Times each optimizer's update (train/optimizer.h, weight decay 0.01 on matrices, fp32 as the
// masters every precision updates, after the gradient norm a synchronous update starts with)
// over the graph's own parameter shapes, in order, until sample_bytes of them, with random
// gradients: the median of five after two that create the state, scaled to all the graph's
// parameters. All zero when that does not fit the device.
constexpr int64_t kUpdateSampleBytes = int64_t{64} << 20;
UpdateTimes measure_update_times(const OpGraph& graph, const ProfilerOptions& options,
                                 int64_t sample_bytes = kUpdateSampleBytes);

}  // namespace dawnpiper
