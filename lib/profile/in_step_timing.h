#pragma once
// In-step timing: every node's forward and backward time measured inside whole training steps,
// so each node pays what it pays in training (cold caches, the autograd engine between nodes,
// gradient summation of tensors with several consumers), and the per-node times add up to the
// step. Needs the whole step to fit in memory; the isolated per-node measurement does not.
#include <vector>

#include "graph/op_graph.h"
#include "profile/profiler.h"

namespace dawnpiper {

struct InStepTiming {
  std::vector<double> fwd_ms, fwd_ms_std, bwd_ms, bwd_ms_std;  // per node
  std::vector<double> weight_ms;                               // per node: its part of a split backward's weight pass
  // Mean forward+backward of plain (uninstrumented) steps run alternately with the measured
  // ones, so the cross-check sees the same machine conditions as the node times.
  double plain_fwd_bwd_ms = 0;
};

// Runs options.warmup + options.iterations forward+backward passes of the whole graph, each
// after a plain one. Forward
// time of node n runs from its start to the next node's start. Backward: every autograd
// function is charged to the node whose forward created it (by autograd sequence number), and a
// pre-hook on each marks the timeline, so node n's backward time runs from each of its
// functions' start to the next function's start. Throws OutOfMemoryError when the step does
// not fit the device's capacity.
InStepTiming measure_in_step(const OpGraph& graph, const ProfilerOptions& options);

}  // namespace dawnpiper
