#include "schedule/schedule.h"

#include <algorithm>
#include <ostream>

#include "util/error.h"

namespace dawnpiper {

std::string Schedule::to_string() const {
  std::string s;
  for (const std::vector<Action>& list : actions) {
    s += dawnpiper::to_string(list);
    s += '\n';
  }
  return s;
}

namespace {

void check_sizes(int stages, int64_t micro_batches) {
  if (stages < 1) throw ConfigError("a schedule needs at least one stage");
  if (micro_batches < 1) throw ConfigError("a schedule needs at least one micro-batch");
}

// The generators write compute actions only; add_communication adds the sends and receives.
void forward(std::vector<Action>& list, int x, int64_t mb) { list.push_back({ActionKind::Forward, x, mb}); }
void backward(std::vector<Action>& list, int x, int64_t mb) { list.push_back({ActionKind::Backward, x, mb}); }

void update(std::vector<Action>& list, int x) { list.push_back({ActionKind::OptimizerStep, x, -1}); }

// 1F1B body shared by the synchronous and the asynchronous schedule.
Schedule one_f_one_b(ScheduleKind kind, int stages, int64_t m) {
  check_sizes(stages, m);
  bool step_every_backward = kind == ScheduleKind::Async;
  Schedule s{kind, stages, m, {}};
  s.actions.resize(static_cast<size_t>(stages));
  for (int x = 0; x < stages; ++x) {
    std::vector<Action>& list = s.actions[static_cast<size_t>(x)];
    int64_t warmup = std::min<int64_t>(stages - x - 1, m);
    for (int64_t i = 0; i < warmup; ++i) forward(list, x, i);
    for (int64_t i = warmup; i < m; ++i) {  // steady state: one forward, one backward
      forward(list, x, i);
      backward(list, x, i - warmup);
      if (step_every_backward) update(list, x);
    }
    for (int64_t j = m - warmup; j < m; ++j) {  // drain
      backward(list, x, j);
      if (step_every_backward) update(list, x);
    }
    if (!step_every_backward) update(list, x);
  }
  add_communication(s);
  return s;
}

}  // namespace

void add_communication(Schedule& schedule) {
  const int last = schedule.stages - 1;
  for (std::vector<Action>& list : schedule.actions) {
    std::vector<Action> with;
    with.reserve(3 * list.size());
    for (const Action& a : list) {
      const bool forward = a.kind == ActionKind::Forward, backward = a.kind == ActionKind::Backward;
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

Schedule make_gpipe_schedule(int stages, int64_t m) {
  check_sizes(stages, m);
  Schedule s{ScheduleKind::GPipe, stages, m, {}};
  s.actions.resize(static_cast<size_t>(stages));
  for (int x = 0; x < stages; ++x) {
    std::vector<Action>& list = s.actions[static_cast<size_t>(x)];
    for (int64_t i = 0; i < m; ++i) forward(list, x, i);
    for (int64_t i = 0; i < m; ++i) backward(list, x, i);
    update(list, x);
  }
  add_communication(s);
  return s;
}

Schedule make_1f1b_schedule(int stages, int64_t m) { return one_f_one_b(ScheduleKind::OneFOneB, stages, m); }

Schedule make_async_schedule(int stages, int64_t m) { return one_f_one_b(ScheduleKind::Async, stages, m); }

const ScheduleTraits& schedule_traits(ScheduleKind kind) {
  static const ScheduleTraits synchronous{};
  static const ScheduleTraits pipedream{/*updates_once_per_step=*/false, /*drains_every_step=*/false,
                                        /*stashes_weights=*/true};
  return kind == ScheduleKind::Async ? pipedream : synchronous;
}

Schedule make_schedule(ScheduleKind kind, int stages, int64_t m) {
  switch (kind) {
    case ScheduleKind::GPipe:
      return make_gpipe_schedule(stages, m);
    case ScheduleKind::OneFOneB:
      return make_1f1b_schedule(stages, m);
    case ScheduleKind::Async:
      return make_async_schedule(stages, m);
  }
  throw ConfigError("unknown schedule kind");
}

Schedule make_schedule(const std::string& name, int stages, int64_t m) {
  return make_schedule(from_name<ScheduleKind>(name), stages, m);
}

std::vector<Action> with_tied_reduce(const std::vector<Action>& actions) {
  std::vector<Action> out;
  out.reserve(actions.size() + actions.size() / 4);
  for (const Action& a : actions) {
    if (a.kind == ActionKind::OptimizerStep) out.push_back(Action{ActionKind::ReduceTiedGrads, a.stage, -1, -1});
    out.push_back(a);
  }
  return out;
}

}  // namespace dawnpiper
