#pragma once
// The one walk over action lists: every action kind goes to its own hook. The runtime's stage
// (runtime/pipeline_stage), the planner's memory replay (plan/stage_memory), the list checker and
// the timed simulation (schedule/simulate) each implement the hooks; a new kind of action is one
// more hook here, and every walk that does not handle it fails to compile.
#include "schedule/action.h"

namespace dawnpiper {

class ActionHooks {
 public:
  virtual ~ActionHooks() = default;
  virtual void forward(const Action& a) = 0;
  virtual void backward(const Action& a) = 0;
  virtual void backward_input(const Action& a) = 0;
  virtual void backward_weight(const Action& a) = 0;
  virtual void recv_activation(const Action& a) = 0;
  virtual void send_activation(const Action& a) = 0;
  virtual void recv_grad(const Action& a) = 0;
  virtual void send_grad(const Action& a) = 0;
  virtual void optimizer_step(const Action& a) = 0;
  virtual void reduce_tied_grads(const Action& a) = 0;
  // The runtime's own actions (SWAP_OUT, SWAP_IN, RECOMPUTE, ALLREDUCE): an evictor or the update
  // carries them out inside the actions above; traces record them. Schedules never hold them.
  virtual void runtime_action(const Action& a) = 0;
};

// Calls the hook of a's kind.
void run_action(const Action& a, ActionHooks& hooks);

}  // namespace dawnpiper
