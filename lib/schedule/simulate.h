#pragma once
// Simulation of action lists. The planner's memory model takes its in-flight micro-batch and
// weight-version counts from simulate_stage (never from formulas), because the runtime executes
// the same lists. simulate_global checks that a whole schedule can run: it finds an interleaving
// in which every receive comes after its matching send, or reports the deadlock. A send does not
// wait for its receive, but a rank's next send waits until its previous one was received: the
// rank's transport completes one send before it starts the next (it holds one send buffer, as the
// memory replay counts), and MPI completes a large send only once it is received.
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "schedule/schedule.h"

namespace dawnpiper {

// A malformed action list or a deadlocked schedule: a bug in a generator or a hand-written list.
class ScheduleError : public std::logic_error {
 public:
  explicit ScheduleError(const std::string& what) : std::logic_error(what) {}
};

struct StageStats {
  int stage = 0;
  int64_t forwards = 0;
  int64_t backwards = 0;  // B and I actions
  int64_t optimizer_steps = 0;
  // Most micro-batches forwarded and not yet backwarded (B, or W after an I) at any point: how
  // many micro-batches' saved activations the stage holds at once.
  int max_in_flight = 0;
  // Most weight versions alive at once: the current one plus those stashed for in-flight
  // micro-batches whose forward used an older version (weight stashing).
  int max_weight_versions = 0;
  // For every micro-batch, the number of other forwards and backwards this stage runs between
  // that micro-batch's forward and its backward; distinct pairs only. The idle time of a saved
  // tensor (swap overlap) spans these passes.
  std::vector<std::pair<int, int>> gaps;

  // The shortest time between a forward's end and its own backward's start, with every forward
  // taking fwd_ms and every backward bwd_ms (0 when no micro-batch ran).
  double min_gap_ms(double fwd_ms, double bwd_ms) const;
};

// Simulates one stage's actions on their own (communication takes no time). `stages` is the pipeline
// depth, needed to check the sends and receives. Throws ScheduleError when the list is malformed:
// a forward or backward twice, a backward before its forward, a missing receive before a
// compute or a send before it, a micro-batch never backwarded.
StageStats simulate_stage(const std::vector<Action>& actions, int stages);
std::vector<StageStats> simulate_stages(const Schedule& schedule);  // per stage (Schedule::stage_actions)

// A global order of all actions of all ranks that respects every rank's list and puts each
// receive after its matching send. Throws ScheduleError on a deadlock (naming each rank's
// blocked action), on an unmatched send or receive, or when the stages do not all forward and
// backward the same micro-batches exactly once.
std::vector<Action> simulate_global(const Schedule& schedule);

// What one stage's compute actions take in a timed simulation.
struct StageTimes {
  double forward_ms = 0, backward_ms = 0, update_ms = 0;
  double send_ms = 0;    // a message over the cut after this stage, either way: its send to its arrival
  double weight_ms = 0;  // backward_ms's weight-gradient part: a W takes it, an I the rest
  // Data parallelism, on the replicas' own link beside the compute. reduce_ms: what the update
  // waits for, streamed from the start of the stage's last weight pass (B or W) of the step, its
  // last bucket (reduce_tail_ms) not before that pass ends; at_update_ms: what runs in the update
  // itself (the buckets of weights tied across stages, the all-gather after the optimizer).
  // A pass takes at least its own collectives: gather_ms in a forward or an input pass (ZeRO
  // level 3's gathers), pass_ms in a weight pass (level 2-3's reduce-scatters, level 3's gathers).
  double reduce_ms = 0, reduce_tail_ms = 0, at_update_ms = 0, gather_ms = 0, pass_ms = 0;
  // What the rank pays of those itself: a pass with collectives beside it takes this many ms
  // longer per ms of them (PlanSettings::replica_drag; 0: they run beside the compute), and the
  // streamed reduction lengthens the step's last weight pass so.
  double drag = 0;
};
struct TimedRun {
  double step_ms = 0;           // until the last stage's last action ends
  std::vector<double> busy_ms;  // per rank: time spent computing
  std::vector<double> idle_ms;  // per rank: step_ms less busy_ms (bubbles, waits)
};
// Runs the schedule in time: each rank executes its list in order; a forward, backward or
// update takes its stage's time (`times` per stage), a send none but the wait for its rank's
// previous send to be received; a receive waits until the cut's send_ms after its matching send. Throws ScheduleError
// where simulate_global does.
TimedRun simulate_times(const Schedule& schedule, const std::vector<StageTimes>& times);

}  // namespace dawnpiper
