#pragma once
// The predicted peak memory of one pipeline stage, by replaying its stage program (the actions
// and evictions the runtime executes, plan/stage_program.h) allocation by allocation over the
// profile. Pure C++.
//
// What it holds, as the runtime does (runtime/pipeline_stage.cpp, runtime/evictor.cpp):
//   - parameters (owned, and copies of tied ones owned by another stage), their gradients from
//     the backward that creates them until the optimizer step, optimizer state from the first
//     step on, and (async) one stashed copy per weight version in use;
//   - per micro-batch in flight: the data it loads, the activations it receives (until their
//     gradients are sent back, with those gradients), every tensor until its last forward reader
//     or saving backward has run, the tensors it sends (until its backward), the gradients it
//     receives (during its backward), and the gradients flowing through the backward; received
//     tensors arrive contiguous, so the copies the whole graph makes of them (TensorProfile::
//     copy_of) are not made;
//   - what a send keeps referenced until MPI completes it (assumed: the stage's next send): the
//     gradients sent back, copies of sent tensors the evictor empties;
//   - on the loss's stage, each micro-batch's loss until the runtime reads the step's losses
//     together (after the backward, B or I, that follows the step's last forward);
//   - a received permuted view laid out again as in the whole graph (a copy beside the received
//     buffer), and its gradient's contiguous copy beside it at the send;
//   - transients: each node's forward / backward workspace, a recomputation's re-run outputs
//     (all of them held until the re-run ends), Adam's temporary;
//   - evicted tensors are gone from their last forward use (or their send) until the backward
//     of TensorDecision::restore_before, or until an earlier re-run rebuilds them on the way
//     (re-run nodes are shared); what a recomputation reads stays until it has run.
// The cost model's formula (CostModel::memory) is the fast estimate the search uses; this is the
// per-stage prediction a plan reports and the runtime is measured against.
#include <cstdint>
#include <memory>
#include <vector>

#include "plan/cost_model.h"
#include "plan/plan.h"
#include "plan/stage_program.h"
#include "schedule/action.h"
#include "train/optimizer_kind.h"

namespace dawnpiper {

struct StageMemoryReplay {
  int64_t peak = 0;
  int peak_action = -1;           // index in the stage's action list
  int peak_node = -1;             // node running at the peak, -1 between nodes
  int64_t first_forward_end = 0;  // live bytes when the first forward ends
};

// Replays `program` (its actions once, twice for the synchronous schedules: the second pass is
// the steady state with the optimizer state allocated). `events`, when given, receives the
// evictor's actions (SwapOut, SwapIn, Recompute with the micro-batch and, for a re-run, the
// first tensor it rebuilds) in the order the runtime's evictor carries them out; `event_live`
// (with events) the bytes live at each (at a swap-out, without the tensor swapped out).
StageMemoryReplay replay_stage_program(const CostModel& model, const StageProgram& program,
                                       std::vector<Action>* events = nullptr,
                                       std::vector<int64_t>* event_live = nullptr);
// The profile's own training step: the whole graph as one stage training one micro-batch per
// step, nothing evicted (what `profile` reports beside the step it measures).
StageMemoryReplay replay_whole_step(const Profile& profile, OptimizerKind optimizer);
// The program of stage x over [b, e) with `decisions`, replayed.
StageMemoryReplay replay_stage_memory(const CostModel& model, int b, int e, int x,
                                      const std::vector<TensorDecision>& decisions);

// The peak of one rank running several stages (an interleaved schedule's), by replaying their
// programs together in the rank's order (CostModel::rank_actions): at every point the stage
// running an action adds its own high to what the rank's other stages hold then.
int64_t replay_rank_peak(const CostModel& model, const std::vector<StageProgram>& programs,
                         const std::vector<Action>& rank_actions);

namespace detail {
class StageReplay;
}
// replay_stage_memory for one stage under many decision sets (the planner's search tries
// several per stage): what does not depend on the decisions (storages, references, weights,
// messages) is set up once. The model must outlive it.
class StageReplayer {
 public:
  StageReplayer(const CostModel& model, int b, int e, int x);
  ~StageReplayer();
  StageReplayer(StageReplayer&&) noexcept;
  StageReplayer& operator=(StageReplayer&&) noexcept;
  StageMemoryReplay replay(const std::vector<TensorDecision>& decisions);

 private:
  std::unique_ptr<detail::StageReplay> replay_;
};

}  // namespace dawnpiper
