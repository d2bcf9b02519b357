#include "plan/plan_options.h"

#include <ostream>

#include "util/error.h"

namespace dawnpiper {

void set_device_memory(PlanSettings& options, int64_t device_memory, double headroom_share) {
  options.allocator_headroom_bytes =
      device_memory == kUnlimitedBytes ? 0 : static_cast<int64_t>(static_cast<double>(device_memory) * headroom_share);
  options.capacity_bytes = device_memory - options.allocator_headroom_bytes;
}

}  // namespace dawnpiper
