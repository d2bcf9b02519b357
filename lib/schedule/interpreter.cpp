#include "schedule/interpreter.h"

namespace dawnpiper {

void run_action(const Action& a, ActionHooks& hooks) {
  switch (a.kind) {
    case ActionKind::Forward:
      return hooks.forward(a);
    case ActionKind::Backward:
      return hooks.backward(a);
    case ActionKind::BackwardInput:
      return hooks.backward_input(a);
    case ActionKind::BackwardWeight:
      return hooks.backward_weight(a);
    case ActionKind::RecvActivation:
      return hooks.recv_activation(a);
    case ActionKind::SendActivation:
      return hooks.send_activation(a);
    case ActionKind::RecvGrad:
      return hooks.recv_grad(a);
    case ActionKind::SendGrad:
      return hooks.send_grad(a);
    case ActionKind::OptimizerStep:
      return hooks.optimizer_step(a);
    case ActionKind::ReduceTiedGrads:
      return hooks.reduce_tied_grads(a);
    case ActionKind::SwapOut:
    case ActionKind::SwapIn:
    case ActionKind::Recompute:
    case ActionKind::AllReduce:
      return hooks.runtime_action(a);
  }
}

}  // namespace dawnpiper
