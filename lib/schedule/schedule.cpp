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

// Appends the forward of `mb` on stage x with its receive and send.
void forward(std::vector<Action>& list, int x, int stages, int64_t mb) {
  if (x > 0) list.push_back({ActionKind::RecvActivation, x, mb});
  list.push_back({ActionKind::Forward, x, mb});
  if (x < stages - 1) list.push_back({ActionKind::SendActivation, x, mb});
}

void backward(std::vector<Action>& list, int x, int stages, int64_t mb) {
  if (x < stages - 1) list.push_back({ActionKind::RecvGrad, x, mb});
  list.push_back({ActionKind::Backward, x, mb});
  if (x > 0) list.push_back({ActionKind::SendGrad, x, mb});
}

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
    for (int64_t i = 0; i < warmup; ++i) forward(list, x, stages, i);
    for (int64_t i = warmup; i < m; ++i) {  // steady state: one forward, one backward
      forward(list, x, stages, i);
      backward(list, x, stages, i - warmup);
      if (step_every_backward) update(list, x);
    }
    for (int64_t j = m - warmup; j < m; ++j) {  // drain
      backward(list, x, stages, j);
      if (step_every_backward) update(list, x);
    }
    if (!step_every_backward) update(list, x);
  }
  return s;
}

}  // namespace

Schedule make_gpipe_schedule(int stages, int64_t m) {
  check_sizes(stages, m);
  Schedule s{ScheduleKind::GPipe, stages, m, {}};
  s.actions.resize(static_cast<size_t>(stages));
  for (int x = 0; x < stages; ++x) {
    std::vector<Action>& list = s.actions[static_cast<size_t>(x)];
    for (int64_t i = 0; i < m; ++i) forward(list, x, stages, i);
    for (int64_t i = 0; i < m; ++i) backward(list, x, stages, i);
    update(list, x);
  }
  return s;
}

Schedule make_1f1b_schedule(int stages, int64_t m) { return one_f_one_b(ScheduleKind::OneFOneB, stages, m); }

Schedule make_async_schedule(int stages, int64_t m) { return one_f_one_b(ScheduleKind::Async, stages, m); }

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
