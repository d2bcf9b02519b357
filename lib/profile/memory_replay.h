#pragma once
// Replays a profile's per-node allocations and frees for one training step (forward and
// backward of one micro-batch, then the optimizer step) and predicts its peak memory. Pure C++.
// The profiler's tests compare this prediction with the counting allocator's measured peak.
#include <cstdint>
#include <string>

#include "profile/profile.h"

namespace dawnpiper {

struct ReplayResult {
  int64_t peak_bytes = 0;         // static + activations + gradients + transients at the peak
  int64_t static_bytes = 0;       // parameters and optimizer state
  int64_t activation_peak = 0;    // peak_bytes - static_bytes
  int64_t forward_end_bytes = 0;  // live bytes when the forward pass ends
  int peak_node = -1;             // node running at the peak
  bool peak_in_backward = false;
};

ReplayResult replay_step(const Profile& profile, const std::string& optimizer);

}  // namespace dawnpiper
