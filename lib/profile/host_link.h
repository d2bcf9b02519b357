#pragma once
// The device's link to host memory, which swapped tensors cross: pinned copies measured at a few
// sizes in each direction and both at once (`profile` on CUDA), and the copy time the planner
// charges a swap of a given size. Small copies move slower than large ones (on an H100: 17 GB/s at
// 1 MiB, 53 GB/s from 64 MiB), so the time is interpolated between the measured sizes.
#include <cstdint>
#include <string>
#include <vector>

namespace dawnpiper {

struct LinkSample {
  int64_t bytes = 0;
  double to_host = 0, to_device = 0;  // bytes/s, one copy at a time
  double both = 0;                    // bytes/s moved in all with one copy each way at once
};

struct HostLink {
  std::vector<LinkSample> samples;  // by size; empty: not measured

  bool measured() const { return !samples.empty(); }
  // Seconds for one copy of `bytes` in the slower direction (a swap's copies out and back share
  // one side stream): the bandwidth interpolated in log size between the measured sizes, the
  // nearest one's beyond them.
  double copy_seconds(int64_t bytes) const;
  // "17.2 GB/s at 1 MiB .. 53.4 GB/s at 64 MiB to the host, ...", for plan's output.
  std::string summary() const;
  // [[bytes, to_host, to_device, both], ...] and back; from_json throws ConfigError on bad input.
  std::string to_json() const;
  static HostLink from_json(const std::string& text);
};

}  // namespace dawnpiper
