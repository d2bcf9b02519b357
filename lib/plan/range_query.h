#pragma once
// Static range-query structures that make a stage's cost an O(log^2 n) lookup instead of a scan,
// so the planner can evaluate many candidate cuts of large graphs quickly.
#include <cstddef>
#include <cstdint>
#include <vector>

namespace dawnpiper {

// Maximum of a fixed array over [begin, end) in O(1) (sparse table).
class RangeMax {
 public:
  RangeMax() = default;
  explicit RangeMax(const std::vector<int64_t>& values);
  int64_t max(int begin, int end) const;  // 0 for an empty range

 private:
  std::vector<std::vector<int64_t>> levels_;  // levels_[k][i] = max of [i, i + 2^k)
};

// Weighted points (x, y); sums the weights and counts the points with x >= qx and y < qy
// (a dominance query) in O(log^2 n): a Fenwick tree over x whose nodes hold their points
// sorted by y with prefix sums.
class DominanceSum {
 public:
  struct Point {
    int x, y;
    int64_t weight;
  };
  DominanceSum() = default;
  // Coordinates must lie in [0, extent).
  DominanceSum(int extent, const std::vector<Point>& points);
  int64_t weight(int qx, int qy) const;
  int64_t count(int qx, int qy) const;
  void query(int qx, int qy, int64_t& weight, int64_t& count) const;

 private:
  int extent_ = 0;
  // Fenwick node i covers reversed x positions (i - lowbit(i), i]; reversed so "x >= qx" is a
  // prefix. Its points' y values are ys_[offset_[i] .. offset_[i+1]), sorted, and
  // prefix_[offset_[i] + i + j] is the weight of its first j points (one extra slot per node).
  std::vector<size_t> offset_;
  std::vector<int> ys_;
  std::vector<int64_t> prefix_;
};

}  // namespace dawnpiper
