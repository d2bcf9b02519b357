#pragma once

#include <c10/core/Device.h>

#include "profile/host_link.h"

namespace dawnpiper {

// Times pinned copies between `device` and host memory as the swap copier makes them (a side
// stream each way, CUDA events around each), at 256 KiB .. 64 MiB, the best of three each; both
// directions at once on their own streams. Empty on a CPU device. Measured once per device per
// process.
HostLink measure_host_link(c10::Device device);

}  // namespace dawnpiper
