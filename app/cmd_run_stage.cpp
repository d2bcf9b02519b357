// dawnpiper run-stage: runs one stage of a plan alone, with its exact action list, stand-in
// tensors for what it would receive and sends that go nowhere, and reports its measured time
// and peak memory against the plan's prediction. Validates a multi-device plan on one device.
#include <cinttypes>
#include <cstdio>
#include <optional>

#include "app/commands.h"
#include "cli/options.h"
#include "memory/counting_allocator.h"
#include "memory/device_memory.h"
#include "plan/plan.h"
#include "runtime/pipeline.h"
#include "runtime/stage_alone.h"
#include "util/error.h"
#include "util/files.h"
#include "util/units.h"

namespace dawnpiper {

namespace {

po::options_description stage_alone_options() {
  po::options_description own("Stage options");
  // clang-format off
  own.add_options()
      ("plan", po::value<std::string>(), "plan JSON (`dawnpiper plan --out` or `train --plan-out`); required")
      ("stage", po::value<int>(), "the stage to run; required")
      ("steps", po::value<int64_t>()->default_value(3), "steps to run (the first is a warm-up, not timed)")
      ("optimizer", po::value<OptimizerKind>(), (enum_help<OptimizerKind>() + " (default: the plan's)").c_str())
      ("lr", po::value<double>()->default_value(0.01), "learning rate");
  // clang-format on
  po::options_description options;
  options.add(own)
      .add(run_options(RunOptionSet{/*micro_batches=*/true, /*quiet=*/false}))
      .add(model_override_options());
  return options;
}

// Measured against predicted, over the steady state (every step after the first).
void print_stage_alone(const Plan& plan, int x, const OpGraph& graph, const PipelineConfig& pc,
                       const StageAloneRun& run) {
  double step_s = 0, recompute = 0, swap = 0;
  int64_t bwds = 0, all_bwds = 0;  // of the measured steps; of every step (the swap waits cover all)
  const int64_t from = pc.steps > 1 ? 1 : 0;
  for (const ActionRecord& r : run.records) {
    if (passes_gradient_back(r.action_kind())) ++all_bwds;
    if (r.step < from) continue;
    const double d = r.end_s - r.start_s;
    if (!is_evictor(r.action_kind())) step_s += d;
    if (passes_gradient_back(r.action_kind())) ++bwds;
    // The evictor's work happens inside forwards and backwards (their times include it).
    if (r.action_kind() == ActionKind::Recompute) recompute += d;
    if (r.action_kind() == ActionKind::SwapOut || r.action_kind() == ActionKind::SwapIn) swap += d;
  }
  const StagePlan& sp = plan.stages[x];
  const ForwardBackwardMs ms = forward_backward_ms(run.records, from);
  const double measured_ms = ms.total();
  std::printf("stage %d of %d (%s, nodes [%d, %d), %s schedule, %" PRId64 " micro-batches of %" PRId64 "), %" PRId64
              " steps on %s with stand-in inputs\n",
              x, static_cast<int>(plan.stages.size()), graph.preset.c_str(), sp.begin, sp.end, name_of(pc.schedule),
              pc.micro_batches, graph.micro_batch_size, pc.steps, pc.device.str().c_str());
  std::printf(
      "forward+backward per micro-batch: measured %.3f ms (forward %.3f, backward %.3f), predicted %.3f ms (%+.1f%%)\n",
      measured_ms, ms.forward, ms.backward, sp.compute_ms,
      sp.compute_ms > 0 ? 100 * (measured_ms / sp.compute_ms - 1) : 0.0);
  const double per_micro_batch = 1e3 / static_cast<double>(std::max<int64_t>(bwds, 1));
  std::printf("memory optimization per micro-batch: recompute %.3f ms, swap %.3f ms (%s), predicted overhead %.3f ms\n",
              recompute * per_micro_batch, swap * per_micro_batch,
              pc.device.is_cuda() ? "issue time; the copies run on a side stream" : "not overlapped on cpu",
              sp.memopt_ms);
  if (pc.device.is_cuda() && run.swap_waits.copies > 0)
    std::printf("swap-ins waited for: %" PRId64 " of %" PRId64 " copies back, %.3f ms per micro-batch\n",
                run.swap_waits.waited, run.swap_waits.copies,
                run.swap_waits.stall_ms / static_cast<double>(std::max<int64_t>(all_bwds, 1)));
  std::printf("time per step (steps %" PRId64 "..%" PRId64 "): %.3f ms\n", from, pc.steps - 1,
              1e3 * step_s / static_cast<double>(pc.steps - from));
  std::printf(
      "peak memory: measured %s, predicted %s (%+.1f%%)%s\n", format_bytes(double(run.peak_bytes)).c_str(),
      format_bytes(double(sp.memory.predicted_peak())).c_str(),
      sp.memory.predicted_peak() > 0 ? 100 * (double(run.peak_bytes) / double(sp.memory.predicted_peak()) - 1) : 0.0,
      pc.device.is_cuda()
          ? ("; the caching allocator held up to " + format_bytes(double(DeviceMemory::reserved_peak_bytes(pc.device))))
                .c_str()
          : "");
}

}  // namespace

int cmd_run_stage(int argc, char** argv, const MpiWorld& world) {
  po::variables_map vm;
  if (!parse_options(argc, argv, "run-stage",
                     "Runs one stage of a plan alone with stand-in inputs; measures its time and peak memory.",
                     stage_alone_options(), vm))
    return 0;
  if (!vm.count("plan") || !vm.count("stage")) throw ConfigError("--plan FILE and --stage X are required");
  if (world.rank != 0) return 0;
  const Plan plan = plan_from_json(read_text_file(vm["plan"].as<std::string>()));
  const int x = vm["stage"].as<int>();
  const int stages = static_cast<int>(plan.stages.size());
  if (x < 0 || x >= stages)
    throw ConfigError("--stage " + std::to_string(x) + ": the plan has stages 0.." + std::to_string(stages - 1));
  const int64_t steps = vm["steps"].as<int64_t>();
  if (steps < 1) throw ConfigError("--steps must be at least 1");
  const c10::Device device = parse_device(vm["device"].as<DeviceKind>());

  // The plan's model, precision, batch and schedule unless overridden.
  po::variables_map chosen = vm;
  if (!vm.count("model-file")) {
    if (vm["model"].defaulted()) chosen.at("model").value() = boost::any(plan.preset);
    if (!vm.count("precision")) chosen.insert({"precision", po::variable_value(boost::any(plan.precision), false)});
  }
  const ModelSource model = model_source_from(chosen);
  const int64_t batch =
      vm["micro-batch-size"].defaulted() ? plan.micro_batch_size : vm["micro-batch-size"].as<int64_t>();
  const OpGraph graph = model.graph(batch);
  if (graph.precision != plan.precision)
    throw ConfigError("the plan was made for " + std::string(name_of(plan.precision)) + ", this run builds " +
                      name_of(graph.precision) + " (leave --precision out, or plan again)");
  if (graph.size() != plan.nodes)
    throw ConfigError("the plan is for " + std::to_string(plan.nodes) + " nodes, " + graph.preset + " has " +
                      std::to_string(graph.size()) + " (give the model options the plan was made with)");
  PipelineConfig pc = pipeline_config_of(plan, graph);
  if (!vm["micro-batches"].defaulted()) pc.micro_batches = vm["micro-batches"].as<int64_t>();
  pc.steps = steps;
  pc.seed = vm["seed"].as<uint64_t>();
  if (vm.count("optimizer")) pc.optimizer.kind = vm["optimizer"].as<OptimizerKind>();
  pc.optimizer.lr = vm["lr"].as<double>();
  pc.device = device;

  CountingAllocator::install();
  if (vm.count("device-memory"))
    DeviceMemory::set_capacity(device, parse_capacity(vm["device-memory"].as<std::string>(), "--device-memory"));
  print_stage_alone(plan, x, graph, pc, run_stage_alone(graph, pc, x));
  return 0;
}

}  // namespace dawnpiper
