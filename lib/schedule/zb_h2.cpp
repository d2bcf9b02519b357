// ZB-H2 (Qi et al., ICLR 2024): as zb-h1, every backward split into I and W, but stages forward
// further ahead (up to 2l-1 micro-batches held, from F until W), so that the first stage is not
// left waiting for its first I: with uniform stages the step takes m (F+I+W) + (l-1) F once
// m >= 2l, against zb-h1's m (F+I+W) + (l-1)(F+I-W). The lists come from a list schedule of
// unit passes: each stage, whenever it is free, runs an I whose gradient has arrived, else a
// forward while it holds fewer than 2l-1 micro-batches and its input has arrived, else the oldest
// W it holds; a stage with nothing ready waits for the first input to arrive. Its ranks keep two
// sends going (ScheduleTraits::sends_in_flight), as its forwards run ahead of the next stage.
#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <vector>

#include "schedule/registry.h"

namespace dawnpiper {

namespace {
struct UnitStage {
  int64_t clock = 0, forwarded = 0, inputs = 0;
  std::deque<int64_t> held;                               // I done, W not yet
  std::map<int64_t, int64_t> activation_at, gradient_at;  // micro-batch -> when it arrives
};
}  // namespace

ComputeLists zb_h2_actions(const ScheduleShape& shape) {
  const int l = shape.ranks;
  const int64_t m = shape.micro_batches, limit = 2 * int64_t{l} - 1;
  std::vector<UnitStage> st(static_cast<size_t>(l));
  for (int64_t mb = 0; mb < m; ++mb) st[0].activation_at[mb] = 0;
  ComputeLists lists(static_cast<size_t>(l));
  // A stage's next action and when it can start (INT64_MAX: none can): of those ready when the
  // stage is free, I before F before W; else the first to become ready.
  auto next = [&](int x, ActionKind& kind) {
    UnitStage& s = st[static_cast<size_t>(x)];
    int64_t start = std::numeric_limits<int64_t>::max();
    auto consider = [&](ActionKind k, int64_t ready) {  // called in priority order
      const int64_t at = std::max(s.clock, ready);
      if (at < start && start > s.clock) start = at, kind = k;
    };
    if (s.inputs < s.forwarded) {
      const auto g = s.gradient_at.find(s.inputs);
      if (x == l - 1)
        consider(ActionKind::BackwardInput, s.clock);
      else if (g != s.gradient_at.end())
        consider(ActionKind::BackwardInput, g->second);
    }
    const int64_t holds = s.forwarded - (s.inputs - static_cast<int64_t>(s.held.size()));
    if (s.forwarded < m && holds < limit) {
      const auto a = s.activation_at.find(s.forwarded);
      if (a != s.activation_at.end()) consider(ActionKind::Forward, a->second);
    }
    if (!s.held.empty()) consider(ActionKind::BackwardWeight, s.clock);
    return start;
  };
  for (int64_t done = 0; done < 3 * l * m; ++done) {
    int best_stage = -1;
    int64_t best_start = std::numeric_limits<int64_t>::max();
    ActionKind best_kind = ActionKind::Forward;
    for (int x = 0; x < l; ++x) {
      ActionKind kind = ActionKind::OptimizerStep;
      const int64_t start = next(x, kind);
      if (start < best_start) best_start = start, best_stage = x, best_kind = kind;
    }
    UnitStage& s = st[static_cast<size_t>(best_stage)];
    s.clock = best_start + 1;
    int64_t mb = 0;
    if (best_kind == ActionKind::Forward) {
      mb = s.forwarded++;
      if (best_stage + 1 < l) st[static_cast<size_t>(best_stage) + 1].activation_at[mb] = s.clock;
    } else if (best_kind == ActionKind::BackwardInput) {
      mb = s.inputs++;
      s.held.push_back(mb);
      if (best_stage > 0) st[static_cast<size_t>(best_stage) - 1].gradient_at[mb] = s.clock;
    } else {
      mb = s.held.front();
      s.held.pop_front();
    }
    lists[static_cast<size_t>(best_stage)].push_back({best_kind, best_stage, mb});
  }
  for (int x = 0; x < l; ++x) lists[static_cast<size_t>(x)].push_back({ActionKind::OptimizerStep, x, -1});
  return lists;
}

}  // namespace dawnpiper
