#include "runtime/stage_alone.h"

#include <algorithm>
#include <limits>

#include "runtime/pipeline_stage.h"
#include "runtime/stage_tracer.h"
#include "runtime/transport.h"

namespace dawnpiper {

StageAloneRun run_stage_alone(const OpGraph& graph, const PipelineConfig& config, int stage) {
  StandInTransport transport(config.device, 7, config.schedule.traits().sends_in_flight);
  if (stage > 0)
    transport.set_exact(exact_constant_inputs(graph, config.ranges[static_cast<size_t>(stage)].first, config.seed));
  PipelineStage runner(graph, stage_config(graph, config, stage), transport);
  StageTracer tracer(config.device, transport, StageTracer::Clock::now(), /*keep_records=*/true);
  if (runner.evictor())
    runner.evictor()->set_listener([&tracer, stage](ActionKind kind, int64_t mb, int tensor, int64_t bytes,
                                                    StageTracer::Clock::time_point start,
                                                    StageTracer::Clock::time_point end) {
      tracer.record_nested(stage, kind, mb, tensor, bytes, start, end);
    });
  int64_t step = 0;  // of the latest action with a micro-batch (an update belongs to it)
  for (const Action& a : stage_actions(graph, config, stage)) {
    if (a.micro_batch >= 0) step = a.micro_batch / config.micro_batches;
    tracer.run(a, step, [&] { runner.execute(a); });
  }
  return {tracer.records(), tracer.peak_bytes(),
          runner.evictor() ? runner.evictor()->swap_waits() : SwapCopier::Waits{}};
}

ForwardBackwardMs forward_backward_ms(const std::vector<ActionRecord>& records, int64_t from_step) {
  double fwd = 0, bwd = 0;
  int64_t fwds = 0, bwds = 0;
  for (const ActionRecord& r : records) {
    if (r.step < from_step) continue;
    const double d = r.end_s - r.start_s;
    if (r.action_kind() == ActionKind::Forward) fwd += d, ++fwds;
    if (is_backward(r.action_kind())) bwd += d;  // B, or I and W
    if (passes_gradient_back(r.action_kind())) ++bwds;
  }
  return {1e3 * fwd / static_cast<double>(std::max<int64_t>(fwds, 1)),
          1e3 * bwd / static_cast<double>(std::max<int64_t>(bwds, 1))};
}

StageTimer stage_alone_timer(const OpGraph& graph, c10::Device device, int64_t steps, uint64_t seed) {
  return [&graph, device, steps, seed](const Plan& plan) {
    PipelineConfig pc = pipeline_config_of(plan, graph);
    pc.steps = steps;
    pc.seed = seed;
    pc.device = device;
    // Forwards, then backwards through the stages, each keeping its faster run: a machine's
    // speed drifts (10% here) within the seconds one pass takes.
    const int stages = static_cast<int>(plan.stages.size());
    std::vector<double> ms(static_cast<size_t>(stages), std::numeric_limits<double>::infinity());
    for (int i = 0; i < 2 * stages; ++i) {
      const int x = i < stages ? i : 2 * stages - 1 - i;
      const double t = forward_backward_ms(run_stage_alone(graph, pc, x).records, steps > 1 ? 1 : 0).total();
      ms[static_cast<size_t>(x)] = std::min(ms[static_cast<size_t>(x)], t);
    }
    return ms;
  };
}

}  // namespace dawnpiper
