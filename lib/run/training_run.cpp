#include "run/training_run.h"

#include <mpi.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <set>

#include "data/token_file.h"
#include "exec/weights.h"
#include "memory/counting_allocator.h"
#include "memory/device_memory.h"
#include "models/hf_config.h"
#include "profile/analytic.h"
#include "profile/device_peak.h"
#include "profile/torch_trace.h"
#include "run/resume.h"
#include "run/run_report.h"
#include "runtime/checkpoint.h"
#include "runtime/device_placement.h"
#include "runtime/mpi_wait.h"
#include "runtime/run_records.h"
#include "runtime/weights_export.h"
#include "train/metrics_log.h"
#include "train/reference_trainer.h"
#include "util/error.h"
#include "util/json.h"
#include "util/progress.h"
#include "util/stop_request.h"
#include "util/units.h"
#include "util/stopwatch.h"

namespace dawnpiper {

namespace {

// This rank's place: its stage and replica (runtime/rank_layout.h), or every stage here.
RankLayout layout_from(const TrainOptions& o, int world_size) {
  if (!o.in_process) return rank_layout(o.plan.ranks, o.plan.data_parallel, MPI_COMM_WORLD);
  if (world_size != 1) throw ConfigError("--in-process runs every stage in one process: launch one rank");
  if (o.plan.data_parallel > 1) throw ConfigError("--data-parallel needs MPI ranks, not --in-process");
  return in_process_layout(std::max(o.plan.ranks, 1));
}

// config.json for --save-weights DIR: the Hugging Face config a model file was exported from
// ("" for presets and other models), so that from_pretrained(DIR) loads the trained weights.
std::string hf_config_json(const ModelSource& source) {
  if (!source.imported()) return "";
  const Json& model = source.model_file().graph.at("model");
  if (!model.contains("hf_config")) return "";
  return saved_hf_config(model.at("hf_config"),
                         model.contains("model_class") ? model.at("model_class").get<std::string>() : "")
             .dump(2) +
         "\n";
}

// What rank 0 profiles and the stages later read must hold before it profiles: the data (its
// inputs' roles, ids within the model's vocabulary, enough windows for a step and, when the run
// evaluates, for a validation) and --init-from's weights (names and shapes). Checked on rank 0
// once; every rank then fails with its message, which is printed once.
void check_inputs_before_profiling(const OpGraph& graph, const TrainOptions& o, int rank) {
  std::string problem;
  if (rank == 0) try {
      check_init_weights(graph);
      if (!o.config.data.path.empty()) {
        make_data_source(graph, o.config.data, o.config.seed, DataSplit::Train,
                         graph.micro_batch_size * o.config.micro_batches);
        if (o.eval_every > 0 || o.eval_only)
          make_data_source(graph, o.config.data, o.config.seed, DataSplit::Validation, graph.micro_batch_size);
      }
    } catch (const ConfigError& e) {
      problem = e.reason();
      if (problem.empty()) problem = "(no reason given)";
    }
  broadcast_string_quietly(problem, 0, MPI_COMM_WORLD);
  if (!problem.empty()) throw ConfigError(problem);
}

// One stage, nothing the runtime alone does: the reference trainer.
int train_one_stage(const OpGraph& graph, const TrainOptions& o) {
  CountingAllocator::install().set_capacity(o.capacity);
  ReferenceTrainer trainer(graph, o.config);
  MetricsLog metrics(o.metrics_path, false);
  if (!o.quiet)
    std::printf("training %s: %d nodes, %.2fM parameters, micro-batch %" PRId64 " x %" PRId64 ", %s, one stage\n",
                graph.preset.c_str(), graph.size(), graph.parameter_count() / 1e6, o.micro_batch_size,
                o.config.micro_batches, optimizer_summary(o.config.optimizer).c_str());
  if (!o.quiet) print_threads(o.threads);
  if (o.eval_only) {
    const double loss = trainer.evaluate(o.eval_batches);
    metrics.validation(-1, loss);  // after step -1: before any
    print_evaluation(loss, o, 0);
    return 0;
  }
  int64_t peak = 0;
  Progress progress(0, o.config.steps, o.samples_per_step, o.quiet, o.progress);
  const int64_t tokens = tokens_per_sample(graph);
  install_stop_handlers();
  TorchTrace torch_trace(o.torch_trace_path);
  int stopped_by = 0;
  for (int64_t step = 0; step < o.config.steps && !stopped_by; ++step) {
    const StepResult r = trainer.step();
    torch_trace.step_finished(step);
    peak = std::max(peak, r.peak_bytes);
    progress.step(r.step, r.loss, r.lr, r.grad_norm);
    metrics.step(step_metrics(r.step, r.loss, r.lr, r.grad_norm, {r.peak_bytes}, progress, o, tokens));
    if (o.eval_every > 0 && (r.step + 1) % o.eval_every == 0) {
      const double loss = trainer.evaluate(o.eval_batches);
      progress.validation(r.step, loss);
      metrics.validation(r.step, loss);
    }
    if (step + 1 < o.config.steps) stopped_by = stop_signal();
  }
  progress.finish();
  std::printf("%s: %" PRId64
              " steps, final loss %.9g, %.1f samples/s after the first step (%.1f with it), peak memory %s\n",
              stopped_by ? "stopped" : "done", progress.steps_reported(), progress.last_loss(),
              progress.steady_samples_per_second(), progress.samples_per_second(),
              format_bytes(static_cast<double>(peak)).c_str());
  print_model_flops(o, progress.steady_samples_per_second());
  if (!o.save_path.empty()) {
    save_weights(trainer.module().parameters(), o.save_path, MPI_COMM_SELF);
    report_saved_weights(o);
  }
  if (!stopped_by) return 0;
  print_stop(stopped_by, progress.steps_reported(), o);
  return 128 + stopped_by;
}

// Runs this rank's share: every stage in this process, or its own stage, on its replica's
// pipeline communicator (each stage's replicas share another).
StageRun run_this_rank(const OpGraph& graph, const PipelineConfig& pc, const RankLayout& layout, RunConfig& run,
                       bool in_process) {
  if (in_process) {
    run_pipeline_in_process(graph, pc, run.on_loss);
    StageRun mine;
    mine.peak_bytes = DeviceMemory::peak_bytes(pc.device);
    mine.reserved_peak_bytes = DeviceMemory::reserved_peak_bytes(pc.device);
    mine.next_step = pc.steps;
    return mine;
  }
  MPI_Comm pipeline = MPI_COMM_WORLD;
  if (layout.replicas > 1) {
    MPI_Comm_split(MPI_COMM_WORLD, layout.replica, layout.stage, &pipeline);
    MPI_Comm_split(MPI_COMM_WORLD, layout.stage, layout.replica, &run.replica_comm);
  }
  StageRun mine = run_pipeline_mpi(graph, pc, pipeline, run);
  mine.reserved_peak_bytes = DeviceMemory::reserved_peak_bytes(pc.device);
  if (layout.replicas > 1) MPI_Comm_free(&pipeline), MPI_Comm_free(&run.replica_comm);
  return mine;
}

// What the runtime does besides training, from the run's settings (callbacks left to the caller).
RunConfig run_config_from(const TrainOptions& o, const OpGraph& graph) {
  RunConfig run;
  run.transport = o.transport;
  run.trace = !o.trace_path.empty();
  run.checkpoint_every = o.checkpoint_every;
  run.keep_checkpoints = o.keep_checkpoints;
  run.resume = o.resume;
  run.checkpoint_dir = o.checkpoint_dir;
  run.preset = graph.preset;
  run.eval_every = o.eval_every;
  run.eval_batches = o.eval_batches;
  return run;
}

// --eval-only on the pipeline: the checkpoint's (or the initial) weights, one validation.
int evaluate_pipeline(const std::optional<GivenPlan>& given, const OpGraph& graph, const RankLayout& layout,
                      const TrainOptions& o, int rank, c10::Device device, int64_t first_step) {
  const Plan plan = agreed_plan(given, graph, layout, o, device, rank);
  const PipelineConfig pc = pipeline_config(plan, graph, layout, o, device, first_step);
  RunConfig run = run_config_from(o, graph);
  run.eval_only = true;
  MetricsLog metrics(rank == 0 ? o.metrics_path : "", o.resume);
  run.on_validation = [&](const StepReport& r) {
    if (rank != 0) return;
    metrics.validation(r.step, r.loss);
    print_evaluation(r.loss, o, r.step + 1);
  };
  run_this_rank(graph, pc, layout, run, false);
  return 0;
}

int train_pipeline(const std::optional<GivenPlan>& given, const OpGraph& graph, const RankLayout& layout,
                   const TrainOptions& o, int rank, c10::Device device) {
  int64_t first_step = 0;
  if (o.resume) {
    first_step = o.resume_step >= 0 ? o.resume_step : checked_resume_step(o.checkpoint_dir, -1);
    if (first_step > o.config.steps)
      throw ConfigError("the checkpoint is at step " + std::to_string(first_step) + ", beyond --steps " +
                        std::to_string(o.config.steps));
    if (first_step == o.config.steps && !o.eval_only) {
      if (rank == 0)
        std::printf("nothing to do: the checkpoint in %s is at step %" PRId64
                    ", the run's last (--steps); raise --steps to train on\n",
                    o.checkpoint_dir.c_str(), first_step);
      return 0;
    }
    agreed_on_rank0([&] { check_resumed_run(graph, o, first_step); }, rank);
    if (rank == 0 && !o.quiet)
      std::printf("resuming from the checkpoint at step %" PRId64 " in %s\n", first_step, o.checkpoint_dir.c_str());
  }
  if (o.eval_only) {  // trains nothing: the run ends where it starts
    TrainOptions evaluation = o;
    evaluation.config.steps = first_step;
    // The checkpoint holds its optimizer's state: the stages are built with that optimizer.
    if (const std::optional<Json> saved = o.resume ? saved_run(o) : std::nullopt; saved && saved->contains("optimizer"))
      evaluation.config.optimizer.kind = from_name<OptimizerKind>((*saved)["optimizer"].get<std::string>());
    // ... and its sharding, where the replicas are as many (each reads its shard of the state).
    if (const std::optional<Json> saved = o.resume ? saved_run(o) : std::nullopt;
        saved && saved->contains("zero-stage") && saved->value("data-parallel", 1) == layout.replicas)
      evaluation.plan.zero_stage = (*saved)["zero-stage"].get<int>();
    return evaluate_pipeline(given, graph, layout, evaluation, rank, device, first_step);
  }
  const Plan plan = agreed_plan(given, graph, layout, o, device, rank);
  const PipelineConfig pc = pipeline_config(plan, graph, layout, o, device, first_step);
  DeviceMemory::release_cached(device);  // rank 0 may have profiled the whole model
  DeviceMemory::set_capacity(device, o.capacity);
  if (rank == 0 && !o.quiet) print_run_header(graph, plan, pc, layout, o);
  DeviceMemory::reset_peak(device);
  RunConfig run = run_config_from(o, graph);
  // A schedule that does not drain every step can stop only where it drains (at checkpoints);
  // without them a signal ends it at once.
  run.stop_on_signal = !o.in_process && (pc.schedule.traits().drains_every_step || pc.drain_every > 0);
  if (run.stop_on_signal) install_stop_handlers();
  Progress progress(pc.first_step, pc.steps, o.samples_per_step, o.quiet || rank != 0, o.progress);
  MetricsLog metrics(rank == 0 ? o.metrics_path : "", o.resume);
  const int64_t tokens = tokens_per_sample(graph);
  TorchTrace torch_trace(rank == 0 ? o.torch_trace_path : "");
  run.on_loss = [&](const StepReport& r) {
    torch_trace.step_finished(r.step);
    progress.step(r.step, r.loss, r.lr, r.grad_norm);
    if (rank == 0) metrics.step(step_metrics(r.step, r.loss, r.lr, r.grad_norm, r.peak_bytes, progress, o, tokens));
  };
  run.on_validation = [&](const StepReport& r) {
    progress.validation(r.step, r.loss);
    if (rank == 0) metrics.validation(r.step, r.loss);
  };
  if (o.resume && rank == 0) continue_from_checkpoint(o.checkpoint_dir, first_step);
  const Stopwatch clock;
  const StageRun mine = run_this_rank(graph, pc, layout, run, o.in_process);
  synchronize(device);  // the clock stops when the device has finished this rank's work
  torch_trace.finish();
  progress.finish();
  const double seconds = clock.seconds();
  if (run.trace) write_pipeline_trace(graph, plan, pc, layout, mine, MPI_COMM_WORLD, o.trace_path);
  if (!o.save_path.empty()) {  // replica 0's stages in stage order (the replicas hold the same weights)
    MPI_Comm first_replica;
    MPI_Comm_split(MPI_COMM_WORLD, layout.replica == 0 ? 0 : MPI_UNDEFINED, layout.stage, &first_replica);
    if (first_replica != MPI_COMM_NULL)
      save_weights(mine.parameters, o.save_path, first_replica), MPI_Comm_free(&first_replica);
  }
  print_run_report(plan, pc, layout, o, mine, rank, progress, seconds);
  if (!mine.stop_signal) return 0;
  if (rank == 0) print_stop(mine.stop_signal, mine.next_step, o);
  return 128 + mine.stop_signal;
}

}  // namespace

int run_training(TrainOptions o, const ModelSource& source, const std::optional<GivenPlan>& given, int rank,
                 int world_size) {
  const Plan* plan = given ? &given->plan : nullptr;
  const RankLayout layout = layout_from(o, world_size);
  o.plan.data_parallel = layout.replicas;
  if (o.plan.zero_stage > 0 && layout.replicas == 1) {  // nothing to shard over: trains as level 0
    if (rank == 0 && !o.quiet)
      std::printf(
          "note: --zero-stage %d shards over each stage's replicas, and this run has one: it changes "
          "nothing\n",
          o.plan.zero_stage);
    o.plan.zero_stage = 0;
  }
  o.samples_per_step = static_cast<double>(o.config.micro_batches * o.micro_batch_size * layout.replicas);
  // Each rank's own GPU (node-local rank round robin over the visible ones) with --device cuda.
  const c10::Device device = rank_device(parse_device(o.device, /*require_gpu=*/false), MPI_COMM_WORLD);
  check_transport(o.transport, device);
  if (o.capacity == kUnlimitedBytes && !o.in_process) {  // on a GPU, plan within what it has free
    const DeviceBudget budget = default_device_memory(device, MPI_COMM_WORLD);
    o.capacity = budget.bytes;
    o.capacity_source = budget.why;
  }
  o.threads = choose_threads(o.threads_requested, MPI_COMM_WORLD);
  CountingAllocator::install();
  const OpGraph graph = source.graph(o.micro_batch_size);
  o.hf_config = hf_config_json(source);
  // Model FLOP/s and MFU: the graph's FLOPs per sample, the peak of the GPUs the run uses (ranks
  // that share one count it once).
  o.flops_per_sample = model_flops_per_micro_batch(graph) / static_cast<double>(o.micro_batch_size);
  if (device.is_cuda()) {
    const std::vector<std::string> ids = device_identities(device, MPI_COMM_WORLD);
    const size_t gpus = std::set<std::string>(ids.begin(), ids.end()).size();
    const PeakFlops peak = device_peak_flops(device, graph.precision);
    o.peak_flops = peak.flops * static_cast<double>(gpus);
    o.peak_what = (gpus > 1 ? std::to_string(gpus) + " x " : "") + peak.what;
  }
  if (plan && !plan->graph_hash.empty() && plan->graph_hash != graph.fingerprint())
    throw ConfigError("the plan (--plan-in) was made for another graph: " + plan->preset + " with " +
                      std::to_string(plan->nodes) + " nodes, fingerprint " + plan->graph_hash + "; this run's " +
                      graph.preset + " has " + std::to_string(graph.size()) + " nodes, fingerprint " +
                      graph.fingerprint());
  // The reference trainer serves plain one-stage runs; traces, checkpoints, plans (given, made
  // from a profile or written out) and planned memory optimization need the runtime.
  const bool runtime_features = !o.trace_path.empty() || !o.checkpoint_dir.empty() || o.resume ||
                                o.plan.memopt != MemoptKind::None || plan || device.is_cuda() || !o.plan_out.empty() ||
                                !o.profile_in.empty();
  if (!o.calibrate_traces.empty() && layout.stages == 1)
    throw ConfigError("--calibrate-trace corrects the stages of a pipeline; this run has one stage");
  if (layout.stages == 1 && layout.replicas == 1 && !o.in_process && !runtime_features)
    return train_one_stage(graph, o);
  check_inputs_before_profiling(graph, o, rank);
  return train_pipeline(given, graph, layout, o, rank, device);
}

}  // namespace dawnpiper
