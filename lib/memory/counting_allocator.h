#pragma once
// CountingAllocator: wraps LibTorch's CPU allocator to count live and peak bytes, and optionally
// enforces a capacity, so the CPU behaves like a device with a memory budget. Every CPU tensor
// allocation goes through it once installed (c10::SetCPUAllocator).
#include <atomic>
#include <cstdint>

#include <c10/core/Allocator.h>

#include "memory/torch_compat.h"
#include "util/units.h"

namespace dawnpiper {

class CountingAllocator final : public c10::Allocator {
 public:
  // Installs the process-wide instance on first call (idempotent) and returns it.
  static CountingAllocator& install();
  // The installed instance, or nullptr before install().
  static CountingAllocator* instance();

  c10::DataPtr allocate(size_t bytes) DP_ALLOCATOR_ALLOCATE_CONST override;
  c10::DeleterFnPtr raw_deleter() const override { return &CountingAllocator::release; }
#if DP_ALLOCATOR_HAS_COPY_DATA
  void copy_data(void* dest, const void* src, std::size_t count) const override;
#endif

  int64_t live_bytes() const { return live_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }
  int64_t allocations() const { return allocations_.load(); }
  // Resets the peak to the current live bytes (start of a measured region).
  void reset_peak() { peak_.store(live_.load()); }
  // 0 means unlimited. Allocations that would take live bytes above it throw OutOfMemoryError.
  void set_capacity(int64_t bytes) { capacity_.store(bytes); }
  int64_t capacity() const { return capacity_.load(); }

 private:
  CountingAllocator() = default;
  static void release(void* data);

  mutable std::atomic<int64_t> live_{0}, peak_{0}, allocations_{0};
  std::atomic<int64_t> capacity_{kUnlimitedBytes};
};

// Measures the peak over a scope: peak() is the high-water mark since construction, relative to
// nothing (absolute live bytes), and above_start() is that peak minus the live bytes at start.
class PeakScope {
 public:
  PeakScope();
  int64_t peak() const;
  int64_t above_start() const { return peak() - start_; }

 private:
  int64_t start_ = 0;
};

}  // namespace dawnpiper
