#pragma once
// SwapCopier: moves an evicted storage's bytes to host memory the device allocator does not
// charge, and back. On the CPU the copies are plain memcpy into malloc'd memory (invisible to
// the counting allocator, so the saving is measured for real). On CUDA they run on a side
// stream into pinned memory: the copy out starts after the compute stream's queued work and the
// device bytes return to the caching allocator at once (reused only after the copy); the copy
// back is issued early (TensorDecision::prefetch_at) and the compute stream waits for it only
// where the tensor is read (wait()).
#include <cstdint>
#include <memory>
#include <vector>

#include <c10/core/Allocator.h>
#include <c10/core/Device.h>

namespace dawnpiper {

class SwapCopier {
 public:
  explicit SwapCopier(c10::Device device);
  ~SwapCopier();

  // Starts copying `bytes` of `device_data` out and gives the device memory back; returns the
  // host copy (complete once the side stream gets there: copy_in orders after it).
  c10::DataPtr copy_out(c10::DataPtr device_data, int64_t bytes);

  struct Incoming {
    c10::DataPtr data;           // device memory the bytes are copied into
    std::shared_ptr<void> done;  // CUDA: the copy's event; null on the CPU (done already)
  };
  // Allocates device memory and starts copying `host` into it.
  Incoming copy_in(c10::DataPtr host, int64_t bytes);
  // The compute stream waits for the copy (a no-op on the CPU).
  void wait(const Incoming& incoming);

  // How the copies back met the compute stream, over every wait() so far (CUDA: from events on
  // both streams; waits for the device). A copy is waited for when it ended after the compute
  // stream reached the read that needs it: the swap was not hidden behind compute.
  struct Waits {
    int64_t copies = 0;   // waits
    int64_t waited = 0;   // of them, copies that ended after the compute stream got there
    double stall_ms = 0;  // the compute stream's time spent waiting, summed
  };
  Waits waits() const;

 private:
  c10::Device device_;
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
  // Per wait(): the copy's end and the compute stream's arrival (CUDA events).
  std::vector<std::pair<std::shared_ptr<void>, std::shared_ptr<void>>> meetings_;
};

}  // namespace dawnpiper
