#pragma once
// What a `train` run prints: its header (the plan per stage, what is evicted, the threads), each
// --metrics-out record, the summary with every stage's measured peak, and the lines of a stopped
// run, an evaluation and the weights written. Rank 0 prints; print_run_report is collective.
#include <cstdint>
#include <string>
#include <vector>

#include "cli/train_options.h"
#include "graph/op_graph.h"
#include "plan/plan.h"
#include "runtime/pipeline.h"
#include "runtime/rank_layout.h"
#include "train/metrics_log.h"
#include "util/progress.h"

namespace dawnpiper {

void print_threads(const ThreadCount& t);
// "adamw lr 0.0003 (cosine after 100 warmup steps to 3e-05), weight decay 0.1, grad clip 1"
std::string optimizer_summary(const OptimizerConfig& o);
// The training line, the threads, every stage's cut, predicted peak and evictions, tied weights.
void print_run_header(const OpGraph& graph, const Plan& plan, const PipelineConfig& pc, const RankLayout& layout,
                      const TrainOptions& o);
// Measured peaks next to the plan's predictions, the transport, throughput. Collective over
// MPI_COMM_WORLD (every rank's peaks); rank 0 prints.
void print_run_report(const Plan& plan, const PipelineConfig& pc, const RankLayout& layout, const TrainOptions& o,
                      const StageRun& mine, int rank, const Progress& progress, double seconds);
// A step's line of --metrics-out: what was reported, with the rates Progress measured.
// "model FLOPs: 12.34 TFLOP/s after the first step, MFU 5.6% of NVIDIA H100 ..., bf16 dense 989
// TFLOP/s": the graph's FLOPs per sample times the steady samples/s, over the GPUs' peak.
void print_model_flops(const TrainOptions& o, double samples_per_s);
StepMetrics step_metrics(int64_t step, double loss, double lr, double grad_norm, std::vector<int64_t> peaks,
                         const Progress& progress, const TrainOptions& o, int64_t tokens_per_sample);
// The line a run stopped by a signal ends with: where its work is.
void print_stop(int signal, int64_t next_step, const TrainOptions& o);
// --eval-only's one line; `step`: the checkpoint's (steps trained).
void print_evaluation(double loss, const TrainOptions& o, int64_t step);
// After the weights: config.json beside them (--save-weights DIR), and the line saying so.
void report_saved_weights(const TrainOptions& o);

}  // namespace dawnpiper
