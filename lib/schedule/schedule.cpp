#include "schedule/schedule.h"

#include <utility>

namespace dawnpiper {

std::string Schedule::to_string() const {
  std::string s;
  for (const std::vector<Action>& list : actions) {
    s += dawnpiper::to_string(list);
    s += '\n';
  }
  return s;
}

void add_communication(Schedule& schedule) {
  const int last = schedule.stages - 1;
  for (std::vector<Action>& list : schedule.actions) {
    std::vector<Action> with;
    with.reserve(3 * list.size());
    for (const Action& a : list) {
      const bool forward = a.kind == ActionKind::Forward, backward = passes_gradient_back(a.kind);
      const bool from_before = forward && a.stage > 0, from_after = backward && a.stage < last;
      if (from_before) with.push_back({ActionKind::RecvActivation, a.stage, a.micro_batch});
      if (from_after) with.push_back({ActionKind::RecvGrad, a.stage, a.micro_batch});
      with.push_back(a);
      if (forward && a.stage < last) with.push_back({ActionKind::SendActivation, a.stage, a.micro_batch});
      if (backward && a.stage > 0) with.push_back({ActionKind::SendGrad, a.stage, a.micro_batch});
    }
    list = std::move(with);
  }
}

std::vector<Action> stage_list(const ScheduleTraits& traits, std::vector<Action> actions, bool holds_tied_across) {
  if (!traits.updates_once_per_step || !holds_tied_across) return actions;
  std::vector<Action> out;
  out.reserve(actions.size() + actions.size() / 4);
  for (const Action& a : actions) {
    if (a.kind == ActionKind::OptimizerStep) out.push_back(Action{ActionKind::ReduceTiedGrads, a.stage, -1, -1});
    out.push_back(a);
  }
  return out;
}

}  // namespace dawnpiper
