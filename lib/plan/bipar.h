#pragma once
// DawnPiper's binary pipeline partition (paper Alg. 2).
//
// BiPar(N, L, R) splits stages L..R into a first group of floor(s/2) stages and the rest (s =
// R-L+1; with three stages the first stage alone, "traversing from the first stage's range").
// The candidate cuts run from the compute-balanced cut rho_cb towards the memory-balanced cut
// rho_mb (IdentifyAndSort, with the communication optimization of balance.h); for each, both
// groups are partitioned recursively and the slower side is the candidate's time. Two stages
// left is AdjacentPartition: each side is one stage whose memory optimizer gives its time. The
// sweep stops at the first cut that needs no memory optimization (the paper's early stop: by the
// partition theorem, cuts further towards rho_mb only unbalance compute).
//
// Additions (see docs/planner.md), the bounds exact, the rest heuristics:
//  - lower bound: a cut is skipped when its compute lower bound (split_lower_bound) cannot beat
//    the best so far, and the sweep ends when that bound, growing away from rho_cb, passes it;
//  - cutoff: a sub-search only has to beat what its caller already has (alpha-beta style);
//  - memory floor: a group whose floor (parameters, their versions, gradients, optimizer state,
//    workspace) cannot fit however its stages are cut is skipped (reach / may_fit);
//  - `refine`: after the sweep, up to refine_limit cuts around rho_cb that the sweep did not try,
//    nearest in bound first, while the bound is below the best. This repairs what node
//    granularity breaks in the theorem's argument when a group has several stages. When no cut
//    of the sweep fits at all (memory so tight that the optimizer cannot shrink one group
//    enough, outside the theorem's conditions), the nearest cut where the failing group fits is
//    found by bisection and the search continues around it. `refine = false` is Alg. 2 alone;
//  - a sweep interval longer than `sweep_limit` cuts (large graphs under tight memory) is swept
//    with a stride, then around its best cut at node granularity;
//  - edge stages: the first and the last stage's ranges are fixed at one end, so which of them
//    fit is known exactly, without assuming monotonicity: no plan exists where none fits (this
//    ends the search at infeasible micro-batch sizes at once), groups holding them are pruned,
//    and where a sweep found nothing because one of them did not fit, the cuts where it fits
//    are tried, rather than bisecting for one as if fit were monotone;
//  - a cutoff for the whole search (solve): the caller's best partition so far.
// Sub-results are memoized by (range, stages): different outer cuts share inner searches. The
// bisection for the nearest fitting cut only asks whether a group fits: those searches stop at
// the first partition that does (trying cuts in the same order, so the answer is the same).
#include <cstdint>
#include <limits>
#include <unordered_map>

#include "plan/balance.h"
#include "plan/stage_evaluator.h"

namespace dawnpiper {

struct BiParOptions {
  bool refine = true;    // false: the sweep of Alg. 2 only
  int refine_limit = 8;  // most extra cuts tried per sub-problem (beyond the sweep)
  // Longest sweep at node granularity; longer intervals between rho_cb and rho_mb are swept
  // with a stride, then every cut within a stride of the best is tried.
  int sweep_limit = 48;
  CommOptimization comm;
};

class BiPar {
 public:
  BiPar(StageEvaluator& evaluator, BiParOptions options = {});

  // Stage boundaries of the best partition found; empty when no candidate fits the capacity.
  // With a cutoff (the slowest stage of a partition the caller has), only partitions faster
  // than it are searched for, and none found is empty too. `any`: the first partition found
  // that fits (and beats the cutoff), not the best.
  Bounds solve(double cutoff = std::numeric_limits<double>::infinity(), bool any = false);
  double objective() const { return objective_; }
  int64_t subproblems() const { return static_cast<int64_t>(memo_.size()); }

 private:
  struct Key {
    int b, e, first, last;
    bool operator==(const Key& o) const { return b == o.b && e == o.e && first == o.first && last == o.last; }
  };
  struct KeyHash {
    size_t operator()(const Key& k) const {
      uint64_t h = (static_cast<uint64_t>(k.b) << 32) ^ static_cast<uint64_t>(k.e);
      h ^= (static_cast<uint64_t>(k.first) << 48) ^ (static_cast<uint64_t>(k.last) << 56);
      return std::hash<uint64_t>()(h * 0x9E3779B97F4A7C15ULL);
    }
  };
  // What a result's time says: the best partition's slowest stage (infinite: nothing fits);
  // a lower bound, searched under a cutoff that nothing beat; or the time of some partition
  // that fits, from a search that stopped at the first it found.
  enum class Known : unsigned char { Best, AtLeast, Some };
  struct Result {
    double time;       // slowest stage, infinite when nothing fits
    bool uses_memopt;  // some stage of the split swaps or recomputes
    int cut;           // split position (-1 for one stage)
    Known known;
  };

  // Stages first..last over nodes [b, e). A caller that already has `cutoff` needs nothing at
  // or above it, so the search prunes with it (alpha-beta style) and may answer "at least
  // cutoff"; `any`: the caller only asks whether some partition fits, so the search stops at
  // the first (it tries the cuts in the same order, so the answer is the full search's).
  // Memoized answers are reused when they settle the question.
  Result partition(int b, int e, int first, int last, double cutoff, bool any = false);
  class CutSearch;  // one split's search (bipar.cpp)
  // A necessary condition for fitting: the farthest end of stage x starting at node `from`
  // whose memory floor (what no optimization removes) fits the capacity (Back: the earliest
  // start of stage x ending there), and whether stages first..last can hold [b, e) packed that
  // way. The floor only grows with the range, so greedy packing decides this relaxed question
  // exactly: false means no partition fits. Groups that contain the first or the last stage
  // also need that stage to fit exactly (edge_fits) where the others, packed from the other
  // end, leave it room; the sweeps' checks evaluate at most `edge_budget` new ranges for it,
  // solve's check of the whole graph as many as it takes.
  enum class Direction { Forward, Back };
  int reach(int from, int x, Direction way = Direction::Forward);
  bool may_fit(int b, int e, int first, int last, int edge_budget = 16);
  // Whether the first stage fits the evaluator ending at some node c in [lo, hi] ([0, c)), or
  // the last stage starting at one ([c, n)): every plan's first and last stage must, so where
  // none does, nothing fits, whatever the floors say. Ranges are evaluated on demand, the
  // shortest first, and remembered; at most `budget` new ones (negative: no limit), beyond which
  // the answer is yes (not known otherwise).
  enum class Edge { First, Last };
  bool edge_fits(Edge edge, int lo, int hi, int budget = -1);
  void collect(int b, int e, int first, int last, Bounds& bounds);

  StageEvaluator& evaluator_;
  const CostModel& model_;
  BiParOptions options_;
  std::unordered_map<Key, Result, KeyHash> memo_;
  std::unordered_map<uint64_t, int> reach_;  // by (from, direction, stage)
  // Per node c: -1 unknown, else whether [0, c) fits as the first stage, [c, n) as the last.
  std::vector<signed char> first_fits_, last_fits_;
  double objective_ = 0;
};

}  // namespace dawnpiper
