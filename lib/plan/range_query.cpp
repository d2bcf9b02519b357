#include "plan/range_query.h"

#include <algorithm>
#include <numeric>

namespace dawnpiper {

RangeMax::RangeMax(const std::vector<int64_t>& values) {
  levels_.push_back(values);
  size_t n = values.size();
  for (size_t width = 2; width <= n; width *= 2) {
    const std::vector<int64_t>& prev = levels_.back();
    std::vector<int64_t> next(n - width + 1);
    for (size_t i = 0; i + width <= n; ++i) next[i] = std::max(prev[i], prev[i + width / 2]);
    levels_.push_back(std::move(next));
  }
}

int64_t RangeMax::max(int begin, int end) const {
  if (end <= begin) return 0;
  int len = end - begin;
  int k = 31 - __builtin_clz(static_cast<unsigned>(len));
  const std::vector<int64_t>& level = levels_[static_cast<size_t>(k)];
  return std::max(level[static_cast<size_t>(begin)], level[static_cast<size_t>(end - (1 << k))]);
}

DominanceSum::DominanceSum(int extent, const std::vector<Point>& points) : extent_(extent) {
  const size_t nodes = static_cast<size_t>(extent) + 1;
  std::vector<std::vector<std::pair<int, int64_t>>> buckets(nodes);
  for (const Point& p : points) {
    // Reversed position, 1-based: x = extent-1 -> 1, x = 0 -> extent.
    for (int i = extent - p.x; i <= extent; i += i & -i) buckets[static_cast<size_t>(i)].push_back({p.y, p.weight});
  }
  offset_.assign(nodes + 1, 0);
  for (size_t i = 0; i < nodes; ++i) offset_[i + 1] = offset_[i] + buckets[i].size();
  ys_.reserve(offset_[nodes]);
  prefix_.reserve(offset_[nodes] + nodes);
  for (size_t i = 0; i < nodes; ++i) {
    std::vector<std::pair<int, int64_t>>& b = buckets[i];
    std::sort(b.begin(), b.end());
    prefix_.push_back(0);
    for (const auto& yw : b) {
      ys_.push_back(yw.first);
      prefix_.push_back(prefix_.back() + yw.second);
    }
  }
}

void DominanceSum::query(int qx, int qy, int64_t& weight, int64_t& count) const {
  weight = 0;
  count = 0;
  if (extent_ == 0) return;
  qx = std::max(qx, 0);
  if (qx >= extent_) return;
  // x >= qx  <=>  reversed position <= extent - qx.
  for (int i = extent_ - qx; i > 0; i -= i & -i) {
    const size_t node = static_cast<size_t>(i);
    const int* begin = ys_.data() + offset_[node];
    const int* end = ys_.data() + offset_[node + 1];
    if (begin == end) continue;
    size_t j = static_cast<size_t>(std::lower_bound(begin, end, qy) - begin);
    weight += prefix_[offset_[node] + node + j];
    count += static_cast<int64_t>(j);
  }
}

int64_t DominanceSum::weight(int qx, int qy) const {
  int64_t w, c;
  query(qx, qy, w, c);
  return w;
}

int64_t DominanceSum::count(int qx, int qy) const {
  int64_t w, c;
  query(qx, qy, w, c);
  return c;
}

}  // namespace dawnpiper
