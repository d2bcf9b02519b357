#pragma once
// One stage of a pipeline run alone in this process: its exact action list, stand-in tensors for
// what it would receive (positions, masks and ids computed for real, as stand-ins could index out
// of range) and sends that go nowhere. What `run-stage` reports and what calibrated planning
// (plan/calibrate.h) measures: a stage's time without the other stages sharing the machine.
#include <cstdint>
#include <vector>

#include "plan/calibrate.h"
#include "runtime/pipeline.h"
#include "runtime/swap_copier.h"
#include "trace/trace.h"

namespace dawnpiper {

struct StageAloneRun {
  std::vector<ActionRecord> records;  // every action, evictor records included
  int64_t peak_bytes = 0;             // the device allocator's
  SwapCopier::Waits swap_waits;       // CUDA: whether the copies back were hidden behind compute
};
StageAloneRun run_stage_alone(const OpGraph& graph, const PipelineConfig& config, int stage);

// Mean forward and backward per micro-batch, in ms, over the steps from `from_step` on (the
// evictor's work inside them included).
struct ForwardBackwardMs {
  double forward = 0, backward = 0;
  double total() const { return forward + backward; }
};
ForwardBackwardMs forward_backward_ms(const std::vector<ActionRecord>& records, int64_t from_step);

// Times every stage of a plan alone on `device` (`steps` steps, the first a warm-up; each stage
// twice, the faster run kept): the measurement calibrate_plan asks for. `graph` must outlive
// the timer.
StageTimer stage_alone_timer(const OpGraph& graph, c10::Device device, int64_t steps, uint64_t seed);

}  // namespace dawnpiper
