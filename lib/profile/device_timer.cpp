#include "profile/device_timer.h"

#ifdef DAWNPIPER_CUDA
#include <ATen/cuda/CUDAEvent.h>
#endif

namespace dawnpiper {

#ifdef DAWNPIPER_CUDA
struct DeviceTimer::Events {
  std::vector<std::unique_ptr<at::cuda::CUDAEvent>> marks;
};
#else
struct DeviceTimer::Events {};
#endif

DeviceTimer::DeviceTimer(c10::Device device) : device_(device), events_(std::make_unique<Events>()) {}
DeviceTimer::~DeviceTimer() = default;

void DeviceTimer::mark(int owner) {
  owners_.push_back(owner);
#ifdef DAWNPIPER_CUDA
  if (device_.is_cuda()) {
    // cudaEventDefault keeps timing enabled (CUDAEvent's default disables it).
    events_->marks.push_back(std::make_unique<at::cuda::CUDAEvent>(cudaEventDefault));
    events_->marks.back()->record();
    return;
  }
#endif
  times_.push_back(std::chrono::steady_clock::now());
}

std::vector<double> DeviceTimer::totals_ms(int owners) {
  std::vector<double> totals(static_cast<size_t>(owners), 0.0);
  for (size_t i = 0; i + 1 < owners_.size(); ++i) {
    const int owner = owners_[i];
    if (owner < 0 || owner >= owners) continue;
    double ms = 0;
#ifdef DAWNPIPER_CUDA
    if (device_.is_cuda()) {
      events_->marks[i + 1]->synchronize();
      ms = events_->marks[i]->elapsed_time(*events_->marks[i + 1]);
    } else
#endif
      ms = std::chrono::duration<double, std::milli>(times_[i + 1] - times_[i]).count();
    totals[static_cast<size_t>(owner)] += ms;
  }
  return totals;
}

void DeviceTimer::clear() {
  owners_.clear();
  times_.clear();
#ifdef DAWNPIPER_CUDA
  events_->marks.clear();
#endif
}

}  // namespace dawnpiper
