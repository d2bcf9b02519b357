#include "plan/bipar.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

namespace dawnpiper {

namespace {
constexpr double kInf = std::numeric_limits<double>::infinity();
}  // namespace

BiPar::BiPar(StageEvaluator& evaluator, BiParOptions options)
    : evaluator_(evaluator), model_(evaluator.model()), options_(options) {}

Bounds BiPar::solve() {
  const int n = model_.size(), l = model_.stages();
  if (!may_fit(0, n, 0, l - 1)) {
    objective_ = kInf;
    return {};
  }
  Result r = partition(0, n, 0, l - 1, kInf);
  objective_ = r.time;
  if (r.time == kInf) return {};
  Bounds bounds{0};
  collect(0, n, 0, l - 1, bounds);
  bounds.push_back(n);
  return bounds;
}

int BiPar::reach(int b, int x) {
  const uint64_t key = (static_cast<uint64_t>(b) << 20) | static_cast<uint64_t>(x);
  auto found = reach_.find(key);
  if (found != reach_.end()) return found->second;
  const int64_t capacity = evaluator_.capacity();
  const bool evictable = evaluator_.mode() != MemoptMode::None;
  // What no memory optimization removes: parameters with their versions, gradients and
  // optimizer state, the largest workspace (and without optimization, all activations). It
  // only grows with the range, so the farthest fitting end is found by bisection.
  auto floor_fits = [&](int e) {
    int64_t floor = evictable ? model_.memory(b, e, x, 0).total() : model_.peak_without_memopt(b, e, x);
    return floor <= capacity;
  };
  int good = b, bad = model_.size() + 1;
  while (bad - good > 1) {
    int mid = good + (bad - good) / 2;
    if (floor_fits(mid))
      good = mid;
    else
      bad = mid;
  }
  reach_.emplace(key, good);
  return good;
}

bool BiPar::may_fit(int b, int e, int first, int last) {
  int pos = b;
  for (int x = first; x <= last && pos < e; ++x) {
    int r = reach(pos, x);
    if (r == pos) return false;
    pos = r;
  }
  return pos >= e;
}

void BiPar::collect(int b, int e, int first, int last, Bounds& bounds) {
  if (first == last) return;
  const Result& r = memo_.at({b, e, first, last});
  const int k = (last - first + 1) / 2;
  collect(b, r.cut, first, first + k - 1, bounds);
  bounds.push_back(r.cut);
  collect(r.cut, e, first + k, last, bounds);
}

BiPar::Result BiPar::partition(int b, int e, int first, int last, double cutoff) {
  const Key key{b, e, first, last};
  auto found = memo_.find(key);
  if (found != memo_.end() && (found->second.exact || found->second.time >= cutoff)) return found->second;

  const int s = last - first + 1;
  if (s == 1) {
    const StageEval& ev = evaluator_.evaluate(b, e, first);
    Result r{ev.time_ms(), ev.uses_memopt, -1, true};
    memo_[key] = r;
    return r;
  }

  // s == 2 is AdjacentPartition: both sides below are single stages.
  const int k = s / 2;
  const int min_cut = b + k, max_cut = e - (s - k);
  const int cb = compute_balanced_cut(model_, b, e, k, s);
  const int mb = memory_balanced_cut(model_, b, e, first, k, s);
  const double avg_stage_ms = model_.compute_ms(b, e) / s;
  const int lo = std::min(cb, mb), hi = std::max(cb, mb);

  Result best{kInf, false, -1, true};
  std::unordered_set<int> seen, tried;  // raw positions handled; cuts (adjusted) tried
  int failed_side = 0;                  // of the last cut tried: -1 the first group did not fit, +1 the second
  auto lower = [&](int c) { return split_lower_bound(model_, b, c, e, k, s); };
  // Nothing at or above this can matter: the best here so far, or what the caller has already.
  auto bound = [&]() { return std::min(best.time, cutoff); };
  // Tries the cut at `raw` (after the communication adjustment). Returns -1 when skipped,
  // 1 when the split fits without any memory optimization, 0 otherwise.
  auto try_cut = [&](int raw) {
    if (!seen.insert(raw).second) return -1;
    int c = adjust_cut(model_, raw, lo, hi, min_cut, max_cut, avg_stage_ms, options_.comm);
    if (c < 0 || !tried.insert(c).second) return -1;
    if (lower(c) >= bound()) return -1;
    // A group that cannot fit even when packed greedily is not searched.
    if (!may_fit(b, c, first, first + k - 1)) {
      failed_side = -1;
      return 0;
    }
    if (!may_fit(c, e, first + k, last)) {
      failed_side = 1;
      return 0;
    }
    Result left = partition(b, c, first, first + k - 1, bound());
    failed_side = left.exact && left.time == kInf ? -1 : 0;
    if (left.time >= bound()) return 0;  // cannot win; the second group need not be searched
    Result right = partition(c, e, first + k, last, bound());
    if (right.exact && right.time == kInf) failed_side = 1;
    if (!right.exact) return 0;
    double t = std::max(left.time, right.time);
    bool memopt = left.uses_memopt || right.uses_memopt;
    if (t < best.time) best = {t, memopt, c, true};
    return t < kInf && !memopt ? 1 : 0;
  };
  // Tries up to refine_limit cuts from `start` outwards, nearest in lower bound first, while
  // that bound can beat the best.
  auto walk = [&](int start) {
    int down = start - 1, up = start + 1;
    for (int extra = 0; extra < options_.refine_limit;) {
      double ld = down >= min_cut ? lower(down) : kInf;
      double lu = up <= max_cut ? lower(up) : kInf;
      if (std::min(ld, lu) >= bound()) break;
      int p = ld <= lu ? down-- : up++;
      if (try_cut(p) >= 0) ++extra;
    }
  };

  // IdentifyAndSort: from rho_cb towards rho_mb. A very long interval (huge graphs, tight
  // memory) is swept with a stride first, and the neighbourhood of the best cut afterwards.
  const int step = mb >= cb ? 1 : -1;
  const int span = std::abs(mb - cb);
  const int limit = std::max(1, options_.sweep_limit);
  const int stride = span + 1 > limit ? (span + limit - 1) / limit : 1;
  int last_cut = cb;
  for (int i = 0;; ++i) {
    const int p = cb + step * std::min(i * stride, span);
    if (lower(p) >= bound()) break;  // grows away from rho_cb
    last_cut = p;
    if (try_cut(p) == 1) break;  // no memory optimization needed: the paper's early stop
    if (p == mb) break;
  }
  if (stride > 1 && best.cut >= 0) {
    const int around = best.cut;
    for (int d = 1; d < stride; ++d)
      for (int p : {around - d, around + d})
        if (p >= min_cut && p <= max_cut && lower(p) < bound()) try_cut(p);
  }
  if (!options_.refine) {
    // The paper's Alg. 2 as written: the sweep is all.
  } else if (best.time == kInf && failed_side != 0) {
    // Memory is so tight that no cut between rho_cb and rho_mb fits (the optimizer cannot
    // shrink one group enough). The group that failed fits below (first) or above (second) some
    // cut; find the nearest such cut by bisection, assuming fit is monotone in the cut.
    auto fits = [&](int c) {
      return failed_side < 0
                 ? may_fit(b, c, first, first + k - 1) && partition(b, c, first, first + k - 1, kInf).time < kInf
                 : may_fit(c, e, first + k, last) && partition(c, e, first + k, last, kInf).time < kInf;
    };
    int a = failed_side < 0 ? min_cut : last_cut + 1;
    int z = failed_side < 0 ? last_cut - 1 : max_cut;
    if (a <= z && fits(failed_side < 0 ? a : z)) {
      while (a < z) {
        if (failed_side < 0) {
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
      seen.erase(a);
      tried.erase(a);
      try_cut(a);
      // Both ways: fit is not quite monotone (a stage's first node decides what it can
      // recompute), so a cut just before the bisection's answer may fit too.
      if (best.time < kInf) walk(a);
    }
  } else if (bound() < kInf) {
    walk(cb);
  }
  // Searched under a cutoff that nothing here beat: only "at least the cutoff" is known.
  if (best.time >= cutoff && cutoff < kInf) best = {cutoff, false, -1, false};
  memo_[key] = best;
  return best;
}

}  // namespace dawnpiper
