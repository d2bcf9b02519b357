#pragma once
// Pipeline schedules as per-stage action lists (DeepSpeed / torch.distributed.pipelining style):
// the generator decides the order, the runtime only executes it, the planner simulates it.
//
// Stages are 0-based (x = 0 .. l-1), micro-batches 0 .. m-1. Every forward on a stage x > 0 is
// preceded by RECV_F and every forward on x < l-1 followed by SEND_F; symmetrically for
// backward with RECV_B / SEND_B. Sends are assumed non-blocking (buffered, e.g. MPI_Isend or a
// separate NCCL stream): a receive waits for its matching send, a send never waits.
//
//  gpipe  all m forwards, then all m backwards in the same order (0..m-1), then one optimizer
//         step. Every micro-batch is in flight at once: in-flight count m on every stage.
//  1f1b   synchronous 1F1B (DAPPLE / Megatron non-interleaved): stage x warms up with
//         w = min(l-x-1, m) forwards, then alternates one forward and one backward, drains the
//         last w backwards, then one optimizer step (a flush per mini-batch). In flight:
//         min(l-x, m) micro-batches.
//  async  PipeDream 1F1B without flush: the same warm-up and alternation, but an optimizer step
//         after every backward and weight stashing (a forward uses the current weights, its
//         backward the version that forward used). Stage x holds l-x micro-batches and l-x
//         weight versions in the steady state. The list covers a stream of `micro_batches`
//         micro-batches (the runtime passes steps * micro-batches per step); the drain at its
//         end happens once per run, not per mini-batch.
#include <algorithm>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "schedule/action.h"
#include "util/enum_names.h"

namespace dawnpiper {

enum class ScheduleKind { GPipe, OneFOneB, Async };
template <>
struct EnumNames<ScheduleKind> {
  static constexpr const char* what = "schedule";
  static constexpr std::array<std::pair<ScheduleKind, const char*>, 3> table{
      {{ScheduleKind::GPipe, "gpipe"}, {ScheduleKind::OneFOneB, "1f1b"}, {ScheduleKind::Async, "async"}}};
};

// What the runtime, the planner's memory replay and its cost model need to know of a schedule
// besides its action lists. Code outside lib/schedule asks these, never which schedule runs.
struct ScheduleTraits {
  // One optimizer step per training step on the summed gradients of all its micro-batches (each
  // loss scaled 1/m), reduced before it: tied weights across stages, data-parallel replicas, the
  // global norm that clipping needs. false: an update after every backward on that backward's
  // gradients alone (PipeDream).
  bool updates_once_per_step = true;
  // Nothing is in flight between steps, so one step's list repeats. false: one list for the run's
  // stream of micro-batches, drained only where the run asks (checkpoints, evaluation).
  bool drains_every_step = true;
  // A forward's weights are kept for its backward while updates happen in between (weight
  // stashing): a stage holds one weight version per micro-batch in flight.
  bool stashes_weights = false;

  // The factor of one micro-batch's loss in the gradients an update uses.
  double loss_scale(int64_t micro_batches) const {
    return updates_once_per_step ? 1.0 / static_cast<double>(micro_batches) : 1.0;
  }
  // Micro-batches to simulate for the steady state: one step, or for a stream at least enough to
  // fill and drain the pipeline twice.
  int64_t simulated_micro_batches(int stages, int64_t micro_batches) const {
    return drains_every_step ? micro_batches : std::max<int64_t>(micro_batches, 2 * stages);
  }
};
const ScheduleTraits& schedule_traits(ScheduleKind kind);

struct Schedule {
  ScheduleKind kind = ScheduleKind::GPipe;
  int stages = 0;
  int64_t micro_batches = 0;
  std::vector<std::vector<Action>> actions;  // actions[x]: stage x's list, in execution order

  // One line per stage, compact action forms ("0F0 0SEND_F0 0F1 ...").
  std::string to_string() const;
};

// Adds the communication that compute lists imply (as PyTorch's _add_send_recv): a receive
// before every forward on a stage with one before it and every backward on a stage with one
// after it, a send after each. Sends never block, so right after the compute is always safe; a
// receive right before its compute is as late as it can be. Every generator ends with it.
void add_communication(Schedule& schedule);
// Throws ConfigError for stages < 1 or micro_batches < 1.
Schedule make_gpipe_schedule(int stages, int64_t micro_batches);
Schedule make_1f1b_schedule(int stages, int64_t micro_batches);
Schedule make_async_schedule(int stages, int64_t micro_batches);
Schedule make_schedule(ScheduleKind kind, int stages, int64_t micro_batches);
Schedule make_schedule(const std::string& name, int stages, int64_t micro_batches);
// `actions` with a ReduceTiedGrads before every optimizer step: the list of a stage holding
// weights tied to another stage's under a synchronous schedule (PipeDream's asynchronous
// updates have no rule for tied weights: each copy is updated with its own stage's gradients).
std::vector<Action> with_tied_reduce(const std::vector<Action>& actions);

}  // namespace dawnpiper
