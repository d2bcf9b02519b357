// GPipe: all forwards, then all backwards in the same order, then one update.
#include "schedule/registry.h"

namespace dawnpiper {

ComputeLists gpipe_actions(const ScheduleShape& shape) {
  const int stages = shape.ranks;
  const int64_t m = shape.micro_batches;
  ComputeLists lists(static_cast<size_t>(stages));
  for (int x = 0; x < stages; ++x) {
    std::vector<Action>& list = lists[static_cast<size_t>(x)];
    for (int64_t i = 0; i < m; ++i) list.push_back({ActionKind::Forward, x, i});
    for (int64_t i = 0; i < m; ++i) list.push_back({ActionKind::Backward, x, i});
    list.push_back({ActionKind::OptimizerStep, x, -1});
  }
  return lists;
}

}  // namespace dawnpiper
