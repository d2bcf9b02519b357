#pragma once
// StageEvaluator: the search's view of a stage, (nodes [b, e), stage x) -> feasible?, time with
// memory optimization. Results are cached because the partition searches ask for the same
// ranges many times. One evaluator per planning run (it owns the memory optimizer's scratch).
// Memory: the search and the memory optimizer use the cost model's fast formula (the partition
// theorem's model); a stage's final plan also carries the replayed prediction
// (plan/stage_memory.h), which the runtime is measured against.
#include <array>
#include <atomic>
#include <cstdint>
#include <limits>
#include <optional>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "plan/cost_model.h"
#include "plan/memory_optimizer.h"
#include "plan/plan.h"
#include "plan/stage_memory.h"

namespace dawnpiper {

struct StageEval {
  bool feasible = false;
  bool uses_memopt = false;  // something had to be swapped or recomputed
  double compute_ms = 0;
  double memopt_ms = 0;
  double allreduce_ms = 0;  // data parallelism, per micro-batch
  double update_ms = 0;     // the optimizer's, per micro-batch
  int64_t peak = 0;         // after memory optimization (smallest reachable if infeasible)
  // The objective's term: compute + memopt (+ allreduce + update), infinite when the stage
  // cannot fit.
  double time_ms() const {
    return feasible ? compute_ms + memopt_ms + allreduce_ms + update_ms : std::numeric_limits<double>::infinity();
  }
};

// Stage boundaries: bounds[x] .. bounds[x+1] is stage x; bounds.front() == 0,
// bounds.back() == nodes.
using Bounds = std::vector<int>;

class StageEvaluator {
 public:
  StageEvaluator(const CostModel& model, MemoptKind mode, int64_t capacity,
                 MemoptGranularity granularity = MemoptGranularity::Tensor);

  const StageEval& evaluate(int b, int e, int x);
  // Slowest stage time of a whole partition (infinite if a stage does not fit).
  double objective(const Bounds& bounds);
  // Everything the plan reports about one stage, decisions included.
  StagePlan stage_plan(int b, int e, int x);
  // > 0: a stage fits when its replayed peak (plan/stage_memory.h) fits this, not its formula:
  // where the replay overshoots, the optimizer's capacity is lowered by the overshoot (a few
  // rounds), and where no round fits, evicting everything the optimizer can and evicting
  // nothing are tried; where the formula overestimates, stage_plan evicts less (the fewest
  // evictions whose replay still fits). Set before the search.
  void set_replay_capacity(int64_t bytes) { replay_capacity_ = bytes; }
  // DawnPiper's tensor optimizer with a replay capacity: from now on a stage that nothing above
  // fits is also tried with everything swapped late (swap_all_late), and the stages that did
  // not fit are asked again. Its copies stall the stage, so the planner allows it only where
  // the search without it found no plan. Returns whether it applies to this evaluator.
  bool allow_late_swap();
  bool can_late_swap() const;  // whether allow_late_swap would turn the fallback on
  // At most this many evaluations in all (negative: no limit): past it, a stage not evaluated
  // yet is answered as not fitting, which ends a search that must give up.
  void set_evaluation_limit(int64_t n) { evaluation_limit_ = n; }
  // Once *stop is true, every stage not evaluated yet is answered as not fitting, as past the
  // limit: a search whose answer is no longer wanted ends (find_max_batch's speculative sizes).
  void set_stop(const std::atomic<bool>* stop) { stop_ = stop; }

  const CostModel& model() const { return model_; }
  MemoptKind mode() const { return optimizer_.mode(); }
  int64_t capacity() const { return optimizer_.capacity(); }
  int64_t evaluations() const { return evaluations_; }

 private:
  // What the search keeps of a stage's decisions, `peak` the one it is judged by.
  StageEval stage_eval(int b, int e, const StageMemopt& m, int64_t peak) const;
  // The optimizer's decisions at `capacity` (instead of its own), not replayed.
  StageMemopt decisions_at(int b, int e, int x, int64_t capacity);
  // The replayer of stage (b, e, x), set up anew (forgetting the sets tried) for another stage.
  StageReplayer& replayer_for(int b, int e, int x);
  // The optimizer's decisions at `capacity` (instead of its own) and their replayed peak.
  StageMemopt optimize_at(int b, int e, int x, int64_t capacity, int64_t& replayed);
  // The optimizer's decisions, and with a replay capacity those that fit it (see above).
  StageMemopt fitted(int b, int e, int x, int64_t& replayed);
  // Everything the optimizer can evict (its greedy order run to the end) swapped, each tensor
  // brought back just before the backward that reads it first: no re-run buffers and no early
  // prefetch, the least the stage can hold with these candidates, at the cost of copies that
  // nothing hides. Its replayed peak.
  StageMemopt swap_all_late(int b, int e, int x, int64_t& replayed);

  const CostModel& model_;
  MemoryOptimizer optimizer_;
  int64_t replay_capacity_ = 0;
  bool late_swap_ = false;
  std::unordered_set<uint64_t> late_untried_;  // cached as not fitting before allow_late_swap
  std::unordered_map<uint64_t, StageEval> cache_;
  // The decision sets replayed for the stage last asked about (b, e, x), with their peaks, and
  // its replayer.
  std::array<int, 3> tried_stage_{-1, -1, -1};
  std::optional<StageReplayer> replayer_;
  std::vector<std::pair<std::vector<std::pair<int, TensorAction>>, int64_t>> tried_;
  int64_t evaluations_ = 0;
  int64_t evaluation_limit_ = -1;
  const std::atomic<bool>* stop_ = nullptr;
};

}  // namespace dawnpiper
