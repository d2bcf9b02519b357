#include "schedule/simulate.h"

#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>

#include "schedule/interpreter.h"

namespace dawnpiper {

double StageStats::min_gap_ms(double fwd_ms, double bwd_ms) const {
  if (gaps.empty()) return 0;
  double best = std::numeric_limits<double>::infinity();
  for (const auto& g : gaps) best = std::min(best, g.first * fwd_ms + g.second * bwd_ms);
  return best;
}

namespace {

[[noreturn]] void malformed(const Action& a, const std::string& why) {
  throw ScheduleError("stage " + std::to_string(a.stage) + ", action " + to_string(a) + ": " + why);
}

// Per micro-batch progress on one stage.
struct MicroBatchState {
  bool received_activation = false;
  bool forwarded = false;
  bool received_grad = false;
  bool backwarded = false;  // B, or I: the input gradient is there
  bool split = false;       // by I: a W follows
  bool weighted = false;    // W done
  bool sent_activation = false;
  bool sent_grad = false;
  int64_t weight_version = 0;  // version its forward used
  int64_t forwards_at_forward = 0, backwards_at_forward = 0;
};

// One stage's action list replayed in order: checks each action against what came before it
// and counts passes, in-flight micro-batches, weight versions and backward gaps.
class ActionListChecker final : public ActionHooks {
 public:
  ActionListChecker(int stage, int stages) : x_(stage), stages_(stages) { st_.stage = stage; }

  void apply(const Action& a) {
    if (a.stage != x_) malformed(a, "list mixes stages");
    if (a.micro_batch < 0 && !per_step(a.kind)) malformed(a, "negative micro-batch");
    run_action(a, *this);
    st_.max_weight_versions = std::max(st_.max_weight_versions, live_versions());
  }

  // Every micro-batch that appeared ran both passes and sent what its neighbours wait for.
  StageStats finish() {
    for (const auto& [index, m] : mbs_) {
      Action probe{ActionKind::Forward, x_, index};
      if (!m.forwarded) malformed(probe, "micro-batch never forwarded");
      if (!m.backwarded) malformed(probe, "micro-batch never backwarded");
      if (m.split && !m.weighted) malformed(Action{ActionKind::BackwardInput, x_, index}, "no W follows this I");
      if (x_ < stages_ - 1 && !m.sent_activation) malformed(probe, "activations never sent");
      if (x_ > 0 && !m.sent_grad) malformed(probe, "gradient never sent");
    }
    st_.gaps.assign(gaps_.begin(), gaps_.end());
    return st_;
  }

  void forward(const Action& a) override {
    MicroBatchState& mb = mbs_[a.micro_batch];
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

  void backward(const Action& a) override {
    input_gradient(a);
    done(mbs_[a.micro_batch]);
  }
  void backward_input(const Action& a) override {
    input_gradient(a);
    mbs_[a.micro_batch].split = true;
  }
  void backward_weight(const Action& a) override {
    MicroBatchState& mb = mbs_[a.micro_batch];
    if (!mb.split) malformed(a, "W before its I");
    if (mb.weighted) malformed(a, "W twice");
    mb.weighted = true;
    done(mb);
  }

  void recv_activation(const Action& a) override {
    MicroBatchState& mb = mbs_[a.micro_batch];
    if (x_ == 0) malformed(a, "the first stage receives no activations");
    if (mb.received_activation) malformed(a, "received twice");
    mb.received_activation = true;
  }

  void send_activation(const Action& a) override {
    MicroBatchState& mb = mbs_[a.micro_batch];
    if (x_ == stages_ - 1) malformed(a, "the last stage sends no activations");
    if (!mb.forwarded) malformed(a, "send before its forward");
    if (mb.sent_activation) malformed(a, "sent twice");
    mb.sent_activation = true;
  }

  void recv_grad(const Action& a) override {
    MicroBatchState& mb = mbs_[a.micro_batch];
    if (x_ == stages_ - 1) malformed(a, "the last stage receives no gradients");
    if (!mb.forwarded) malformed(a, "gradient received before the forward");
    if (mb.received_grad) malformed(a, "received twice");
    mb.received_grad = true;
  }

  void send_grad(const Action& a) override {
    MicroBatchState& mb = mbs_[a.micro_batch];
    if (x_ == 0) malformed(a, "the first stage sends no gradients");
    if (!mb.backwarded) malformed(a, "send before its backward (B or I)");
    if (mb.sent_grad) malformed(a, "sent twice");
    mb.sent_grad = true;
  }

  void optimizer_step(const Action&) override { ++current_version_, ++st_.optimizer_steps; }
  void reduce_tied_grads(const Action&) override {}
  // The evictor's actions need their micro-batch's forward first.
  void runtime_action(const Action& a) override {
    if (a.kind == ActionKind::AllReduce) return;
    if (!mbs_[a.micro_batch].forwarded) malformed(a, "evictor action before the forward");
  }

 private:
  // B or I: the input gradients, from the forward and (but on the last stage) the RECV_B.
  void input_gradient(const Action& a) {
    MicroBatchState& mb = mbs_[a.micro_batch];
    if (!mb.forwarded) malformed(a, "backward before its forward");
    if (mb.backwarded) malformed(a, "backwarded twice");
    if (x_ < stages_ - 1 && !mb.received_grad) malformed(a, "backward before its RECV_B");
    mb.backwarded = true;
    // Passes of other micro-batches run since this one's forward.
    int fwd_between = static_cast<int>(st_.forwards - mb.forwards_at_forward - 1);
    int bwd_between = static_cast<int>(st_.backwards - mb.backwards_at_forward);
    gaps_.insert({fwd_between, bwd_between});
    ++st_.backwards;
  }
  // B or W: the micro-batch's saved tensors and its weight version are let go.
  void done(const MicroBatchState& mb) {
    if (--version_refs_[mb.weight_version] == 0) version_refs_.erase(mb.weight_version);
    --in_flight_;
  }

  int live_versions() const {
    int n = static_cast<int>(version_refs_.size());
    if (!version_refs_.count(current_version_)) ++n;
    return n;
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
  for (int x = 0; x < schedule.stages; ++x) out.push_back(simulate_stage(schedule.stage_actions(x), schedule.stages));
  return out;
}

namespace {

// Every rank's list holds its own stages' actions, every stage's are well-formed on their own,
// and all stages cover the same micro-batches.
void check_lists(const Schedule& schedule) {
  const int l = schedule.stages, ranks = schedule.ranks();
  if (ranks < 1 || l % ranks != 0)
    throw ScheduleError("schedule has " + std::to_string(ranks) + " action lists for " + std::to_string(l) + " stages");
  for (int r = 0; r < ranks; ++r)
    for (const Action& a : schedule.actions[static_cast<size_t>(r)])
      if (a.stage < 0 || a.stage >= l || schedule.rank_of(a.stage) != r)
        malformed(a, "action in the list of rank " + std::to_string(r));
  std::set<int64_t> reference;
  for (int x = 0; x < l; ++x) {
    const std::vector<Action> list = schedule.stage_actions(x);
    simulate_stage(list, l);
    std::set<int64_t> forwarded;
    for (const Action& a : list)
      if (a.kind == ActionKind::Forward) forwarded.insert(a.micro_batch);
    if (x == 0)
      reference = forwarded;
    else if (forwarded != reference)
      throw ScheduleError("stage " + std::to_string(x) + " forwards other micro-batches than stage 0");
  }
}

}  // namespace

std::vector<Action> simulate_global(const Schedule& schedule) {
  check_lists(schedule);
  const int ranks = schedule.ranks();
  // Sends executed so far, keyed by (sending stage, kind, micro-batch); a receive consumes one.
  std::set<std::tuple<int, int, int64_t>> pending_sends;
  std::vector<size_t> head(static_cast<size_t>(ranks), 0);
  std::vector<Action> order;
  size_t total = 0;
  for (const auto& list : schedule.actions) total += list.size();
  order.reserve(total);

  // Per rank, how many of its sends are not yet received: the transport completes a send before
  // it starts the next (it holds one send buffer), so a rank's second unreceived send waits.
  std::vector<int> unreceived(static_cast<size_t>(ranks), 0);
  auto rank = [&](int stage) { return static_cast<size_t>(schedule.rank_of(stage)); };
  auto ready = [&](const Action& a) {
    if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGrad)
      return unreceived[rank(a.stage)] < schedule.sends_in_flight;
    if (a.kind == ActionKind::RecvActivation)
      return pending_sends.count({a.stage - 1, static_cast<int>(ActionKind::SendActivation), a.micro_batch}) > 0;
    if (a.kind == ActionKind::RecvGrad)
      return pending_sends.count({a.stage + 1, static_cast<int>(ActionKind::SendGrad), a.micro_batch}) > 0;
    return true;
  };
  auto receive = [&](int from, ActionKind sent_as, int64_t micro_batch) {
    pending_sends.erase({from, static_cast<int>(sent_as), micro_batch});
    --unreceived[rank(from)];
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < ranks; ++r) {
      const std::vector<Action>& list = schedule.actions[static_cast<size_t>(r)];
      size_t& h = head[static_cast<size_t>(r)];
      while (h < list.size() && ready(list[h])) {
        const Action& a = list[h];
        if (a.kind == ActionKind::SendActivation || a.kind == ActionKind::SendGrad) {
          pending_sends.insert({a.stage, static_cast<int>(a.kind), a.micro_batch});
          ++unreceived[rank(a.stage)];
        }
        if (a.kind == ActionKind::RecvActivation) receive(a.stage - 1, ActionKind::SendActivation, a.micro_batch);
        if (a.kind == ActionKind::RecvGrad) receive(a.stage + 1, ActionKind::SendGrad, a.micro_batch);
        order.push_back(a);
        ++h;
        progress = true;
      }
    }
  }
  if (order.size() != total) {
    std::string blocked;
    for (int r = 0; r < ranks; ++r) {
      const std::vector<Action>& list = schedule.actions[static_cast<size_t>(r)];
      size_t h = head[static_cast<size_t>(r)];
      if (h < list.size()) blocked += " " + to_string(list[h]);
    }
    throw ScheduleError(std::string("schedule deadlocks: each ") + (ranks == schedule.stages ? "stage" : "rank") +
                        " waits at its next action:" + blocked);
  }
  if (!pending_sends.empty()) {
    const auto& s = *pending_sends.begin();
    const ActionKind kind = static_cast<ActionKind>(std::get<1>(s));
    throw ScheduleError("stage " + std::to_string(std::get<0>(s)) + ", action " +
                        to_string(Action{kind, std::get<0>(s), std::get<2>(s)}) + ": never received");
  }
  return order;
}

namespace {

// All ranks' clocks, advanced action by action in an order where every send precedes its
// receive; a compute action takes its stage's time on its stage's rank.
class TimedWalk final : public ActionHooks {
 public:
  TimedWalk(const std::vector<StageTimes>& times, int ranks, int sends_in_flight)
      : times_(times),
        ranks_(ranks),
        depth_(sends_in_flight),
        clock_(ranks, 0.0),
        busy_(ranks, 0.0),
        last_weight_pass_(times.size(), {0.0, 0.0}),
        received_(ranks) {}

  void forward(const Action& a) override { compute(a, beside(a, times_[at(a)].forward_ms, times_[at(a)].gather_ms)); }
  void backward(const Action& a) override { weight_pass(a, times_[at(a)].backward_ms); }
  void backward_input(const Action& a) override {
    compute(a, beside(a, times_[at(a)].backward_ms - times_[at(a)].weight_ms, times_[at(a)].gather_ms));
  }
  void backward_weight(const Action& a) override { weight_pass(a, times_[at(a)].weight_ms); }
  void optimizer_step(const Action& a) override {
    // The reductions streamed from the step's last weight pass (the last one seen: the update
    // follows it) finish before the update's own collectives and the optimizer run. What the
    // rank paid of them in that pass (drag) is charged here: the walk is past the pass.
    const StageTimes& t = times_[at(a)];
    const auto& [start, end] = last_weight_pass_[at(a)];
    double& clock = clock_[rank(a.stage)];
    if (t.reduce_ms > 0) {
      const double paid = t.drag * t.reduce_ms;
      busy_[rank(a.stage)] += paid;
      clock = std::max({clock + paid, start + t.reduce_ms, end + paid + t.reduce_tail_ms});
    }
    compute(a, t.at_update_ms + t.update_ms);
  }
  void send_activation(const Action& a) override { send(a, times_[at(a)].send_ms); }
  void send_grad(const Action& a) override { send(a, times_[at(a) - 1].send_ms); }  // over the cut before
  void recv_activation(const Action& a) override { receive(a, a.stage - 1, ActionKind::SendActivation); }
  void recv_grad(const Action& a) override { receive(a, a.stage + 1, ActionKind::SendGrad); }
  // The runtime's own actions take no scheduled time.
  void reduce_tied_grads(const Action&) override {}
  void runtime_action(const Action&) override {}

  TimedRun result() const {
    TimedRun run;
    run.step_ms = *std::max_element(clock_.begin(), clock_.end());
    run.busy_ms = busy_;
    for (double busy : busy_) run.idle_ms.push_back(run.step_ms - busy);
    return run;
  }

 private:
  static size_t at(const Action& a) { return static_cast<size_t>(a.stage); }
  size_t rank(int stage) const { return static_cast<size_t>(stage % ranks_); }
  void compute(const Action& a, double ms) { clock_[rank(a.stage)] += ms, busy_[rank(a.stage)] += ms; }
  // A pass of `compute_ms` with `collectives_ms` on the replicas' link beside it: the longer of
  // the two, the compute lengthened by what the rank pays of the collectives.
  double beside(const Action& a, double compute_ms, double collectives_ms) const {
    return std::max(compute_ms + times_[at(a)].drag * collectives_ms, collectives_ms);
  }
  void weight_pass(const Action& a, double compute_ms) {
    const double start = clock_[rank(a.stage)];
    compute(a, beside(a, compute_ms, times_[at(a)].pass_ms));
    last_weight_pass_[at(a)] = {start, clock_[rank(a.stage)]};
  }
  void send(const Action& a, double link_ms) {
    double& clock = clock_[rank(a.stage)];
    std::vector<double>& received = received_[rank(a.stage)];
    // The rank's send depth_ sends back completes first (simulate_global ordered its receive before).
    if (received.size() >= static_cast<size_t>(depth_)) clock = std::max(clock, received[received.size() - depth_]);
    sends_[{a.stage, static_cast<int>(a.kind), a.micro_batch}] = {clock + link_ms, received.size()};
    received.push_back(0);
  }
  void receive(const Action& a, int from, ActionKind sent_as) {
    double& clock = clock_[rank(a.stage)];
    const auto& [arrival, index] = sends_.at({from, static_cast<int>(sent_as), a.micro_batch});
    clock = std::max(clock, arrival);
    received_[rank(from)][index] = clock;
  }

  const std::vector<StageTimes>& times_;
  const int ranks_, depth_;
  std::vector<double> clock_, busy_;                         // per rank
  std::vector<std::pair<double, double>> last_weight_pass_;  // per stage: the latest B or W, start and end
  std::vector<std::vector<double>> received_;                // per rank, per send in order: when it was received
  // Each send's arrival and its index among its rank's sends, keyed by (sending stage, kind,
  // micro-batch).
  std::map<std::tuple<int, int, int64_t>, std::pair<double, size_t>> sends_;
};

}  // namespace

TimedRun simulate_times(const Schedule& schedule, const std::vector<StageTimes>& times) {
  const size_t l = static_cast<size_t>(schedule.stages);
  if (times.size() != l)
    throw ScheduleError(std::to_string(times.size()) + " stage times for " + std::to_string(l) + " stages");
  TimedWalk walk(times, schedule.ranks(), schedule.sends_in_flight);
  for (const Action& a : simulate_global(schedule)) run_action(a, walk);  // every send before its receive
  return walk.result();
}

}  // namespace dawnpiper
