#pragma once
// Device memory statistics and device synchronization behind one interface: on the CPU from the
// CountingAllocator, on CUDA from the caching allocator's statistics (allocated bytes).
//
// On CUDA the caching allocator keeps freed blocks for reuse, so it holds (reserves) more than is
// allocated; a memory cap (set_capacity) bounds what it reserves. Unless PYTORCH_CUDA_ALLOC_CONF
// (or PYTORCH_ALLOC_CONF) says otherwise, initialize() turns on its expandable segments, which map
// and unmap pages of a few growing segments instead of keeping one cudaMalloc block per large
// request: the gap between reserved and allocated bytes then stays small (docs/gpu.md).
#include <cstdint>
#include <exception>
#include <string>

#include <c10/core/Device.h>

#include "util/enum_names.h"

namespace dawnpiper {

struct DeviceMemory {
  // Creates the device's allocator (CUDA: LibTorch's lazy initialization, which otherwise waits
  // for the first CUDA tensor); every call below does it first. A no-op on the CPU.
  static void initialize(c10::Device device);
  static int64_t live_bytes(c10::Device device);
  static int64_t peak_bytes(c10::Device device);
  // The most the allocator has held since reset_peak: on CUDA its reserved bytes (what a cap
  // limits), on the CPU the allocated peak (the counting allocator keeps nothing back).
  static int64_t reserved_peak_bytes(c10::Device device);
  static void reset_peak(c10::Device device);
  // kUnlimitedBytes: no limit. CPU: enforced by the counting allocator; CUDA: the caching
  // allocator's memory fraction of the device total.
  static void set_capacity(c10::Device device, int64_t bytes);
  // What the device has free now (CUDA: cudaMemGetInfo, after creating this process's context);
  // kUnlimitedBytes on the CPU.
  static int64_t free_bytes(c10::Device device);
  // Returns the blocks the caching allocator keeps but nothing uses to the device (CUDA), so that
  // what profiling held does not count against the stage a rank runs next. A no-op on the CPU.
  static void release_cached(c10::Device device);
};

// What a CUDA process takes beyond its caching allocator once its context exists: the kernels
// and library handles loaded on first use. Measured on an H200 with LibTorch 2.11 (CUDA 13):
// 738-745 MiB per DawnPiper process outside the allocator, of which the context, present from
// the start, is 527 MiB (docs/gpu.md, "Memory without --device-memory").
constexpr int64_t kCudaLazyLoadBytes = int64_t{256} << 20;

// The share of a device's memory a plan leaves to the allocator's fragmentation when the user
// gives none (--allocator-headroom): what the CUDA caching allocator reserved beyond its allocated
// peak on the GPU check's capped plans; 0 on the CPU. `device` as a profile names it ("cuda:0").
double default_allocator_headroom(const std::string& device);
// Parses --allocator-headroom: a share of the memory ("5%", "0.05"), in [0, 0.5].
double parse_allocator_headroom(const std::string& text);

// Whether `e` says an allocation failed: the counting allocator's capacity, the CUDA caching
// allocator, the host.
bool is_out_of_memory(const std::exception& e);

// Waits for the device's queued work (no-op on the CPU).
void synchronize(c10::Device device);
// Waits for the work queued on the device's current stream only: copies on side streams (swaps)
// go on (no-op on the CPU).
void synchronize_current_stream(c10::Device device);
// True if this build has the CUDA paths and a GPU is visible.
bool cuda_available();
// --device: what a run trains on (the option is read as this enum).
enum class DeviceKind { Cpu, Cuda };
template <>
struct EnumNames<DeviceKind> {
  static constexpr const char* what = "device";
  static constexpr std::array<std::pair<DeviceKind, const char*>, 2> table{
      {{DeviceKind::Cpu, "cpu"}, {DeviceKind::Cuda, "cuda"}}};
};
// The device of that kind; ConfigError for cuda in a build without CUDA and (require_gpu) for
// cuda without cuda_available(). `train` checks the GPU per rank instead
// (runtime/device_placement.h).
c10::Device parse_device(DeviceKind kind, bool require_gpu = true);

}  // namespace dawnpiper
