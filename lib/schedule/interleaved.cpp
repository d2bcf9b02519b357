// Interleaved 1F1B (Narayanan et al., SC'21; Megatron-LM): each of the l ranks holds V stages,
// stage c*l + r being rank r's chunk c. A rank runs its forwards in groups of l micro-batches,
// chunk after chunk (micro-batches 0..l-1 through chunk 0, then through chunk 1, ...), and its
// backwards in the same groups from the last chunk back. Rank r warms up with
// 2(l-r-1) + (V-1)l forwards, then alternates one forward and one backward, then drains; with
// m = l every forward is warm-up (Megatron's rule). Uniform stages take m V (f+b) + (l-1)(f+b)
// where f and b are one stage's passes: the bubble of 1F1B divided by V.
#include "schedule/registry.h"
#include "util/error.h"

namespace dawnpiper {

ComputeLists interleaved_actions(const ScheduleShape& shape) {
  const int l = shape.ranks, v = shape.virtual_stages;
  const int64_t m = shape.micro_batches, total = m * v;
  if (m % l != 0)
    throw ConfigError("interleaved runs its micro-batches in groups of one per rank: --micro-batches " +
                      std::to_string(m) + " is not a multiple of the " + std::to_string(l) + " ranks");
  // The k-th forward (backward) of a rank: its micro-batch and its chunk.
  auto micro_batch = [&](int64_t k) { return (k / (int64_t{l} * v)) * l + k % l; };
  auto forward_chunk = [&](int64_t k) { return static_cast<int>((k / l) % v); };
  auto backward_chunk = [&](int64_t k) { return v - 1 - forward_chunk(k); };
  ComputeLists lists(static_cast<size_t>(l));
  for (int r = 0; r < l; ++r) {
    std::vector<Action>& list = lists[static_cast<size_t>(r)];
    auto forward = [&](int64_t k) { list.push_back({ActionKind::Forward, forward_chunk(k) * l + r, micro_batch(k)}); };
    auto backward = [&](int64_t k) {
      list.push_back({ActionKind::Backward, backward_chunk(k) * l + r, micro_batch(k)});
    };
    const int64_t warmup = m == l ? total : std::min<int64_t>(2 * (l - r - 1) + int64_t{v - 1} * l, total);
    for (int64_t k = 0; k < warmup; ++k) forward(k);
    for (int64_t k = warmup; k < total; ++k) forward(k), backward(k - warmup);
    for (int64_t k = total - warmup; k < total; ++k) backward(k);
    for (int c = 0; c < v; ++c) list.push_back({ActionKind::OptimizerStep, c * l + r, -1});
  }
  return lists;
}

}  // namespace dawnpiper
