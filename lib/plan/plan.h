#pragma once
// Plan: the planner's output, the runtime's input. Stage boundaries over the profile's node order,
// a decision per saved tensor (keep, swap to host, recompute), and the cost model's predictions
// (time, peak memory with its breakdown) so runs can be compared with what was promised.
// Serialized as JSON (schema in docs/planner.md; `version` changes when fields change meaning).
#include <cstdint>
#include <climits>
#include <iosfwd>
#include <string>
#include <vector>

#include "plan/plan_options.h"
#include "schedule/simulate.h"
#include "util/dtype.h"
#include "util/enum_names.h"

namespace dawnpiper {

enum class TensorAction { Keep, Swap, Recompute };
template <>
struct EnumNames<TensorAction> {
  static constexpr const char* what = "tensor action";
  static constexpr std::array<std::pair<TensorAction, const char*>, 3> table{
      {{TensorAction::Keep, "keep"}, {TensorAction::Swap, "swap"}, {TensorAction::Recompute, "recompute"}}};
};

struct TensorDecision {
  int tensor = -1;
  int64_t bytes = 0;  // per micro-batch
  TensorAction action = TensorAction::Keep;
  // The stage's node whose backward reads the tensor first (backward runs in reverse: the last
  // saver in the stage); the runtime brings an evicted tensor back before it. -1: unknown.
  int restore_before = -1;
  // Swap: the node whose backward starts the copy back (>= restore_before): the backward of the
  // nodes from it down to restore_before + 1 takes at least the copy's time, so the copy hides
  // behind them on a GPU. The bytes are on the device from there on. -1: restore_before.
  int prefetch_at = -1;
};

// One tensor a stage's program evicts: the decision placed where the stage carries it out
// (plan/stage_program.h derives it; the runtime's Evictor executes it, the memory replays
// simulate it). Its storage is emptied after the forward of `evict_after` (or once the
// micro-batch's activations are sent) and is back before the backward of `restore_before`.
struct Eviction {
  int tensor = -1;
  TensorAction action = TensorAction::Swap;  // Swap | Recompute
  int evict_after = -1;                      // node; -1: after the micro-batch's activations are sent
  int restore_before = -1;                   // node whose backward reads it first
  // Swap: the node whose backward starts the copy back (>= restore_before); from there on the
  // bytes are on the device. Recompute: restore_before.
  int prefetch_at = -1;
  std::vector<int>
      rerun;  // recompute: the nodes re-run, ascending (the producer, and producers of inputs not on the device)
  std::vector<int> leaves;  // recompute: the tensors the re-run reads, held from the forward until it ran
  // An autograd-internal buffer (TensorProfile::internal; `tensor` is past the graph's): the node
  // that makes it and the input it is a contiguous copy of (-1: the node's own buffer, a dropout
  // mask or a loss's log-probabilities). The executor holds it by these (exposed_internal).
  struct Internal {
    int node = -1;
    int copy_of = -1;
    bool operator==(const Internal& o) const { return node == o.node && copy_of == o.copy_of; }
  } internal;
  bool operator==(const Eviction& o) const {
    return tensor == o.tensor && action == o.action && evict_after == o.evict_after &&
           restore_before == o.restore_before && prefetch_at == o.prefetch_at && rerun == o.rerun &&
           leaves == o.leaves && internal == o.internal;
  }
};

struct TensorBytes {
  int tensor = -1;
  int64_t bytes = 0;
};

// Predicted peak memory of one stage: parameters (with stashed versions), gradients, optimizer
// states, the saved activations of the micro-batches in flight, and the largest transient
// workspace of one op.
struct MemoryBreakdown {
  int64_t weights = 0;          // one copy of the stage's parameters (ZeRO level 3: a replica's shard + a bucket)
  int weight_versions = 1;      // copies alive at once (async weight stashing), from simulation
  int64_t stashed_weights = 0;  // (weight_versions - 1) * weights
  int64_t gradients = 0;
  int64_t optimizer = 0;                   // optimizer_state_multiplier * weights
  int64_t activation_per_micro_batch = 0;  // saved tensors kept on the device, one micro-batch
  int in_flight = 0;                       // micro-batches alive at once, from simulation
  int64_t activations = 0;                 // in_flight * activation_per_micro_batch
  int64_t transient = 0;
  int64_t constants = 0;  // computed once per stage (causal masks, position buckets)
  // What the device's runtime and libraries hold through its allocator (Profile::runtime_bytes):
  // cuBLAS workspaces on CUDA, 0 on the CPU.
  int64_t runtime = 0;
  // The prediction the runtime is measured against: the stage's action list replayed
  // allocation by allocation with its decisions (plan/stage_memory.h). It adds what the terms
  // above leave out (gradients in flight, received and sent activations no node saves, data,
  // tied-weight copies, send buffers, restores) and times their overlap. 0: not computed.
  int64_t replayed_peak = 0;
  // What the stage needs: the replay when there is one, else the terms' sum.
  int64_t predicted_peak() const { return replayed_peak > 0 ? replayed_peak : total(); }
  int64_t total() const {
    return weights + stashed_weights + gradients + optimizer + activations + transient + constants + runtime;
  }
};

struct StagePlan {
  int index = 0;
  int begin = 0, end = 0;  // node range [begin, end) in profile order
  double compute_ms = 0;   // sum of fwd + bwd of the nodes, per micro-batch
  double forward_ms = 0;   // the forwards' share of compute_ms (the step's simulation times passes apart)
  double weight_ms = 0;    // the backwards' part a split backward's W takes (zero-bubble schedules)
  double memopt_ms = 0;    // swap stalls + recomputation, per micro-batch
  // Data parallelism: the collectives of one update (CostModel::allreduce_ms: the gradient
  // allreduce, or ZeRO's reduce-scatters and gathers), and their share per micro-batch (a
  // step's m micro-batches share one update under gpipe / 1f1b; async updates every time).
  double allreduce_ms = 0, allreduce_per_micro_batch_ms = 0;
  // ... and where in the step they run (CostModel::collectives): what Plan::time_step simulates.
  double reduce_ms = 0, reduce_tail_ms = 0, at_update_ms = 0, gather_ms = 0, pass_ms = 0;
  // The optimizer's update of the stage's parameters (its shard at ZeRO levels above 0), and its
  // share per micro-batch as above (CostModel::update_ms; 0: the profile has no update times).
  double update_ms = 0, update_per_micro_batch_ms = 0;
  double time_ms() const { return compute_ms + memopt_ms + allreduce_per_micro_batch_ms + update_per_micro_batch_ms; }
  MemoryBreakdown memory;                    // after memory optimization
  int64_t peak_without_memopt = 0;           // the formula's, as the search sees it
  int64_t replayed_peak_without_memopt = 0;  // the replay's, keeping every tensor (0: unknown)
  std::vector<TensorBytes> crossing;         // tensors sent towards later stages at `end`
  int64_t crossing_bytes = 0;
  std::vector<TensorDecision> decisions;  // every saved tensor of the stage
  std::vector<Eviction> evictions;        // the decisions that evict, placed (the stage program's)
};

struct Plan {
  static constexpr int kVersion = 2;  // 2: stages carry their evictions
  int version = kVersion;
  std::string model, preset;              // from the profile, for the reader's orientation
  Precision precision = Precision::Fp32;  // the profile's: train refuses to run the plan in another
  std::string graph_hash;                 // the profile's OpGraph::fingerprint(): train refuses another graph
  PlanOptions options;                    // the inputs; options.stages == stages.size()
  int64_t micro_batch_size = 1;
  int nodes = 0;           // profile size the node ranges refer to
  double planning_ms = 0;  // wall time of the search
  std::vector<StagePlan> stages;
  // Several stages per rank (interleaved): each rank's stages replayed together
  // (replay_rank_peak); empty otherwise.
  std::vector<int64_t> rank_replayed_peaks;

  // One training step as the schedule's action lists run it (simulate_times): every stage's
  // forwards and backwards (with its evictions' stalls) in the list's order, each message one
  // link transfer of the cut's bytes, and the replicas' collectives on their own link where the
  // runtime starts them (StagePlan::reduce_ms ...: the update waits for what the drain did not
  // hide; plans written before them add the slowest stage's whole allreduce instead). A stream that never
  // drains (async) takes m periods of the slowest stage in its steady state. Simulated once, by
  // time_step, where the plan is made and where it is read.
  double step_ms() const { return timed_step_ms; }
  // The idle share of the stages' time in that step (bubbles and waits), averaged over stages.
  double bubble_fraction() const { return timed_idle_share; }
  double timed_step_ms = 0, timed_idle_share = 0;
  void time_step();
  double bottleneck_ms() const;  // slowest stage: the pipeline's per-micro-batch period
  // Per rank, what its stages hold at once: the rank replay's (predicted; where there is none,
  // the stages' replayed peaks summed) or the search formula's peaks summed.
  std::vector<int64_t> rank_peak_bytes(bool predicted) const;
  int64_t max_peak_bytes() const;            // of the ranks, by the search's formula
  int64_t max_predicted_peak_bytes() const;  // of the ranks, what the runtime is measured against (the replay)
  std::string to_json(int indent = 2) const;
  void print_table(std::ostream& out) const;
};

// Throws ConfigError when the text is not a plan of a version this build reads.
Plan plan_from_json(const std::string& text);

}  // namespace dawnpiper
