#include "schedule/schedule.h"

#include <set>
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

std::vector<Action> Schedule::stage_actions(int stage) const {
  std::vector<Action> out;
  for (const Action& a : actions.at(static_cast<size_t>(rank_of(stage))))
    if (a.stage == stage) out.push_back(a);
  return out;
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

std::vector<Action> add_tied_reductions(const ScheduleTraits& traits, std::vector<Action> actions,
                                        const std::set<int>& holding_tied) {
  if (!traits.updates_once_per_step || holding_tied.empty()) return actions;
  // A rank's updates of a step stand together at its list's end; its tied reductions come
  // before all of them, so that every rank meets its collectives (tied sums, then the norm
  // summed at the first update) in the same order.
  std::vector<Action> out;
  out.reserve(actions.size() + actions.size() / 4);
  for (size_t i = 0; i < actions.size(); ++i) {
    const bool first_update =
        actions[i].kind == ActionKind::OptimizerStep && (i == 0 || actions[i - 1].kind != ActionKind::OptimizerStep);
    for (size_t j = i; first_update && j < actions.size() && actions[j].kind == ActionKind::OptimizerStep; ++j)
      if (holding_tied.count(actions[j].stage))
        out.push_back(Action{ActionKind::ReduceTiedGrads, actions[j].stage, -1, -1});
    out.push_back(actions[i]);
  }
  return out;
}

bool holds_tied_across(const std::vector<int>& tied_owner, int begin, int end) {
  auto inside = [&](int n) { return n >= begin && n < end; };
  for (int n = 0; n < static_cast<int>(tied_owner.size()); ++n)
    if (tied_owner[static_cast<size_t>(n)] >= 0 && inside(n) != inside(tied_owner[static_cast<size_t>(n)])) return true;
  return false;
}

}  // namespace dawnpiper
