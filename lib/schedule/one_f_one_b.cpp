// 1F1B: stage x warms up with min(l-x-1, m) forwards, then alternates one forward and one
// backward and drains. Synchronous (one update per step) or PipeDream's (one per backward).
#include "schedule/registry.h"

namespace dawnpiper {

namespace {
ComputeLists one_f_one_b(int stages, int64_t m, bool update_every_backward) {
  ComputeLists lists(static_cast<size_t>(stages));
  for (int x = 0; x < stages; ++x) {
    std::vector<Action>& list = lists[static_cast<size_t>(x)];
    auto backward = [&](int64_t mb) {
      list.push_back({ActionKind::Backward, x, mb});
      if (update_every_backward) list.push_back({ActionKind::OptimizerStep, x, -1});
    };
    const int64_t warmup = std::min<int64_t>(stages - x - 1, m);
    for (int64_t i = 0; i < warmup; ++i) list.push_back({ActionKind::Forward, x, i});
    for (int64_t i = warmup; i < m; ++i) {  // steady state: one forward, one backward
      list.push_back({ActionKind::Forward, x, i});
      backward(i - warmup);
    }
    for (int64_t j = m - warmup; j < m; ++j) backward(j);  // drain
    if (!update_every_backward) list.push_back({ActionKind::OptimizerStep, x, -1});
  }
  return lists;
}
}  // namespace

ComputeLists one_f_one_b_actions(const ScheduleShape& s) { return one_f_one_b(s.ranks, s.micro_batches, false); }
ComputeLists async_actions(const ScheduleShape& s) { return one_f_one_b(s.ranks, s.micro_batches, true); }

}  // namespace dawnpiper
