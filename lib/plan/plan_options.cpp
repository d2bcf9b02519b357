#include "plan/plan_options.h"

#include <ostream>

#include "util/error.h"

namespace dawnpiper {

void set_device_memory(PlanSettings& options, int64_t device_memory, double headroom_share) {
  options.allocator_headroom_bytes =
      device_memory == kUnlimitedBytes ? 0 : static_cast<int64_t>(static_cast<double>(device_memory) * headroom_share);
  options.capacity_bytes = device_memory - options.allocator_headroom_bytes;
}

std::string zero_refusal(int level, const ScheduleChoice& schedule) {
  if (level < 2 || schedule.traits().updates_once_per_step) return "";
  const std::string head = "--zero-stage " + std::to_string(level) + " under --schedule " + name_of(schedule) +
                           " cannot run: its stages update after every backward, each micro-batch on the weights "
                           "it stashed at its forward";
  if (level == 3)
    return head +
           ", a whole copy of the stage's parameters per micro-batch in flight, where level 3 holds only a "
           "replica's shard of them (--zero-stage 1 shards the optimizer state under it)";
  return head +
         ", into which its backward accumulates: the gradients reach the shard only where the backward "
         "ends, as at level 1, and no gradient outlives its micro-batch to be sharded (use --zero-stage 1)";
}

}  // namespace dawnpiper
