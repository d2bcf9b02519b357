#pragma once
// Running a pipeline: every stage's PipelineStage executing its schedule's action lists, either
// one stage per MPI rank (the real thing) or all stages in one process in a valid global order
// of the same lists (the reference for the asynchronous schedule, and tests).
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "exec/stage_module.h"
#include "graph/op_graph.h"
#include "runtime/pipeline_stage.h"
#include "runtime/pipeline_transport.h"
#include "schedule/schedule.h"
#include "trace/trace.h"
#include "train/optimizer.h"

namespace dawnpiper {

// A whole run: the settings its stages share, and how the graph is cut and stepped.
struct PipelineConfig : StageSettings {
  std::vector<std::pair<int, int>> ranges;  // node range [begin, end) of each stage
  int64_t steps = 1;                        // train steps first_step .. steps - 1
  int64_t first_step = 0;                   // > 0 when resuming from a checkpoint
  // Async: the pipeline drains after every K steps (where checkpoints are written: there no
  // micro-batch is in flight and no stashed weight version alive); 0: it never drains.
  int64_t drain_every = 0;
  std::vector<std::vector<Eviction>> evictions;  // per stage (the plan's); empty: keep all
  // Sharded data parallelism over each stage's replicas (runtime/zero_shard.h): 0 to 3, and 0
  // with one replica; buckets of about bucket_bytes.
  int zero_stage = 0;
  int64_t bucket_bytes = int64_t{25} << 20;
};

// The configuration of one stage of `config`: the settings every stage shares and the stage's
// program, made by the planner's function (plan/stage_program.h) with the graph's tied owners.
StageConfig stage_config(const OpGraph& graph, const PipelineConfig& config, int stage);

// Names of the parameters several stages hold copies of (weights tied across a cut). The
// synchronous schedules sum their gradients before every update; the asynchronous one updates
// each copy with its own stage's gradients (PipeDream has no rule for them), so they drift apart.
// Keyed by the stages holding the copies, in order.
std::map<std::vector<int>, std::vector<std::string>> tied_across_stages(const OpGraph& graph,
                                                                        const PipelineConfig& config);

// Throws ConfigError unless the ranges tile the graph's nodes in order, non-empty.
void check_ranges(const OpGraph& graph, const std::vector<std::pair<int, int>>& ranges);

// What a plan fixes of a run: schedule, stage ranges (checked against `graph`) and their
// evictions, micro-batches per step, optimizer kind. The caller sets the rest.
PipelineConfig pipeline_config_of(const Plan& plan, const OpGraph& graph);

// Pipeline ranks: the stages over the schedule's virtual stages per rank.
int ranks_of(const PipelineConfig& config);

// The action list of one rank for the whole run: for the synchronous schedules one schedule per
// step, its micro-batch ids offset by step * micro_batches; for async one stream of
// micro-batches per stretch between drains (drain_every). Steps before first_step are left out
// (a resumed async run starts at a drain: its checkpoint was written there). Under synchronous
// schedules a stage holding weights tied across stages sums their gradients in a
// ReduceTiedGrads before its rank's updates.
std::vector<Action> rank_actions(const OpGraph& graph, const PipelineConfig& config, int rank);
// One stage's actions of its rank's list.
std::vector<Action> stage_actions(const OpGraph& graph, const PipelineConfig& config, int stage);

// A finished step as rank 0 reports it (a validation: step and loss only).
struct StepReport {
  int64_t step = 0;
  double loss = 0;
  double lr = 0;                    // the rate its updates used
  double grad_norm = 0;             // global, before clipping; NaN under async
  std::vector<int64_t> peak_bytes;  // per stage, measured during the step (MPI runs)
};

struct InProcessResult {
  std::vector<StepReport> losses;                       // without peak_bytes
  std::vector<std::vector<StageParameter>> parameters;  // per stage, after the run
};

// All stages in this process, actions in the order simulate_global gives (a valid global
// order: every receive after its send). `on_step`, when given, gets each step's loss once every
// stage has finished that step and the device has finished its work (so a clock read there times
// the step), in step order.
InProcessResult run_pipeline_in_process(const OpGraph& graph, const PipelineConfig& config,
                                        const std::function<void(const StepReport&)>& on_step = {});

// What a distributed run does besides training.
struct RunConfig {
  std::function<void(const StepReport&)> on_loss;  // rank 0, every finished step, in step order
  bool trace = false;                              // keep a record per action (trace/trace.h)
  std::string checkpoint_dir;                      // write / resume checkpoints here
  int64_t checkpoint_every = 0;                    // steps between checkpoints; 0: none
  int keep_checkpoints = 2;                        // complete checkpoints kept (write_checkpoint)
  bool resume = false;  // load the checkpoint of step config.first_step (checked_resume_step()) first
  std::string preset;   // checkpoint identity (with the optimizer)
  TransportKind transport = TransportKind::Auto;
  // Validation: every `eval_every` steps (at drains under async), `eval_batches` micro-batches
  // of the validation split; rank 0 gets the mean loss.
  int64_t eval_every = 0, eval_batches = 1;
  std::function<void(const StepReport&)> on_validation;
  // Evaluate once after the (resumed) start, training nothing (config.steps == first_step); the
  // report's step is first_step - 1 (the step the weights are after; -1: before any).
  bool eval_only = false;
  // Stop where a step ends when a stop signal arrives (util/stop_request.h; the caller installs
  // the handlers), with a checkpoint if checkpoint_dir is set. Async stops only at its drains.
  bool stop_on_signal = false;
  // Data parallelism: this stage's ranks in every replica (rank = replica), MPI_COMM_NULL
  // without. Gradients are averaged over it before each update, losses too; replica 0 reports
  // and writes checkpoints.
  MPI_Comm replica_comm = MPI_COMM_NULL;
};

struct StageRun {
  std::vector<StageParameter> parameters;  // after the run
  std::vector<ActionRecord> actions;       // this stage's, when traced
  int64_t peak_bytes = 0;                  // measured over the run's actions
  int64_t reserved_peak_bytes = 0;         // the device allocator's most held (DeviceMemory::reserved_peak_bytes)
  int64_t optimizer_state_bytes = 0;       // the rank's optimizer state after the run (a shard of it under ZeRO)
  int64_t gathered_bytes = 0;              // ZeRO: what the rank's all-gathers received (checkpoints' too)
  double wall_s = 0;                       // common start to this stage's last action's end
  std::string transport;                   // what carried the tensors (PipelineTransport::description)
  int stop_signal = 0;                     // the signal that stopped the run early, or 0
  int64_t next_step = 0;                   // the first step not trained (config.steps unless stopped)
};

// The tensors no parameter feeds that a stage starting at node `begin` receives (integer and
// boolean ones: positions, masks, ids; floating ones: relative-position buckets on their way to
// an index, rotary tables, additive masks), computed for real on the first micro-batch's
// synthetic data by running only the nodes they depend on: what a stage run alone (run-stage)
// needs besides stand-ins, whose random values would index out of range.
std::map<int, at::Tensor> exact_constant_inputs(const OpGraph& graph, int begin, uint64_t seed);

// This rank's stages (rank == stage in `comm`, size == stages; or the stages s with s mod size ==
// rank under an interleaved schedule).
StageRun run_pipeline_mpi(const OpGraph& graph, const PipelineConfig& config, MPI_Comm comm, const RunConfig& options);

}  // namespace dawnpiper
