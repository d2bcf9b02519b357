// ZB-H1 (Qi et al., ICLR 2024, "zero bubble"): each backward split into I (the input gradients
// the previous stage waits for) and W (the weight gradients, which nothing waits for), so that
// W fills the bubbles. Stage x warms up with 1F1B's min(l-x-1, m) forwards, then runs F, I
// pairs until it has delayed x W's, then an F, I, W triple per micro-batch (W of the oldest
// held one); the delayed W's run at the end, then one update. With uniform stages the step
// takes m (F+I+W) + (l-1)(F+I-W) against 1F1B's (m+l-1)(F+I+W), every stage holding min(l, m)
// micro-batches (1F1B's first stage's count).
//
// ZB-H2, which forwards further ahead, is schedule/zb_h2.cpp.
#include <deque>

#include "schedule/registry.h"

namespace dawnpiper {

ComputeLists zb_h1_actions(const ScheduleShape& shape) {
  const int stages = shape.ranks;
  const int64_t m = shape.micro_batches;
  ComputeLists lists(static_cast<size_t>(stages));
  for (int x = 0; x < stages; ++x) {
    std::vector<Action>& list = lists[static_cast<size_t>(x)];
    std::deque<int64_t> held;  // input gradients done, weight gradients not yet
    int64_t next_forward = 0, next_input = 0, steady = 0;
    auto input_then_weight = [&] {
      list.push_back({ActionKind::BackwardInput, x, next_input});
      held.push_back(next_input++);
      if (steady++ >= x) {
        list.push_back({ActionKind::BackwardWeight, x, held.front()});
        held.pop_front();
      }
    };
    for (const int64_t warmup = std::min<int64_t>(stages - x - 1, m); next_forward < warmup;)
      list.push_back({ActionKind::Forward, x, next_forward++});
    while (next_forward < m) {
      list.push_back({ActionKind::Forward, x, next_forward++});
      input_then_weight();
    }
    while (next_input < m) input_then_weight();
    for (int64_t mb : held) list.push_back({ActionKind::BackwardWeight, x, mb});
    list.push_back({ActionKind::OptimizerStep, x, -1});
  }
  return lists;
}

}  // namespace dawnpiper
