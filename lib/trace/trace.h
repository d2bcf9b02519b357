#pragma once
// Run traces: what every stage executed (one record per action, with times, bytes moved and
// memory) and one record per stage, stored in HDF5 (docs/trace-format.md) and summarized per
// stage by `dawnpiper inspect`. No LibTorch here: the runtime fills the records.
#include <cstdint>
#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

#include "schedule/action.h"
#include "schedule/simulate.h"

namespace dawnpiper {

// Plain data, so ranks can send records to rank 0 as bytes.
struct ActionRecord {
  int64_t stage = 0;
  int64_t replica = 0;  // data-parallel replica (0 without data parallelism)
  int64_t kind = 0;     // ActionKind
  int64_t micro_batch = -1;
  int64_t step = 0;
  double start_s = 0, end_s = 0;  // since the common start
  // The process's CPU time during the action (0 in traces older than this column). Where ranks
  // share cores, a compute action's wall time includes the time another rank ran on its core;
  // its CPU time is the stage's own work.
  double cpu_s = 0;
  int64_t bytes_sent = 0, bytes_received = 0;
  int64_t live_bytes = 0;  // when the action ended
  int64_t peak_bytes = 0;  // during the action (0 for evictor records)
  // Evictor records (SWAP_OUT, SWAP_IN, RECOMPUTE) happen inside a forward or backward: the
  // tensor (for RECOMPUTE the first of those rebuilt together) and the bytes moved or rebuilt.
  int64_t tensor = -1;
  int64_t memopt_bytes = 0;
  ActionKind action_kind() const { return static_cast<ActionKind>(kind); }
};

struct StageRecord {
  int64_t stage = 0, rank = 0;
  int64_t replica = 0;
  int64_t node_begin = 0, node_end = 0;
  int64_t parameters = 0;
  // Under interleaving (several stages per rank) both peaks are the rank's.
  int64_t predicted_peak_bytes = 0;
  double predicted_ms_per_micro_batch = 0;
  int64_t measured_peak_bytes = 0;
  char host[64] = {};
};

struct Trace {
  static constexpr int kSchemaVersion = 2;
  std::string model, preset, schedule, device, transport, created;
  std::string graph_hash;  // OpGraph::fingerprint() of the graph trained ("" in older files)
  int64_t stages = 0, micro_batch_size = 0, micro_batches = 0, first_step = 0, steps = 0;
  int64_t replicas = 1;        // data-parallel pipelines; micro_batches is per replica
  int64_t virtual_stages = 1;  // stages per rank (interleaved): stage s ran on rank s mod (stages / this)
  double wall_s = 0;
  std::vector<ActionRecord> actions;  // by stage, then execution order
  std::vector<StageRecord> stage_records;
};

// Atomic (temporary name, then rename). Throws ConfigError when the path is not writable.
void write_trace(const Trace& trace, const std::string& path);
// Throws ConfigError for a missing file, a non-trace file or another schema version.
Trace read_trace(const std::string& path);

// What `inspect` prints per stage.
struct StageSummary {
  int64_t stage = 0;
  double busy_s = 0;         // compute actions: F, B, U, RECOMPUTE, SWAP_*
  double busy_cpu_s = 0;     // the CPU time of those (traces with the cpu_s column)
  double comm_s = 0;         // sends and receives (receives include waiting for the sender)
  double comm_cpu_s = 0;     // the CPU time of those: near 0 where waiting does not spin
  double idle_fraction = 0;  // 1 - busy / wall (the bubble, plus communication not overlapped)
  int64_t peak_bytes = 0;
  int64_t bytes_sent = 0;
  int64_t forwards = 0, backwards = 0;               // backwards: B and I
  double mean_forward_ms = 0, mean_backward_ms = 0;  // a backward: B, or I and W
  int64_t weights = 0;                               // W
  double mean_weight_ms = 0;
  // Evictor work, inside the forwards and backwards above (not added to busy_s again).
  double memopt_s = 0;
  int64_t swapped_bytes = 0;  // out (each byte that went to the host once)
  int64_t recomputed_bytes = 0;
  // Data parallelism: averaging gradients with the other replicas, inside the optimizer steps
  // (mean over replicas).
  double allreduce_s = 0;
  // Level 0 on MPI: the time its reductions were in flight (the union of each bucket's span from
  // its start until seen complete, mean over replicas), of which the update waited allreduce_s.
  double reduction_s = 0;
};
std::vector<StageSummary> summarize(const Trace& trace);
// Samples per second over the whole run.
double throughput(const Trace& trace);
// What the run's own action lists allow: replica 0's recorded lists (its compute and its
// messages, in the order each stage ran them) through the schedule's timed simulation, each
// stage's forwards and backwards taking their mean times, its updates their mean, messages
// free. The gap to the measured wall is communication and variance; the idle share is the
// schedule's bubble at these stage times. Null where the records do not replay.
std::optional<TimedRun> schedule_bound(const Trace& trace);
void print_summary(const Trace& trace, std::ostream& out);

// What a traced run measured of each stage's work (replica 0): its nodes, and its forward plus
// backward per micro-batch in ms without the evictor's copies and re-runs inside them, over the
// steps after the first where there are any. cpu: the actions' CPU time instead of their wall
// time (see cpu_time_is_work). On a GPU the evictor's records time what the host waited for,
// not the copies and re-runs behind them, which stay in the forward's and backward's times.
struct StageCompute {  // indexed by stage
  int64_t node_begin = 0, node_end = 0;
  double ms = 0;
};
// Throws ConfigError for a trace without every stage's forwards and backwards (or without CPU
// times where cpu is asked for).
std::vector<StageCompute> measured_stage_compute(const Trace& trace, bool cpu);
// Whether a trace's CPU times measure its stages' own work: a CPU trace whose forwards and
// backwards took at most about one core each (one intra-op thread). Where ranks share cores,
// their wall time also counts the others' turns; with several threads, CPU time counts them all.
bool cpu_time_is_work(const Trace& trace);

// A stage's own work in busy time (compute, swaps and re-runs), against waiting and messages.
bool is_busy_work(ActionKind kind);
// SWAP_OUT, SWAP_IN, RECOMPUTE: records nested inside a forward or backward.
bool is_evictor(ActionKind kind);

}  // namespace dawnpiper
