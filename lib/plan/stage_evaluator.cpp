#include "plan/stage_evaluator.h"

#include <algorithm>

#include "plan/stage_memory.h"
#include "plan/stage_program.h"

namespace dawnpiper {

StageEvaluator::StageEvaluator(const CostModel& model, MemoptKind mode, int64_t capacity, MemoptGranularity granularity)
    : model_(model), optimizer_(model, mode, capacity, granularity) {}

const StageEval& StageEvaluator::evaluate(int b, int e, int x) {
  const uint64_t key = (static_cast<uint64_t>(b) << 40) | (static_cast<uint64_t>(e) << 16) | static_cast<uint64_t>(x);
  auto found = cache_.find(key);
  const bool out_of_budget = (evaluation_limit_ >= 0 && evaluations_ >= evaluation_limit_) ||
                             (stop_ != nullptr && stop_->load(std::memory_order_relaxed));
  if (found != cache_.end()) {
    StageEval& ev = found->second;
    if (out_of_budget || late_untried_.erase(key) == 0) return ev;
    // It did not fit before the fallback was allowed: only the fallback is new.
    ++evaluations_;
    int64_t peak = 0;
    StageMemopt late = swap_all_late(b, e, x, peak);
    late.feasible = peak <= replay_capacity_;
    if (peak < ev.peak) ev = stage_eval(b, e, late, peak);
    return ev;
  }
  if (out_of_budget) {
    static const StageEval not_evaluated;
    return not_evaluated;
  }
  ++evaluations_;
  int64_t replayed = 0;
  StageMemopt m =
      replay_capacity_ > 0 ? fitted(b, e, x, replayed) : optimizer_.optimize(b, e, x, /*with_decisions=*/false);
  return cache_.emplace(key, stage_eval(b, e, m, replay_capacity_ > 0 ? replayed : m.peak)).first->second;
}

StageEval StageEvaluator::stage_eval(int b, int e, const StageMemopt& m, int64_t peak) const {
  StageEval ev;
  ev.feasible = m.feasible && !model_.split_refused(b, e);
  ev.uses_memopt = m.swapped + m.recomputed > 0;
  ev.compute_ms = model_.compute_ms(b, e);
  ev.memopt_ms = m.overhead_ms;
  ev.allreduce_ms = model_.allreduce_per_micro_batch_ms(b, e);
  ev.update_ms = model_.update_per_micro_batch_ms(b, e);
  ev.peak = peak;
  return ev;
}

StageMemopt StageEvaluator::decisions_at(int b, int e, int x, int64_t capacity) {
  const int64_t base = optimizer_.capacity();
  optimizer_.set_capacity(capacity);
  StageMemopt m = optimizer_.optimize(b, e, x, /*with_decisions=*/true);
  optimizer_.set_capacity(base);
  return m;
}

StageReplayer& StageEvaluator::replayer_for(int b, int e, int x) {
  if (tried_stage_ != std::array<int, 3>{b, e, x}) {
    tried_.clear();
    tried_stage_ = {b, e, x};
    replayer_.emplace(model_, b, e, x);
  }
  return *replayer_;
}

StageMemopt StageEvaluator::optimize_at(int b, int e, int x, int64_t capacity, int64_t& replayed) {
  StageMemopt m = decisions_at(b, e, x, capacity);
  StageReplayer& replayer = replayer_for(b, e, x);
  // The capacities tried for one stage often lead to a decision set tried already.
  std::vector<std::pair<int, TensorAction>> evicted;
  for (const TensorDecision& d : m.decisions)
    if (d.action != TensorAction::Keep) evicted.emplace_back(d.tensor, d.action);
  for (const auto& [set, peak] : tried_)
    if (set == evicted) {
      replayed = peak;
      return m;
    }
  replayed = replayer.replay(m.decisions).peak;
  tried_.emplace_back(std::move(evicted), replayed);
  return m;
}

bool StageEvaluator::can_late_swap() const {
  return replay_capacity_ > 0 && optimizer_.mode() == MemoptKind::SwapRecompute &&
         optimizer_.granularity() == MemoptGranularity::Tensor;
}

bool StageEvaluator::allow_late_swap() {
  if (late_swap_) return true;
  if (!can_late_swap()) return false;
  late_swap_ = true;
  // Only the stages that did not fit can change, as the fallback is tried after everything
  // else: for them, evaluate() tries just the fallback.
  for (const auto& [key, ev] : cache_)
    if (!ev.feasible) late_untried_.insert(key);
  return true;
}

StageMemopt StageEvaluator::swap_all_late(int b, int e, int x, int64_t& replayed) {
  StageMemopt m = decisions_at(b, e, x, 0);
  double copy_ms = 0;
  m.swapped = m.recomputed = 0;
  for (TensorDecision& d : m.decisions) {
    if (d.action == TensorAction::Keep) continue;
    d.action = TensorAction::Swap;
    d.prefetch_at = d.restore_before;
    copy_ms += model_.host_ms(d.bytes);
    ++m.swapped;
  }
  // Each copy back stalls the backward that waits for it; the copies out overlap the stage's
  // work as far as the host link carries them in one forward and backward.
  m.overhead_ms = copy_ms + std::max(0.0, copy_ms - model_.compute_ms(b, e));
  replayed = replayer_for(b, e, x).replay(m.decisions).peak;
  return m;
}

StageMemopt StageEvaluator::fitted(int b, int e, int x, int64_t& replayed) {
  int64_t capacity = optimizer_.capacity();
  StageMemopt m = optimize_at(b, e, x, capacity, replayed);
  if (replay_capacity_ <= 0) return m;
  if (optimizer_.mode() != MemoptKind::None) {
    // The optimizer's formula counts a swapped tensor as gone for every micro-batch in flight;
    // the replay brings it back at its prefetch point. Where the replay overshoots, lower the
    // optimizer's capacity by the overshoot (a few rounds; an optimizer short of its capacity
    // has evicted all it can, its greedy order run to the end, which no lower capacity changes)
    for (int round = 0; round < 4 && m.feasible && replayed > replay_capacity_; ++round) {
      capacity -= replayed - replay_capacity_;
      if (capacity <= 0) break;
      m = optimize_at(b, e, x, capacity, replayed);
    }
    // ... and where no round fits, try everything the optimizer can evict (unless the rounds
    // got there) and nothing at all (re-run buffers can make evicting cost memory).
    const bool evicted_all = !m.feasible;
    for (int64_t other : {int64_t{0}, std::numeric_limits<int64_t>::max()}) {
      if (replayed <= replay_capacity_) break;
      if (other == 0 && evicted_all) continue;
      int64_t peak = 0;
      StageMemopt alternative = optimize_at(b, e, x, other, peak);
      if (peak < replayed) m = std::move(alternative), replayed = peak;
    }
    if (late_swap_ && replayed > replay_capacity_) {
      int64_t peak = 0;
      StageMemopt late = swap_all_late(b, e, x, peak);
      if (peak < replayed) m = std::move(late), replayed = peak;
    }
  }
  m.feasible = replayed <= replay_capacity_;
  return m;
}

double StageEvaluator::objective(const Bounds& bounds) {
  double worst = 0;
  for (size_t x = 0; x + 1 < bounds.size(); ++x)
    worst = std::max(worst, evaluate(bounds[x], bounds[x + 1], static_cast<int>(x)).time_ms());
  return worst;
}

StagePlan StageEvaluator::stage_plan(int b, int e, int x) {
  int64_t replayed = 0;
  StageMemopt m = fitted(b, e, x, replayed);
  if (replay_capacity_ > 0 && m.swapped + m.recomputed > 0 && replayed <= replay_capacity_) {
    // The formula charges every activation and the largest workspace at once; the replay
    // knows what is alive together. Relax the optimizer's capacity as far as the replay allows
    // (bisection: the greedy's overhead grows as its capacity shrinks, though not strictly).
    int64_t peak = 0;
    StageMemopt none = optimize_at(b, e, x, std::numeric_limits<int64_t>::max(), peak);
    if (peak <= replay_capacity_) {
      m = std::move(none), replayed = peak;
    } else {
      int64_t lo = optimizer_.capacity(), hi = m.peak_before;
      for (int round = 0; round < 10 && hi - lo > hi / 512; ++round) {
        const int64_t mid = lo + (hi - lo) / 2;
        StageMemopt r = optimize_at(b, e, x, mid, peak);
        if (!r.feasible || peak > replay_capacity_) {
          hi = mid;
          continue;
        }
        lo = mid;
        if (r.overhead_ms < m.overhead_ms) m = std::move(r), replayed = peak;
      }
    }
  }
  StagePlan s;
  s.index = x;
  s.begin = b;
  s.end = e;
  s.compute_ms = model_.compute_ms(b, e);
  s.forward_ms = model_.fwd_ms(b, e);
  s.weight_ms = model_.weight_ms(b, e);
  s.memopt_ms = m.overhead_ms;
  s.allreduce_ms = model_.allreduce_ms(b, e);
  s.allreduce_per_micro_batch_ms = model_.allreduce_per_micro_batch_ms(b, e);
  s.update_ms = model_.update_ms(b, e);
  s.update_per_micro_batch_ms = model_.update_per_micro_batch_ms(b, e);
  const CostModel::Collectives c = model_.collectives(b, e);
  s.reduce_ms = c.reduce_ms, s.reduce_tail_ms = c.reduce_tail_ms, s.at_update_ms = c.at_update_ms;
  s.gather_ms = c.gather_ms, s.pass_ms = c.pass_ms;
  s.memory = model_.memory(b, e, x, m.activation_per_micro_batch);
  s.memory.replayed_peak = replayed;
  s.peak_without_memopt = m.peak_before;
  s.replayed_peak_without_memopt = replay_stage_memory(model_, b, e, x, {}).peak;
  if (e < model_.size()) {
    s.crossing = model_.crossing(e);
    s.crossing_bytes = model_.crossing_bytes(e);
  }
  s.evictions = place_evictions(model_, b, e, m.decisions);
  s.decisions = std::move(m.decisions);
  return s;
}

}  // namespace dawnpiper
