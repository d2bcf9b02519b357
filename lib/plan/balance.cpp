#include "plan/balance.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <functional>

namespace dawnpiper {

namespace {

// The cut in [lo, hi] minimizing max(first(c), second(c)) for first non-decreasing and second
// non-increasing in c: binary search for the crossing, then compare its two neighbours.
int balance_point(int lo, int hi, const std::function<double(int)>& first, const std::function<double(int)>& second) {
  int a = lo, z = hi;  // find the smallest c with first(c) >= second(c)
  while (a < z) {
    int mid = a + (z - a) / 2;
    if (first(mid) >= second(mid))
      z = mid;
    else
      a = mid + 1;
  }
  int c = a;
  if (c > lo) {
    double at = std::max(first(c), second(c));
    double before = std::max(first(c - 1), second(c - 1));
    if (before <= at) return c - 1;  // ties: the smaller first group
  }
  return c;
}

}  // namespace

int compute_balanced_cut(const CostModel& model, int b, int e, int k, int s) {
  return balance_point(
      b + k, e - (s - k), [&](int c) { return model.compute_ms(b, c) / k; },
      [&](int c) { return model.compute_ms(c, e) / (s - k); });
}

int memory_balanced_cut(const CostModel& model, int b, int e, int x0, int k, int s) {
  return balance_point(
      b + k, e - (s - k), [&](int c) { return model.balanced_group_peak(b, c, x0, x0 + k - 1); },
      [&](int c) { return model.balanced_group_peak(c, e, x0 + k, x0 + s - 1); });
}

double split_lower_bound(const CostModel& model, int b, int cut, int e, int k, int s) {
  return std::max(model.compute_ms(b, cut) / k, model.compute_ms(cut, e) / (s - k));
}

int adjust_cut(const CostModel& model, int cut, int lo, int hi, int min_cut, int max_cut, double avg_stage_ms,
               const CommOptimization& options) {
  if (!options.enabled) return cut;
  // Most cuts carry one small tensor: nothing to improve, no range query needed.
  if (model.crossing_count(cut) <= 1 && 2 * model.link_ms(model.crossing_bytes(cut)) <= avg_stage_ms) return cut;
  // Every cut this one could become: the searched interval and the reach around the cut.
  // Tensors crossing all of them must be sent anyway; only the rest is avoidable traffic.
  const int from = std::max(min_cut, std::min(lo, cut - options.window));
  const int to = std::min(max_cut, std::max(hi, cut + options.window));
  int spanning;
  int64_t spanning_bytes;
  model.spanning(from, to, spanning, spanning_bytes);
  auto count = [&](int c) { return model.crossing_count(c) - spanning; };
  auto bytes = [&](int c) { return model.crossing_bytes(c) - spanning_bytes; };

  if (2 * model.link_ms(bytes(cut)) > avg_stage_ms) return -1;
  if (count(cut) <= 1) return cut;
  const double max_shift = options.max_shift * avg_stage_ms;
  const double at = model.compute_ms(0, cut);
  // The nearest single-tensor cut within reach, looking both ways alternately, that moves less
  // compute between the stages than it saves in traffic.
  for (int d = 1; d <= options.window; ++d) {
    for (int q : {cut - d, cut + d}) {
      if (q < min_cut || q > max_cut) continue;
      if (count(q) > 1 || bytes(q) > bytes(cut)) continue;
      double shift = std::fabs(model.compute_ms(0, q) - at);
      if (shift <= max_shift && shift <= 2 * model.link_ms(bytes(cut) - bytes(q))) return q;
    }
  }
  return cut;
}

}  // namespace dawnpiper
