#include "plan/baselines.h"

#include <algorithm>
#include <functional>
#include <limits>
#include <utility>

#include "util/error.h"

namespace dawnpiper {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<int> units_for(const CostModel& model, const char* planner) {
  std::vector<int> units = block_boundaries(model);
  int blocks = static_cast<int>(units.size()) - 1;
  if (blocks < model.stages())
    throw ConfigError(std::string("planner '") + planner + "' partitions at block granularity: the profile has " +
                      std::to_string(blocks) + " blocks, fewer than " + std::to_string(model.stages()) + " stages");
  return units;
}

Bounds to_node_bounds(const std::vector<int>& units, const std::vector<int>& unit_bounds) {
  Bounds bounds;
  for (int u : unit_bounds) bounds.push_back(units[static_cast<size_t>(u)]);
  return bounds;
}

// A stage DP's answer: from[x][e] is where stage x starts when it ends at e; the last ends at n (or the last unit).
Bounds bounds_from(const std::vector<std::vector<int>>& from, int n) {
  const int l = static_cast<int>(from.size());
  Bounds bounds(static_cast<size_t>(l) + 1);
  bounds[static_cast<size_t>(l)] = n;
  for (int x = l - 1, e = n; x > 0; --x) {
    e = from[static_cast<size_t>(x)][static_cast<size_t>(e)];
    bounds[static_cast<size_t>(x)] = e;
  }
  bounds[0] = 0;
  return bounds;
}

// Unit-level min-max partition (PipeDream's DP without replication). A stage's cost is its
// compute time, and with `with_comm` also the activation + gradient transfer at its input.
std::vector<int> min_max_units(const CostModel& model, const std::vector<int>& units, bool with_comm) {
  const int blocks = static_cast<int>(units.size()) - 1, l = model.stages();
  auto time = [&](int i, int j) { return model.compute_ms(units[i], units[j]); };
  auto comm = [&](int i) { return with_comm ? 2 * model.link_ms(model.crossing_bytes(units[i])) : 0.0; };
  // best[x][j]: x+1 stages over units [0, j); from[x][j]: where the last of them starts.
  std::vector<std::vector<double>> best(static_cast<size_t>(l),
                                        std::vector<double>(static_cast<size_t>(blocks) + 1, kInf));
  std::vector<std::vector<int>> from(static_cast<size_t>(l), std::vector<int>(static_cast<size_t>(blocks) + 1, -1));
  for (int j = 1; j <= blocks; ++j) best[0][j] = time(0, j);
  for (int x = 1; x < l; ++x) {
    for (int j = x + 1; j <= blocks; ++j) {
      double& b = best[x][j];
      for (int i = j - 1; i >= x; --i) {
        double t = time(i, j);
        if (t >= b) break;  // grows as i moves left
        double v = std::max({best[x - 1][i], comm(i), t});
        if (v < b) {
          b = v;
          from[x][j] = i;
        }
      }
    }
  }
  return bounds_from(from, blocks);
}

}  // namespace

std::vector<int> block_boundaries(const CostModel& model) {
  const Profile& p = model.profile();
  std::vector<int> out;
  for (int i = 0; i < p.size(); ++i)
    if (i == 0 || p.nodes[static_cast<size_t>(i)].block != p.nodes[static_cast<size_t>(i) - 1].block) out.push_back(i);
  out.push_back(p.size());
  return out;
}

Bounds even_partition(const CostModel& model) {
  std::vector<int> units = units_for(model, "even");
  const int blocks = static_cast<int>(units.size()) - 1, l = model.stages();
  std::vector<int> unit_bounds{0};
  for (int x = 0; x < l; ++x) unit_bounds.push_back(unit_bounds.back() + blocks / l + (x < blocks % l ? 1 : 0));
  return to_node_bounds(units, unit_bounds);
}

std::vector<int> barany_block_partition(const std::vector<double>& costs, int partitions) {
  const int n = static_cast<int>(costs.size());
  if (partitions < 1 || n < partitions)
    throw ConfigError("cannot split " + std::to_string(n) + " blocks into " + std::to_string(partitions) +
                      " partitions");
  // Normalize into [0, 1] as torchgpipe does; the stopping rule compares with 1.
  double lo = *std::min_element(costs.begin(), costs.end());
  double range = *std::max_element(costs.begin(), costs.end()) - lo;
  std::vector<double> normal(costs.size(), 0.0);
  if (range > 0)
    for (size_t i = 0; i < costs.size(); ++i) normal[i] = (costs[i] - lo) / range;
  std::vector<int> splits;
  for (int x = 0; x + 1 < partitions; ++x) splits.push_back(n / partitions * (x + 1));
  splits.push_back(n);
  auto block_size = [&](int i) {
    int start = i > 0 ? splits[static_cast<size_t>(i) - 1] : 0;
    double sum = 0;
    for (int j = start; j < splits[static_cast<size_t>(i)]; ++j) sum += normal[static_cast<size_t>(j)];
    return sum;
  };
  // max() / min() over (size, index) tuples, as in Python: ties go to the larger / smaller index.
  auto largest = [&](int& p) {
    double m = -kInf;
    for (int i = 0; i < partitions; ++i)
      if (block_size(i) >= m) m = block_size(i), p = i;
    return m;
  };
  auto smallest = [&](int& q) {
    double m = kInf;
    for (int i = 0; i < partitions; ++i)
      if (block_size(i) < m) m = block_size(i), q = i;
    return m;
  };
  for (int guard = 0; guard < 100000; ++guard) {
    int p = 0;
    double max_size = largest(p);
    bool done = false;
    for (int inner = 0; inner < 100000; ++inner) {
      int q = 0;
      double min_size = smallest(q);
      if (max_size <= min_size + 1) {
        done = true;
        break;
      }
      int h;
      if (p < q) {
        h = q - 1;
        splits[static_cast<size_t>(h)] -= 1;
      } else {
        h = q + 1;
        splits[static_cast<size_t>(q)] += 1;
      }
      if (p == h) break;
    }
    if (done) break;
  }
  // torchgpipe can leave a partition empty; every stage here needs a block.
  int prev = 0;
  for (int x = 0; x + 1 < partitions; ++x) {
    splits[static_cast<size_t>(x)] = std::max(splits[static_cast<size_t>(x)], prev + 1);
    prev = splits[static_cast<size_t>(x)];
  }
  for (int x = partitions - 2; x >= 0; --x)
    splits[static_cast<size_t>(x)] = std::min(splits[static_cast<size_t>(x)], splits[static_cast<size_t>(x) + 1] - 1);
  std::vector<int> sizes;
  int start = 0;
  for (int s : splits) {
    sizes.push_back(s - start);
    start = s;
  }
  return sizes;
}

Bounds gpipe_partition(const CostModel& model) {
  std::vector<int> units = units_for(model, "gpipe");
  std::vector<double> times;
  for (size_t u = 0; u + 1 < units.size(); ++u) times.push_back(model.compute_ms(units[u], units[u + 1]));
  std::vector<int> sizes = barany_block_partition(times, model.stages());
  std::vector<int> unit_bounds{0};
  for (int s : sizes) unit_bounds.push_back(unit_bounds.back() + s);
  return to_node_bounds(units, unit_bounds);
}

Bounds pipedream_partition(const CostModel& model) {
  std::vector<int> units = units_for(model, "pipedream");
  return to_node_bounds(units, min_max_units(model, units, /*with_comm=*/true));
}

Bounds vpipe_partition(StageEvaluator& evaluator) {
  const CostModel& model = evaluator.model();
  std::vector<int> units = units_for(model, "vpipe");
  const int l = model.stages();
  std::vector<int> ub = min_max_units(model, units, /*with_comm=*/false);

  // Lexicographic cost: bytes over capacity first, then the slowest fitting stage.
  using Cost = std::pair<double, double>;
  auto cost_of = [&](const std::vector<int>& b) {
    double overflow = 0, slowest = 0;
    for (int x = 0; x < l; ++x) {
      const StageEval& ev =
          evaluator.evaluate(units[static_cast<size_t>(b[x])], units[static_cast<size_t>(b[x + 1])], x);
      if (ev.feasible)
        slowest = std::max(slowest, ev.time_ms());
      else
        overflow += static_cast<double>(std::max<int64_t>(1, ev.peak - evaluator.capacity()));
    }
    return Cost{overflow, slowest};
  };

  Cost current = cost_of(ub);
  for (int pass = 0; pass < 16; ++pass) {
    // One Kernighan-Lin pass: keep moving the best unlocked boundary block, even uphill, lock
    // it, and finally return to the best state seen.
    std::vector<char> locked(units.size(), 0);
    std::vector<int> state = ub, best_state = ub;
    Cost best = current;
    for (size_t step = 0; step + 1 < units.size(); ++step) {
      Cost move_cost{kInf, kInf};
      std::vector<int> move_state;
      int move_unit = -1;
      for (int j = 1; j < l; ++j) {
        // Last block of stage j-1 to stage j, or first block of stage j to stage j-1.
        for (int dir : {-1, +1}) {
          std::vector<int> trial = state;
          int unit = dir < 0 ? trial[j] - 1 : trial[j];
          if (locked[static_cast<size_t>(unit)]) continue;
          trial[j] += dir;
          if (trial[j] <= trial[j - 1] || trial[j] >= trial[j + 1]) continue;
          Cost c = cost_of(trial);
          if (c < move_cost) {
            move_cost = c;
            move_state = std::move(trial);
            move_unit = unit;
          }
        }
      }
      if (move_unit < 0) break;
      locked[static_cast<size_t>(move_unit)] = 1;
      state = std::move(move_state);
      if (move_cost < best) {
        best = move_cost;
        best_state = state;
      }
    }
    if (!(best < current)) break;
    current = best;
    ub = best_state;
  }
  if (current.first > 0) return {};
  return to_node_bounds(units, ub);
}

// best[x][e] = min over s of max(best[x-1][s], t(s, e, x)), t infinite where the stage does not
// fit. compute + allreduce is a lower bound of t (memory optimization only adds time), so each
// cell takes its candidate starts in the order of that bound and evaluates a stage (memory,
// memory optimization) only while the bound can still beat the best found. O(l n^2) bound
// computations; evaluations: per cell the candidates whose bound lies below the cell's optimum
// (for memopt none usually one or two). Stage 0's ranges are evaluated when first needed.
Bounds exact_partition(StageEvaluator& evaluator, double below) {
  const CostModel& model = evaluator.model();
  const int n = model.size(), l = model.stages();
  const size_t columns = static_cast<size_t>(n) + 1;
  auto bound = [&](int b, int e) { return model.compute_ms(b, e) + model.allreduce_per_micro_batch_ms(b, e); };
  // best[x][e]: slowest stage of stages 0..x over nodes [0, e); from[x][e]: where x starts.
  std::vector<std::vector<double>> best(static_cast<size_t>(l), std::vector<double>(columns, kInf));
  std::vector<std::vector<int>> from(static_cast<size_t>(l), std::vector<int>(columns, -1));
  std::vector<bool> first_known(columns, false);
  auto first = [&](int e) {  // best[0][e], evaluated on demand
    if (!first_known[static_cast<size_t>(e)])
      best[0][static_cast<size_t>(e)] = evaluator.evaluate(0, e, 0).time_ms(),
      first_known[static_cast<size_t>(e)] = true;
    return best[0][static_cast<size_t>(e)];
  };
  auto known_or_bound = [&](int x, int s) {
    return x == 1 && !first_known[static_cast<size_t>(s)] ? bound(0, s)
                                                          : best[static_cast<size_t>(x - 1)][static_cast<size_t>(s)];
  };
  if (l == 1) return first(n) < below ? Bounds{0, n} : Bounds{};
  std::vector<std::pair<double, int>> candidates;  // (lower bound, start), a min-heap
  const auto later = std::greater<std::pair<double, int>>();
  for (int x = 1; x < l; ++x) {
    // The last stage ends at n; stage x leaves at least one node to each later stage.
    for (int e = x == l - 1 ? n : x + 1; e <= n - (l - 1 - x); ++e) {
      candidates.clear();
      for (int s = e - 1; s >= x; --s) {
        const double stage = bound(s, e);
        if (stage >= below) break;  // longer stages only take longer
        const double before = known_or_bound(x, s);
        if (before < below) candidates.push_back({std::max(before, stage), s});
      }
      std::make_heap(candidates.begin(), candidates.end(), later);
      double& b = best[static_cast<size_t>(x)][static_cast<size_t>(e)];
      b = below;  // nothing at or above it is wanted (kInf: no bound)
      while (!candidates.empty() && candidates.front().first < b) {
        std::pop_heap(candidates.begin(), candidates.end(), later);
        const int s = candidates.back().second;
        candidates.pop_back();
        const double before = x == 1 ? first(s) : best[static_cast<size_t>(x - 1)][static_cast<size_t>(s)];
        if (before >= b) continue;
        const double v = std::max(before, evaluator.evaluate(s, e, x).time_ms());
        if (v < b) b = v, from[static_cast<size_t>(x)][static_cast<size_t>(e)] = s;
      }
    }
  }
  if (best[static_cast<size_t>(l) - 1][static_cast<size_t>(n)] >= below) return {};
  return bounds_from(from, n);
}

// cost[x][e] = min over s of cost[x-1][s] + t(s, e)^2 over stages with t <= bottleneck that fit
// by the formula. Fitting is monotone in a stage's range, so each (stage, end) has a shortest
// fitting start, non-decreasing in the end: two pointers, O(l n) memory checks; the rest is
// arithmetic over the starts under the bottleneck.
Bounds balanced_partition(const CostModel& model, int64_t capacity, double bottleneck) {
  const int n = model.size(), l = model.stages();
  const size_t columns = static_cast<size_t>(n) + 1;
  auto time = [&](int b, int e) { return model.compute_ms(b, e) + model.allreduce_per_micro_batch_ms(b, e); };
  std::vector<std::vector<double>> cost(static_cast<size_t>(l), std::vector<double>(columns, kInf));
  std::vector<std::vector<int>> from(static_cast<size_t>(l), std::vector<int>(columns, -1));
  for (int x = 0; x < l; ++x) {
    int lo = x;  // the shortest fitting start for the current end
    for (int e = x + 1; e <= n - (l - 1 - x); ++e) {
      while (lo < e && model.peak_without_memopt(lo, e, x) > capacity) ++lo;
      double& c = cost[static_cast<size_t>(x)][static_cast<size_t>(e)];
      if (x == 0) {
        if (lo == 0 && time(0, e) <= bottleneck) c = time(0, e) * time(0, e);
        continue;
      }
      for (int s = e - 1; s >= std::max(lo, x); --s) {
        const double t = time(s, e);
        if (t > bottleneck) break;  // longer stages only take longer
        const double v = cost[static_cast<size_t>(x) - 1][static_cast<size_t>(s)] + t * t;
        if (v < c) c = v, from[static_cast<size_t>(x)][static_cast<size_t>(e)] = s;
      }
    }
  }
  if (cost[static_cast<size_t>(l) - 1][static_cast<size_t>(n)] == kInf) return {};
  return bounds_from(from, n);
}

}  // namespace dawnpiper
