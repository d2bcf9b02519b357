#pragma once
// DeviceTimer: a timeline of marks on one device, each charging the time until the next mark to
// an owner (a node id; negative owners are not charged). On CPU the marks read a monotonic
// clock; on CUDA they are events recorded on the current stream, so kernels are timed where
// they run, not where they were queued.
#include <chrono>
#include <memory>
#include <vector>

#include <c10/core/Device.h>

namespace dawnpiper {

class DeviceTimer {
 public:
  explicit DeviceTimer(c10::Device device);
  ~DeviceTimer();
  DeviceTimer(const DeviceTimer&) = delete;
  DeviceTimer& operator=(const DeviceTimer&) = delete;

  // Starts an interval charged to `owner`; it ends at the next mark.
  void mark(int owner);
  // Milliseconds charged to each owner in [0, owners) since the last clear(); waits for the
  // device. The interval after the last mark is not charged: end a timeline with mark(-1).
  std::vector<double> totals_ms(int owners);
  void clear();

 private:
  struct Events;  // CUDA events, when built with CUDA
  c10::Device device_;
  std::vector<int> owners_;
  std::vector<std::chrono::steady_clock::time_point> times_;
  std::unique_ptr<Events> events_;
};

// Milliseconds of `work` on `device` (one interval of a DeviceTimer).
template <typename F>
double time_ms(c10::Device device, F&& work) {
  DeviceTimer timer(device);
  timer.mark(0);
  work();
  timer.mark(-1);
  return timer.totals_ms(1)[0];
}

}  // namespace dawnpiper
