#include "schedule/simulate.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

namespace dawnpiper {

double StageStats::min_gap_ms(double fwd_ms, double bwd_ms) const {
  if (gaps.empty()) return 0;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& g : gaps) best = std::min(best, g.first * fwd_ms + g.second * bwd_ms);
  return best;
}

namespace {

[[noreturn]] void malformed(const Action& a, const std::string& why) {
  throw ScheduleError("malformed action list at " + to_string(a) + ": " + why);
}

// Per micro-batch progress on one stage.
struct MicroBatchState {
  bool received_activation = false;
  bool forwarded = false;
  bool received_grad = false;
  bool backwarded = false;
  bool sent_activation = false;
  bool sent_grad = false;
  int64_t weight_version = 0;  // version its forward used
  int64_t forwards_at_forward = 0, backwards_at_forward = 0;
};

// One stage's action list replayed in order: checks each action against what came before it
// and counts passes, in-flight micro-batches, weight versions and backward gaps.
class ActionListChecker {
 public:
  ActionListChecker(int stage, int stages) : x_(stage), stages_(stages) { st_.stage = stage; }

  void apply(const Action& a) {
    if (a.stage != x_) malformed(a, "list mixes stages");
    const bool per_step =
        a.kind == ActionKind::OptimizerStep || a.kind == ActionKind::ReduceTiedGrads || a.kind == ActionKind::AllReduce;
    if (per_step) {
      if (a.kind == ActionKind::OptimizerStep) ++current_version_, ++st_.optimizer_steps;
    } else {
      if (a.micro_batch < 0) malformed(a, "negative micro-batch");
      MicroBatchState& mb = mbs_[a.micro_batch];
      if (a.kind == ActionKind::Forward)
        forward(a, mb);
      else if (a.kind == ActionKind::Backward)
        backward(a, mb);
      else
        transfer(a, mb);
    }
    st_.max_weight_versions = std::max(st_.max_weight_versions, live_versions());
  }

  // Every micro-batch that appeared ran both passes and sent what its neighbours wait for.
  StageStats finish() {
    for (const auto& [index, m] : mbs_) {
      Action probe{ActionKind::Forward, x_, index};
      if (!m.forwarded) malformed(probe, "micro-batch never forwarded");
      if (!m.backwarded) malformed(probe, "micro-batch never backwarded");
      if (x_ < stages_ - 1 && !m.sent_activation) malformed(probe, "activations never sent");
      if (x_ > 0 && !m.sent_grad) malformed(probe, "gradient never sent");
    }
    st_.gaps.assign(gaps_.begin(), gaps_.end());
    return st_;
  }

 private:
  int live_versions() const {
    int n = static_cast<int>(version_refs_.size());
    if (!version_refs_.count(current_version_)) ++n;
    return n;
  }

  void forward(const Action& a, MicroBatchState& mb) {
    if (mb.forwarded) malformed(a, "forwarded twice");
    if (x_ > 0 && !mb.received_activation) malformed(a, "forward before its RECV_F");
    mb.forwarded = true;
    mb.weight_version = current_version_;
    mb.forwards_at_forward = st_.forwards;
    mb.backwards_at_forward = st_.backwards;
    ++version_refs_[current_version_];
    ++st_.forwards;
    ++in_flight_;
    st_.max_in_flight = std::max(st_.max_in_flight, in_flight_);
  }

  void backward(const Action& a, MicroBatchState& mb) {
    if (!mb.forwarded) malformed(a, "backward before its forward");
    if (mb.backwarded) malformed(a, "backwarded twice");
    if (x_ < stages_ - 1 && !mb.received_grad) malformed(a, "backward before its RECV_B");
    mb.backwarded = true;
    // Passes of other micro-batches run since this one's forward.
    int fwd_between = static_cast<int>(st_.forwards - mb.forwards_at_forward - 1);
    int bwd_between = static_cast<int>(st_.backwards - mb.backwards_at_forward);
    gaps_.insert({fwd_between, bwd_between});
    if (--version_refs_[mb.weight_version] == 0) version_refs_.erase(mb.weight_version);
    ++st_.backwards;
    --in_flight_;
  }

  // Sends, receives and the evictor's actions: each needs its pass before it, once.
  void transfer(const Action& a, MicroBatchState& mb) {
    switch (a.kind) {
      case ActionKind::RecvActivation:
        if (x_ == 0) malformed(a, "the first stage receives no activations");
        if (mb.received_activation) malformed(a, "received twice");
        mb.received_activation = true;
        break;
      case ActionKind::SendActivation:
        if (x_ == stages_ - 1) malformed(a, "the last stage sends no activations");
        if (!mb.forwarded) malformed(a, "send before its forward");
        if (mb.sent_activation) malformed(a, "sent twice");
        mb.sent_activation = true;
        break;
      case ActionKind::RecvGrad:
        if (x_ == stages_ - 1) malformed(a, "the last stage receives no gradients");
        if (!mb.forwarded) malformed(a, "gradient received before the forward");
        if (mb.received_grad) malformed(a, "received twice");
        mb.received_grad = true;
        break;
      case ActionKind::SendGrad:
        if (x_ == 0) malformed(a, "the first stage sends no gradients");
        if (!mb.backwarded) malformed(a, "send before its backward");
        if (mb.sent_grad) malformed(a, "sent twice");
        mb.sent_grad = true;
        break;
      case ActionKind::SwapOut:
      case ActionKind::SwapIn:
      case ActionKind::Recompute:
        if (!mb.forwarded) malformed(a, "evictor action before the forward");
        break;
      default:
        throw std::logic_error("ActionListChecker::transfer: " + to_string(a));
    }
  }

  const int x_, stages_;
  StageStats st_;
  std::map<int64_t, MicroBatchState> mbs_;
  std::map<int64_t, int> version_refs_;  // stashed version -> in-flight micro-batches using it
  int64_t current_version_ = 0;
  int in_flight_ = 0;
  std::set<std::pair<int, int>> gaps_;
};

}  // namespace

StageStats simulate_stage(const std::vector<Action>& actions, int stages) {
  if (actions.empty()) return {};
  ActionListChecker replay(actions.front().stage, stages);
  for (const Action& a : actions) replay.apply(a);
  return replay.finish();
}

std::vector<StageStats> simulate_stages(const Schedule& schedule) {
  std::vector<StageStats> out;
  for (const std::vector<Action>& list : schedule.actions) out.push_back(simulate_stage(list, schedule.stages));
  return out;
}

std::vector<Action> simulate_global(const Schedule& schedule) {
  const int l = schedule.stages;
  if (static_cast<int>(schedule.actions.size()) != l)
    throw ScheduleError("schedule has " + std::to_string(schedule.actions.size()) + " action lists for " +
                        std::to_string(l) + " stages");
  // Every stage must be well-formed on its own, and all must cover the same micro-batches.
  std::set<int64_t> reference;
  for (int x = 0; x < l; ++x) {
    const std::vector<Action>& list = schedule.actions[static_cast<size_t>(x)];
    for (const Action& a : list)
      if (a.stage != x) malformed(a, "action in the list of stage " + std::to_string(x));
    simulate_stage(list, l);
    std::set<int64_t> forwarded;
    for (const Action& a : list)
      if (a.kind == ActionKind::Forward) forwarded.insert(a.micro_batch);
    if (x == 0)
      reference = forwarded;
    else if (forwarded != reference)
      throw ScheduleError("stage " + std::to_string(x) + " forwards other micro-batches than stage 0");
  }

  // Sends executed so far, keyed by (sending stage, kind, micro-batch); a receive consumes one.
  std::set<std::tuple<int, int, int64_t>> pending_sends;
  std::vector<size_t> head(static_cast<size_t>(l), 0);
  std::vector<Action> order;
  size_t total = 0;
  for (const auto& list : schedule.actions) total += list.size();
  order.reserve(total);

  auto ready = [&](const Action& a) {
    if (a.kind == ActionKind::RecvActivation)
      return pending_sends.count({a.stage - 1, static_cast<int>(ActionKind::SendActivation), a.micro_batch}) > 0;
    if (a.kind == ActionKind::RecvGrad)
      return pending_sends.count({a.stage + 1, static_cast<int>(ActionKind::SendGrad), a.micro_batch}) > 0;
    return true;
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int x = 0; x < l; ++x) {
      const std::vector<Action>& list = schedule.actions[static_cast<size_t>(x)];
      size_t& h = head[static_cast<size_t>(x)];
      while (h < list.size() && ready(list[h])) {
        const Action& a = list[h];
        if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGrad)
          pending_sends.insert({a.stage, static_cast<int>(a.kind), a.micro_batch});
        if (a.kind == ActionKind::RecvActivation)
          pending_sends.erase({a.stage - 1, static_cast<int>(ActionKind::SendActivation), a.micro_batch});
        if (a.kind == ActionKind::RecvGrad)
          pending_sends.erase({a.stage + 1, static_cast<int>(ActionKind::SendGrad), a.micro_batch});
        order.push_back(a);
        ++h;
        progress = true;
      }
    }
  }
  if (order.size() != total) {
    std::string blocked;
    for (int x = 0; x < l; ++x) {
      const std::vector<Action>& list = schedule.actions[static_cast<size_t>(x)];
      size_t h = head[static_cast<size_t>(x)];
      if (h < list.size()) blocked += " " + to_string(list[h]);
    }
    throw ScheduleError("schedule deadlocks: blocked at" + blocked);
  }
  if (!pending_sends.empty()) {
    const auto& s = *pending_sends.begin();
    throw ScheduleError("send " + std::to_string(std::get<0>(s)) + " of micro-batch " + std::to_string(std::get<2>(s)) +
                        " is never received");
  }
  return order;
}

TimedRun simulate_times(const Schedule& schedule, const std::vector<StageTimes>& times, double link_ms) {
  const size_t l = static_cast<size_t>(schedule.stages);
  if (times.size() != l)
    throw ScheduleError(std::to_string(times.size()) + " stage times for " + std::to_string(l) + " stages");
  TimedRun run;
  run.busy_ms.assign(l, 0.0);
  std::vector<double> clock(l, 0.0);
  // When each send's message is there: keyed by (sending stage, kind, micro-batch).
  std::map<std::tuple<int, int, int64_t>, double> arrivals;
  for (const Action& a : simulate_global(schedule)) {  // every send before its receive
    const size_t x = static_cast<size_t>(a.stage);
    const StageTimes& t = times[x];
    double take = 0;
    switch (a.kind) {
      case ActionKind::Forward:
        take = t.forward_ms;
        break;
      case ActionKind::Backward:
        take = t.backward_ms;
        break;
      case ActionKind::OptimizerStep:
        take = t.update_ms;
        break;
      case ActionKind::SendActivation:
      case ActionKind::SendGrad:
        arrivals[{a.stage, static_cast<int>(a.kind), a.micro_batch}] = clock[x] + link_ms;
        break;
      case ActionKind::RecvActivation:
        clock[x] =
            std::max(clock[x], arrivals.at({a.stage - 1, static_cast<int>(ActionKind::SendActivation), a.micro_batch}));
        break;
      case ActionKind::RecvGrad:
        clock[x] =
            std::max(clock[x], arrivals.at({a.stage + 1, static_cast<int>(ActionKind::SendGrad), a.micro_batch}));
        break;
      default:
        break;  // the runtime's own actions take no scheduled time
    }
    clock[x] += take;
    run.busy_ms[x] += take;
  }
  run.step_ms = *std::max_element(clock.begin(), clock.end());
  for (size_t x = 0; x < l; ++x) run.idle_ms.push_back(run.step_ms - run.busy_ms[x]);
  return run;
}

}  // namespace dawnpiper
