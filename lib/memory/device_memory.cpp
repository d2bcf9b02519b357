#include "memory/device_memory.h"

#include <ATen/Context.h>
#include <c10/util/Exception.h>

#include <cstdlib>
#include <new>
#include <mutex>
#include <stdexcept>

#include "memory/counting_allocator.h"
#include "util/error.h"
#include "util/units.h"

#ifdef DAWNPIPER_CUDA
#include <c10/cuda/CUDAAllocatorConfig.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#endif

namespace dawnpiper {

// What the caching allocator reserved beyond the plan's allocated peak, with expandable segments,
// on the GPU check's capped swap/recompute plans (docs/gpu.md), rounded up.
constexpr double kCudaAllocatorHeadroom = 0.05;

#ifdef DAWNPIPER_CUDA
namespace {
using c10::CachingAllocator::StatType;
int cuda_index(c10::Device d) { return d.index() < 0 ? 0 : d.index(); }
c10::CachingDeviceAllocator::DeviceStats cuda_stats(c10::Device d) {
  DeviceMemory::initialize(d);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(cuda_index(d));
}

// Before the allocator's first block: expandable segments unless the user configured it.
void configure_cuda_allocator() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (std::getenv("PYTORCH_CUDA_ALLOC_CONF") || std::getenv("PYTORCH_ALLOC_CONF")) return;
    c10::cuda::CUDACachingAllocator::setAllocatorSettings("expandable_segments:True");
  });
}
}  // namespace
#endif

void DeviceMemory::initialize(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) configure_cuda_allocator();
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

int64_t DeviceMemory::reserved_peak_bytes(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) return cuda_stats(device).reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
#endif
  return peak_bytes(device);
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
    const double fraction = bytes == kUnlimitedBytes ? 1.0 : std::min(1.0, double(bytes) / double(total_bytes));
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index);
    return;
  }
#endif
  (void)device;
  CountingAllocator::install().set_capacity(bytes);
}

int64_t DeviceMemory::free_bytes(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) {
    initialize(device);
    size_t free_bytes = 0, total_bytes = 0;
    cudaSetDevice(cuda_index(device));
    cudaFree(nullptr);  // creates the context if needed
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess)
      throw Error("cannot read the free memory of " + device.str());
    return static_cast<int64_t>(free_bytes);
  }
#endif
  (void)device;
  return kUnlimitedBytes;
}

void DeviceMemory::release_cached(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
  (void)device;
}

bool is_out_of_memory(const std::exception& e) {
  return dynamic_cast<const OutOfMemoryError*>(&e) || dynamic_cast<const c10::OutOfMemoryError*>(&e) ||
         dynamic_cast<const std::bad_alloc*>(&e);
}

void synchronize(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
  (void)device;
}

void synchronize_current_stream(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
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

double default_allocator_headroom(const std::string& device) {
  return device.rfind("cuda", 0) == 0 ? kCudaAllocatorHeadroom : 0.0;
}

double parse_allocator_headroom(const std::string& text) {
  const bool percent = !text.empty() && text.back() == '%';
  double share = 0;
  try {
    size_t used = 0;
    share = std::stod(percent ? text.substr(0, text.size() - 1) : text, &used);
    if (used != text.size() - (percent ? 1 : 0)) throw std::invalid_argument(text);
  } catch (const std::exception&) {
    throw ConfigError("--allocator-headroom '" + text + "': give a share of the memory, e.g. 5% or 0.05");
  }
  if (percent) share /= 100;
  if (!(share >= 0 && share <= 0.5))
    throw ConfigError("--allocator-headroom '" + text + "': give a share between 0 and 50%");
  return share;
}

c10::Device parse_device(DeviceKind kind, bool require_gpu) {
  if (kind == DeviceKind::Cpu) return c10::Device(c10::kCPU);
#ifndef DAWNPIPER_CUDA
  throw ConfigError("--device cuda: this build has no CUDA support (rebuild with a CUDA LibTorch); use --device cpu");
#else
  configure_cuda_allocator();
#endif
  if (require_gpu && !cuda_available())
    throw ConfigError("--device cuda: no GPU is visible on this machine; use --device cpu");
  return c10::Device(c10::kCUDA, 0);
}

}  // namespace dawnpiper
