#include "plan/bipar.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <unordered_set>

namespace dawnpiper {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

BiPar::BiPar(StageEvaluator& evaluator, BiParOptions options)
    : evaluator_(evaluator), model_(evaluator.model()), options_(options) {}

Bounds BiPar::solve(double cutoff, bool any) {
  const int n = model_.size(), l = model_.stages();
  if (!may_fit(0, n, 0, l - 1, /*edge_budget=*/-1)) {
    objective_ = kInf;
    return {};
  }
  Result r = partition(0, n, 0, l - 1, cutoff, any);
  objective_ = r.time;
  if (r.time == kInf || r.known == Known::AtLeast || r.time >= cutoff) return {};
  Bounds bounds{0};
  collect(0, n, 0, l - 1, bounds);
  bounds.push_back(n);
  return bounds;
}

int BiPar::reach(int from, int x, Direction way) {
  const uint64_t key = (static_cast<uint64_t>(from) << 21) | (static_cast<uint64_t>(way == Direction::Back) << 20) |
                       static_cast<uint64_t>(x);
  auto found = reach_.find(key);
  if (found != reach_.end()) return found->second;
  const int64_t capacity = evaluator_.capacity();
  const bool evictable = evaluator_.mode() != MemoptKind::None;
  // What no memory optimization removes (CostModel::memory_floor) only grows with the range,
  // so the farthest fitting end (or start) is found by bisection.
  auto floor_fits = [&](int other) {
    return (way == Direction::Back ? model_.memory_floor(other, from, x, evictable)
                                   : model_.memory_floor(from, other, x, evictable)) <= capacity;
  };
  int good = from, bad = way == Direction::Back ? -1 : model_.size() + 1;
  while (std::abs(bad - good) > 1) {
    const int mid = good + (bad - good) / 2;
    if (floor_fits(mid))
      good = mid;
    else
      bad = mid;
  }
  reach_.emplace(key, good);
  return good;
}

bool BiPar::may_fit(int b, int e, int first, int last, int edge_budget) {
  const int n = model_.size(), l = model_.stages();
  int pos = b;
  if (first < last && e == n && last == l - 1) {
    // The last stage starts where the others can reach, or anywhere before (shorter stages fit
    // their floors too), and must fit itself.
    for (int x = first; x < last && pos < n - 1; ++x) {
      const int r = reach(pos, x);
      if (r == pos) return false;
      pos = r;
    }
    if (!edge_fits(Edge::Last, b + (last - first), std::min(pos, n - 1), edge_budget)) return false;
  }
  if (first < last && b == 0 && first == 0) {
    // Likewise the first stage ends where the others, packed from the end, can start.
    pos = e;
    for (int x = last; x > first && pos > 1; --x) {
      const int r = reach(pos, x, Direction::Back);
      if (r == pos) return false;
      pos = r;
    }
    if (!edge_fits(Edge::First, std::max(pos, 1), e - (last - first), edge_budget)) return false;
  }
  if (first < last && (b == 0 || e == n)) return true;
  for (int x = first; x <= last && pos < e; ++x) {
    const int r = reach(pos, x);
    if (r == pos) return false;
    pos = r;
  }
  return pos >= e;
}

bool BiPar::edge_fits(Edge edge, int lo, int hi, int budget) {
  const int n = model_.size(), l = model_.stages();
  std::vector<signed char>& known = edge == Edge::First ? first_fits_ : last_fits_;
  if (known.empty()) known.assign(static_cast<size_t>(n) + 1, -1);
  // Shortest ranges first; past the first whose floor does not fit, none does.
  const bool last = edge == Edge::Last;
  for (int i = 0; i <= hi - lo; ++i) {
    const int c = last ? hi - i : lo + i;
    signed char& fits = known[static_cast<size_t>(c)];
    if (fits < 0) {
      if (last ? reach(c, l - 1) < n : reach(0, 0) < c) return false;
      if (budget == 0) return true;  // not known: it may
      --budget;
      fits = (last ? evaluator_.evaluate(c, n, l - 1) : evaluator_.evaluate(0, c, 0)).feasible ? 1 : 0;
    }
    if (fits == 1) return true;
  }
  return false;
}

void BiPar::collect(int b, int e, int first, int last, Bounds& bounds) {
  if (first == last) return;
  const Result& r = memo_.at({b, e, first, last});
  const int k = (last - first + 1) / 2;
  collect(b, r.cut, first, first + k - 1, bounds);
  bounds.push_back(r.cut);
  collect(r.cut, e, first + k, last, bounds);
}

// The search for one split of stages first..last over [b, e) into a first group of k = s/2
// stages and the rest (s == 2 is AdjacentPartition: both sides are single stages).
class BiPar::CutSearch {
 public:
  CutSearch(BiPar& bipar, int b, int e, int first, int last, double cutoff, bool any)
      : bp_(bipar), model_(bipar.model_), b_(b), e_(e), first_(first), last_(last), cutoff_(cutoff), any_(any) {
    s_ = last - first + 1;
    k_ = s_ / 2;
    min_cut_ = b + k_, max_cut_ = e - (s_ - k_);
    cb_ = compute_balanced_cut(model_, b, e, k_, s_);
    mb_ = memory_balanced_cut(model_, b, e, first, k_, s_);
    avg_stage_ms_ = model_.compute_ms(b, e) / s_;
    lo_ = std::min(cb_, mb_), hi_ = std::max(cb_, mb_);
  }

  Result run() {
    // IdentifyAndSort: from rho_cb towards rho_mb. A very long interval (huge graphs, tight
    // memory) is swept with a stride first, and the neighbourhood of the best cut afterwards.
    const int limit = std::max(1, bp_.options_.sweep_limit);
    const int span = std::abs(mb_ - cb_);
    const int stride = span + 1 > limit ? (span + limit - 1) / limit : 1;
    const int last_cut = sweep(span, stride);
    if (found_any()) return best_;
    if (stride > 1 && best_.cut >= 0) {
      const int around = best_.cut;
      for (int d = 1; d < stride && !found_any(); ++d)
        for (int p : {around - d, around + d})
          if (p >= min_cut_ && p <= max_cut_ && lower(p) < bound() && !found_any()) try_cut(p);
      if (found_any()) return best_;
    }
    if (!bp_.options_.refine) {
      // The paper's Alg. 2 as written: the sweep is all.
    } else if (best_.time == kInf && failed_side_ != 0) {
      nearest_fitting_cut(last_cut);
    } else if (bound() < kInf) {
      walk(cb_);
    }
    // Searched under a cutoff that nothing here beat: only "at least the cutoff" is known.
    if (best_.time >= cutoff_ && cutoff_ < kInf) best_ = {cutoff_, false, -1, Known::AtLeast};
    found_any();
    return best_;
  }

 private:
  // In a search for any fitting partition, whether one is found (then it is the answer).
  bool found_any() {
    if (!any_ || best_.time >= cutoff_ || best_.time == kInf) return false;
    best_.known = Known::Some;
    return true;
  }
  double lower(int c) const { return split_lower_bound(model_, b_, c, e_, k_, s_); }
  // Nothing at or above this can matter: the best here so far, or what the caller has already.
  double bound() const { return std::min(best_.time, cutoff_); }

  // Sweeps from rho_cb towards rho_mb; returns the last cut the sweep reached.
  int sweep(int span, int stride) {
    const int step = mb_ >= cb_ ? 1 : -1;
    int last_cut = cb_;
    for (int i = 0;; ++i) {
      const int p = cb_ + step * std::min(i * stride, span);
      if (lower(p) >= bound()) break;  // grows away from rho_cb
      last_cut = p;
      if (try_cut(p) == 1) break;  // no memory optimization needed: the paper's early stop
      if (p == mb_ || (any_ && best_.time < cutoff_)) break;
    }
    return last_cut;
  }

  // Tries the cut at `raw` (after the communication adjustment, unless `adjust` is false).
  // Returns -1 when skipped, 1 when the split fits without any memory optimization, 0
  // otherwise.
  int try_cut(int raw, bool adjust = true) {
    if (!seen_.insert(raw).second) return -1;
    const int c =
        adjust ? adjust_cut(model_, raw, lo_, hi_, min_cut_, max_cut_, avg_stage_ms_, bp_.options_.comm) : raw;
    if (c < 0 || !tried_.insert(c).second) return -1;
    if (lower(c) >= bound()) return -1;
    // A group that cannot fit even when packed greedily is not searched.
    if (!bp_.may_fit(b_, c, first_, first_ + k_ - 1)) {
      failed_side_ = -1;
      return 0;
    }
    if (!bp_.may_fit(c, e_, first_ + k_, last_)) {
      failed_side_ = 1;
      return 0;
    }
    Result left = bp_.partition(b_, c, first_, first_ + k_ - 1, bound(), any_);
    failed_side_ = left.known == Known::Best && left.time == kInf ? -1 : 0;
    if (left.time >= bound()) return 0;  // cannot win; the second group need not be searched
    Result right = bp_.partition(c, e_, first_ + k_, last_, bound(), any_);
    if (right.known == Known::Best && right.time == kInf) failed_side_ = 1;
    if (right.known == Known::AtLeast) return 0;
    double t = std::max(left.time, right.time);
    bool memopt = left.uses_memopt || right.uses_memopt;
    if (t < best_.time) best_ = {t, memopt, c, Known::Best};
    return t < kInf && !memopt ? 1 : 0;
  }

  // Tries up to refine_limit cuts from `start` outwards, nearest in lower bound first, while
  // that bound can beat the best.
  void walk(int start) {
    int down = start - 1, up = start + 1;
    for (int extra = 0; extra < bp_.options_.refine_limit && !found_any();) {
      double ld = down >= min_cut_ ? lower(down) : kInf;
      double lu = up <= max_cut_ ? lower(up) : kInf;
      if (std::min(ld, lu) >= bound()) break;
      int p = ld <= lu ? down-- : up++;
      if (try_cut(p) >= 0) ++extra;
    }
  }

  // Whether the group that failed in the sweep fits with the cut at c (any partition of it will
  // do: only the answer is used).
  bool fits(int c) {
    return failed_side_ < 0 ? bp_.may_fit(b_, c, first_, first_ + k_ - 1) &&
                                  bp_.partition(b_, c, first_, first_ + k_ - 1, kInf, /*any=*/true).time < kInf
                            : bp_.may_fit(c, e_, first_ + k_, last_) &&
                                  bp_.partition(c, e_, first_ + k_, last_, kInf, /*any=*/true).time < kInf;
  }

  // Memory is so tight that no cut between rho_cb and rho_mb fits (the optimizer cannot
  // shrink one group enough). The group that failed fits below (first) or above (second) some
  // cut; find the nearest such cut by bisection, assuming fit is monotone in the cut.
  void nearest_fitting_cut(int last_cut) {
    const bool first_failed = failed_side_ < 0;
    if (!first_failed && e_ == model_.size() && first_ + k_ == last_ && last_ == model_.stages() - 1) {
      edge_cut(Edge::Last, last_cut);
      return;
    }
    if (first_failed && b_ == 0 && first_ == 0 && k_ == 1) {
      edge_cut(Edge::First, last_cut);
      return;
    }
    int a = first_failed ? min_cut_ : last_cut + 1;
    int z = first_failed ? last_cut - 1 : max_cut_;
    if (a > z || !fits(first_failed ? a : z)) return;
    while (a < z) {
      if (first_failed) {
        int mid = a + (z - a + 1) / 2;
        if (fits(mid))
          a = mid;
        else
          z = mid - 1;
      } else {
        int mid = a + (z - a) / 2;
        if (fits(mid))
          z = mid;
        else
          a = mid + 1;
      }
    }
    seen_.erase(a);
    tried_.erase(a);
    try_cut(a);
    if (found_any()) return;
    // Both ways: fit is not quite monotone (a stage's first node decides what it can
    // recompute), so a cut just before the bisection's answer may fit too.
    if (best_.time < kInf) walk(a);
  }

  // The group that failed is the first or the last stage alone, and which of its ranges fit
  // is known exactly (BiPar::edge_fits), with no need to assume monotonicity: try the cuts
  // where it fits, nearest to where the sweep ended first, each way until the other group
  // fails (moving on only makes that group longer).
  void edge_cut(Edge edge, int last_cut) {
    const int other_side = edge == Edge::First ? 1 : -1;
    bool open[2] = {true, true};  // below, above
    for (int d = 0, tried = 0; tried < bp_.options_.refine_limit && (open[0] || open[1]); ++d) {
      for (int way : {1, 0}) {
        const int c = way == 1 ? last_cut + 1 + d : last_cut - d;
        if (!open[way] || c < min_cut_ || c > max_cut_) {
          open[way] = false;
          continue;
        }
        if (!bp_.edge_fits(edge, c, c)) continue;
        seen_.erase(c);
        tried_.erase(c);
        failed_side_ = 0;
        try_cut(c, /*adjust=*/false);
        if (found_any()) return;
        if (failed_side_ == other_side) open[way] = false;
        ++tried;
      }
    }
  }

  BiPar& bp_;
  const CostModel& model_;
  const int b_, e_, first_, last_;
  const double cutoff_;
  const bool any_;
  int s_, k_, min_cut_, max_cut_, cb_, mb_, lo_, hi_;
  double avg_stage_ms_;
  Result best_{kInf, false, -1, Known::Best};
  std::unordered_set<int> seen_, tried_;  // raw positions handled; cuts (adjusted) tried
  int failed_side_ = 0;                   // of the last cut tried: -1 the first group did not fit, +1 the second
};

BiPar::Result BiPar::partition(int b, int e, int first, int last, double cutoff, bool any) {
  const Key key{b, e, first, last};
  auto found = memo_.find(key);
  if (found != memo_.end()) {
    const Result& known = found->second;
    if (known.known == Known::Best || (known.known == Known::AtLeast && known.time >= cutoff) ||
        (known.known == Known::Some && any && known.time < cutoff))
      return known;
  }
  Result r;
  if (first == last) {
    const StageEval& ev = evaluator_.evaluate(b, e, first);
    r = {ev.time_ms(), ev.uses_memopt, -1, Known::Best};
  } else {
    r = CutSearch(*this, b, e, first, last, cutoff, any).run();
  }
  // A partition found earlier may be part of one the caller already holds (collect follows its
  // cut): an answer that knows less does not replace it.
  auto slot = memo_.find(key);  // again: the search may have rehashed the memo
  if (slot == memo_.end())
    memo_.emplace(key, r);
  else if (slot->second.known != Known::Best && !(r.known == Known::AtLeast && slot->second.known == Known::Some))
    slot->second = r;
  return r;
}

}  // namespace dawnpiper
