#include "memory/device_memory.h"

#include <ATen/Context.h>

#include "memory/counting_allocator.h"
#include "util/error.h"

#ifdef DAWNPIPER_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#endif

namespace dawnpiper {

#ifdef DAWNPIPER_CUDA
namespace {
using c10::CachingAllocator::StatType;
int cuda_index(c10::Device d) { return d.index() < 0 ? 0 : d.index(); }
c10::CachingDeviceAllocator::DeviceStats cuda_stats(c10::Device d) {
  DeviceMemory::initialize(d);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(d));
}
}  // namespace
#endif

void DeviceMemory::initialize(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  // The caching allocator is made at CUDA's lazy initialization; before it, its statistics and
  // memory fraction throw "Allocator not initialized for device".
  if (device.is_cuda()) at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
#endif
  (void)device;
}

int64_t DeviceMemory::live_bytes(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) return cuda_stats(device).allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].current;
#endif
  (void)device;
  return CountingAllocator::install().live_bytes();
}

int64_t DeviceMemory::peak_bytes(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) return cuda_stats(device).allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
#endif
  (void)device;
  return CountingAllocator::install().peak_bytes();
}

void DeviceMemory::reset_peak(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) {
    initialize(device);
    c10::cuda::CUDACachingAllocator::resetPeakStats(cuda_index(device));
    return;
  }
#endif
  (void)device;
  CountingAllocator::install().reset_peak();
}

void DeviceMemory::set_capacity(c10::Device device, int64_t bytes) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) {
    initialize(device);
    const int index = cuda_index(device);
    size_t free_bytes = 0, total_bytes = 0;
    cudaSetDevice(index);
    cudaFree(nullptr);  // creates the context if needed
    cudaMemGetInfo(&free_bytes, &total_bytes);
    const double fraction = bytes <= 0 ? 1.0 : std::min(1.0, double(bytes) / double(total_bytes));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index);
    return;
  }
#endif
  (void)device;
  CountingAllocator::install().set_capacity(bytes);
}

void synchronize(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

bool cuda_available() {
#ifdef DAWNPIPER_CUDA
  return at::globalContext().hasCUDA() && c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

c10::Device parse_device(const std::string& name, bool require_gpu) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "cuda") {
#ifndef DAWNPIPER_CUDA
    throw ConfigError("--device cuda: this build has no CUDA support (rebuild with a CUDA LibTorch); use --device cpu");
#endif
    if (require_gpu && !cuda_available())
      throw ConfigError("--device cuda: no GPU is visible on this machine; use --device cpu");
    return c10::Device(c10::kCUDA, 0);
  }
  throw ConfigError("unknown device '" + name + "' (choose cpu or cuda)");
}

}  // namespace dawnpiper
