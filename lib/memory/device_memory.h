#pragma once
// Device memory statistics and device synchronization behind one interface: on the CPU from the
// CountingAllocator, on CUDA from the caching allocator's statistics (allocated bytes).
#include <cstdint>
#include <string>

#include <c10/core/Device.h>

namespace dawnpiper {

struct DeviceMemory {
  // Creates the device's allocator (CUDA: LibTorch's lazy initialization, which otherwise waits
  // for the first CUDA tensor); every call below does it first. A no-op on the CPU.
  static void initialize(c10::Device device);
  static int64_t live_bytes(c10::Device device);
  static int64_t peak_bytes(c10::Device device);
  static void reset_peak(c10::Device device);
  // 0 = unlimited. CPU: enforced by the counting allocator; CUDA: the caching allocator's memory
  // fraction of the device total.
  static void set_capacity(c10::Device device, int64_t bytes);
};

// Waits for the device's queued work (no-op on the CPU).
void synchronize(c10::Device device);
// True if this build has the CUDA paths and a GPU is visible.
bool cuda_available();
// Parses "cpu" / "cuda"; ConfigError for anything else, for cuda in a build without CUDA, and
// (require_gpu) for cuda without cuda_available(). `train` checks the GPU per rank instead
// (runtime/device_placement.h).
c10::Device parse_device(const std::string& name, bool require_gpu = true);

}  // namespace dawnpiper
