#include "run/run_report.h"

#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "memory/device_memory.h"
#include "runtime/run_records.h"
#include "util/atomic_file.h"
#include "util/stop_request.h"
#include "util/units.h"

namespace dawnpiper {

namespace {

// ", swaps 1.5 MiB and recomputes 512 KiB of each micro-batch's activations (+0.4 ms, 6%)" where the
// plan evicts on the stage.
std::string memopt_summary(const StagePlan& stage) {
  int64_t swapped = 0, recomputed = 0;
  for (const TensorDecision& d : stage.decisions) {
    if (d.action == TensorAction::Swap) swapped += d.bytes;
    if (d.action == TensorAction::Recompute) recomputed += d.bytes;
  }
  if (swapped == 0 && recomputed == 0) return "";
  std::string what;
  if (swapped > 0) what += "swaps " + format_bytes(static_cast<double>(swapped));
  if (recomputed > 0)
    what += (what.empty() ? "recomputes " : " and recomputes ") + format_bytes(static_cast<double>(recomputed));
  char overhead[64];
  std::snprintf(overhead, sizeof overhead, " (+%.2f ms, %.0f%%)", stage.memopt_ms,
                stage.compute_ms > 0 ? 100 * stage.memopt_ms / stage.compute_ms : 0.0);
  return ", " + what + " of each micro-batch's activations" + overhead;
}

}  // namespace

void print_threads(const ThreadCount& t) { std::printf("  threads: %d per rank (%s)\n", t.threads, t.why.c_str()); }

std::string optimizer_summary(const OptimizerConfig& o) {
  std::ostringstream out;
  out << name_of(o.kind) << " lr " << o.lr;
  const LrSchedule& sc = o.schedule;
  if (sc.kind != LrScheduleKind::Constant || sc.warmup_steps > 0) {
    out << " (" << sc.kind;
    if (sc.warmup_steps > 0) out << " after " << sc.warmup_steps << " warmup steps";
    if (sc.kind != LrScheduleKind::Constant) out << " to " << sc.min_lr;
    out << ")";
  }
  if (o.weight_decay > 0) out << ", weight decay " << o.weight_decay;
  if (o.grad_clip > 0) out << ", grad clip " << o.grad_clip;
  return out.str();
}

void print_run_header(const OpGraph& graph, const Plan& plan, const PipelineConfig& pc, const RankLayout& layout,
                      const TrainOptions& o) {
  std::printf("training %s: %d nodes, %.2fM parameters, micro-batch %" PRId64 " x %" PRId64 ", %s, %d stage%s, %s%s\n",
              graph.preset.c_str(), graph.size(), graph.parameter_count() / 1e6, o.micro_batch_size, pc.micro_batches,
              optimizer_summary(pc.optimizer).c_str(), layout.stages, layout.stages == 1 ? "" : "s",
              pc.schedule.virtual_stages() > 1 ? (std::string(name_of(pc.schedule)) + " (" +
                                                  std::to_string(pc.schedule.virtual_stages()) + " stages per rank)")
                                                     .c_str()
                                               : name_of(pc.schedule),
              layout.replicas > 1 ? (", " + std::to_string(layout.replicas) + " data-parallel replicas on " +
                                     std::to_string(layout.nodes) + (layout.nodes == 1 ? " host" : " hosts"))
                                        .c_str()
                                  : "");
  print_threads(o.threads);
  if (!layout.pipelines_within_nodes)
    std::printf(
        "  warning: some host runs a number of ranks that is no multiple of %d stages, so some pipelines "
        "span hosts and send their activations between them\n",
        layout.stages);
  if (o.capacity != kUnlimitedBytes) {
    const int64_t planned = plan.options.capacity_bytes;
    std::printf("  memory: %s per rank (%s); %s\n", format_bytes(static_cast<double>(o.capacity)).c_str(),
                o.capacity_source.c_str(),
                planned == kUnlimitedBytes
                    ? "the plan was made without a limit"
                    : ("the plan fills up to " + format_bytes(static_cast<double>(planned)) + " of it").c_str());
  }
  for (const StagePlan& stage : plan.stages)
    std::printf("  stage %d: nodes [%d, %d), predicted peak %s%s\n", stage.index, stage.begin, stage.end,
                format_bytes(static_cast<double>(stage.memory.predicted_peak())).c_str(),
                memopt_summary(stage).c_str());
  if (!pc.schedule.traits().updates_once_per_step)
    for (const auto& [holders, names] : tied_across_stages(graph, pc)) {
      std::string stages;
      for (int h : holders) stages += (stages.empty() ? "" : h == holders.back() ? " and " : ", ") + std::to_string(h);
      const std::string more = names.size() > 1 ? " and " + std::to_string(names.size() - 1) + " more are" : " is";
      std::printf(
          "  note: %s%s tied across stages %s; under %s each stage updates its own copy with its own "
          "gradients (the copies drift apart; gpipe and 1f1b sum them)\n",
          names.front().c_str(), more.c_str(), stages.c_str(), name_of(pc.schedule));
    }
  for (const StagePlan& stage : plan.stages)
    if (stage.memory.predicted_peak() > o.capacity)
      std::printf(
          "  warning: stage %d is predicted to peak at %s, above the %s a rank has; the plan was made for more "
          "memory or its search model under-estimated it: expect an out-of-memory error\n",
          stage.index, format_bytes(static_cast<double>(stage.memory.predicted_peak())).c_str(),
          format_bytes(static_cast<double>(o.capacity)).c_str());
}

void print_run_report(const Plan& plan, const PipelineConfig& pc, const RankLayout& layout, const TrainOptions& o,
                      const StageRun& mine, int rank, const Progress& progress, double seconds) {
  const std::vector<RankPeak> peaks = gather_peaks(mine, layout, MPI_COMM_WORLD);
  if (rank != 0) return;
  if (!o.in_process && !o.quiet)
    std::printf("  transport: %s on %s\n", mine.transport.c_str(), pc.device.is_cuda() ? "cuda" : "cpu");
  const bool interleaved = plan.options.schedule.virtual_stages() > 1;
  const std::vector<int64_t> predicted = plan.rank_peak_bytes(true);
  if (!o.in_process)
    for (const RankPeak& r : peaks)
      std::printf("  %s %d%s: measured peak %s (predicted %s)%s%s%s\n", interleaved ? "rank" : "stage", r.stage,
                  layout.replicas > 1 ? (" of replica " + std::to_string(r.replica)).c_str() : "",
                  format_bytes(double(r.peak_bytes)).c_str(),
                  format_bytes(double(predicted[static_cast<size_t>(r.stage)])).c_str(),
                  pc.device.is_cuda()
                      ? (", the caching allocator held up to " + format_bytes(double(r.reserved_peak_bytes))).c_str()
                      : "",
                  // Replicas: what each holds of the optimizer state (a shard under ZeRO), in bytes.
                  layout.replicas > 1
                      ? (", optimizer state " + std::to_string(r.optimizer_state_bytes) + " bytes").c_str()
                      : "",
                  // ZeRO: what its all-gathers received (in the compute precision).
                  r.gathered_bytes > 0 ? (", gathered " + std::to_string(r.gathered_bytes) + " bytes").c_str() : "");
  // The schedule's timed simulation of the plan's stage times beside what the steps took.
  if (!o.in_process && (layout.stages > 1 || layout.replicas > 1) && progress.steady_samples_per_second() > 0)
    std::printf(
        "  step: %.1f ms measured after the first, %.1f ms predicted (the plan's stage times through the "
        "schedule, %.0f%% idle)\n",
        1e3 * o.samples_per_step / progress.steady_samples_per_second(), plan.step_ms(), 100 * plan.bubble_fraction());
  const double trained = static_cast<double>(mine.next_step - pc.first_step);
  // Steady state first: the first step pays for the pipeline fill and first allocations.
  std::printf("%s: %" PRId64 " steps, final loss %.9g, %.1f samples/s after the first step (%.1f with it)\n",
              mine.stop_signal ? "stopped" : "done", mine.next_step, progress.last_loss(),
              progress.steady_samples_per_second(), seconds > 0 ? o.samples_per_step * trained / seconds : 0.0);
  print_model_flops(o, progress.steady_samples_per_second());
  if (!o.save_path.empty()) report_saved_weights(o);
  if (!mine.stop_signal && !o.checkpoint_dir.empty())  // a stopped run says so in print_stop
    std::printf("wrote checkpoint %s/step-%" PRId64 " (--resume with a larger --steps trains on)\n",
                o.checkpoint_dir.c_str(), mine.next_step);
  if (!o.trace_path.empty())
    std::printf("wrote trace %s (dawnpiper inspect %s)\n", o.trace_path.c_str(), o.trace_path.c_str());
}

void print_model_flops(const TrainOptions& o, double samples_per_s) {
  const double flops = samples_per_s * o.flops_per_sample;
  if (!(flops > 0)) return;
  if (o.peak_flops > 0)
    std::printf("model FLOPs: %.2f TFLOP/s after the first step, MFU %.1f%% of %s\n", flops / 1e12,
                100 * flops / o.peak_flops, o.peak_what.c_str());
  else
    std::printf("model FLOPs: %.3g TFLOP/s after the first step (%s)\n", flops / 1e12,
                o.peak_what.empty() ? "no peak known for this device" : o.peak_what.c_str());
}

StepMetrics step_metrics(int64_t step, double loss, double lr, double grad_norm, std::vector<int64_t> peaks,
                         const Progress& progress, const TrainOptions& o, int64_t tokens_per_sample) {
  StepMetrics m;
  m.step = step;
  m.loss = loss;
  m.lr = lr;
  m.grad_norm = grad_norm;
  m.step_s = progress.last_step_seconds();
  m.samples_per_s = m.step_s > 0 ? o.samples_per_step / m.step_s : 0;
  m.tokens_per_s = m.samples_per_s * static_cast<double>(tokens_per_sample);
  m.model_flops_per_s = m.samples_per_s * o.flops_per_sample;
  if (o.peak_flops > 0) m.mfu = m.model_flops_per_s / o.peak_flops;
  m.peak_bytes = std::move(peaks);
  return m;
}

void print_stop(int signal, int64_t next_step, const TrainOptions& o) {
  std::printf(
      "stopped by %s after step %" PRId64 " (exit %d): %s\n", stop_signal_name(signal), next_step - 1, 128 + signal,
      o.checkpoint_dir.empty() ? "no checkpoint written (give --checkpoint-dir DIR to keep a stopped run's work)"
                               : ("checkpoint " + o.checkpoint_dir + "/step-" + std::to_string(next_step) +
                                  " written; continue with the same command and --resume")
                                     .c_str());
}

void print_evaluation(double loss, const TrainOptions& o, int64_t step) {
  std::printf("validation loss %.9g: the mean of %" PRId64 " micro-batches of the validation split, weights %s\n", loss,
              o.eval_batches,
              o.resume ? ("of the checkpoint at step " + std::to_string(step) + " in " + o.checkpoint_dir).c_str()
                       : "before any training");
}

void report_saved_weights(const TrainOptions& o) {
  if (o.save_directory.empty() || o.hf_config.empty()) {
    std::printf("wrote weights %s\n", o.save_path.c_str());
    return;
  }
  write_text_atomically(o.save_directory + "/config.json", o.hf_config);
  std::printf("wrote weights %s and %s/config.json (transformers' from_pretrained(\"%s\") loads them)\n",
              o.save_path.c_str(), o.save_directory.c_str(), o.save_directory.c_str());
}

}  // namespace dawnpiper
