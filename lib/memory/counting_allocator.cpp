#include "memory/counting_allocator.h"

#include <cstring>
#include <mutex>

#include <c10/core/CPUAllocator.h>
#if __has_include(<c10/core/impl/alloc_cpu.h>)
#include <c10/core/impl/alloc_cpu.h>
#endif

#include "util/error.h"
#include "util/units.h"

namespace dawnpiper {

namespace {
CountingAllocator* g_instance = nullptr;

// Each allocation carries a header with its size, so freeing needs no lookup table and the
// DataPtr's context is its data pointer (LibTorch's raw_allocate requires that).
constexpr size_t kHeader = 64;  // keeps the 64-byte alignment alloc_cpu gives
}  // namespace

CountingAllocator& CountingAllocator::install() {
  static std::once_flag once;
  std::call_once(once, [] {
    g_instance = new CountingAllocator();  // lives forever: tensors may outlive main()
    // Highest priority, so later registrations of default allocators do not replace it.
    c10::SetCPUAllocator(g_instance, /*priority=*/100);
  });
  return *g_instance;
}

CountingAllocator* CountingAllocator::instance() { return g_instance; }

c10::DataPtr CountingAllocator::allocate(size_t bytes) DP_ALLOCATOR_ALLOCATE_CONST {
  const int64_t n = static_cast<int64_t>(bytes);
  const int64_t live = live_.fetch_add(n) + n;
  const int64_t cap = capacity_.load();
  if (live > cap) {
    live_.fetch_sub(n);
    throw OutOfMemoryError("cannot allocate " + format_bytes(n) + ": " + format_bytes(live - n) + " of the " +
                           format_bytes(cap) +
                           " device memory (--device-memory) are in use; raise --device-memory, "
                           "lower --micro-batch-size, or plan more stages or memory optimization");
  }
  int64_t peak = peak_.load();
  while (live > peak && !peak_.compare_exchange_weak(peak, live)) {
  }
  allocations_.fetch_add(1);
  auto* base = static_cast<char*>(c10::alloc_cpu(bytes + kHeader));
  *reinterpret_cast<size_t*>(base) = bytes;
  void* data = base + kHeader;
  return {data, data, &CountingAllocator::release, c10::Device(c10::DeviceType::CPU)};
}

void CountingAllocator::release(void* data) {
  char* base = static_cast<char*>(data) - kHeader;
  g_instance->live_.fetch_sub(static_cast<int64_t>(*reinterpret_cast<size_t*>(base)));
  c10::free_cpu(base);
}

#if DP_ALLOCATOR_HAS_COPY_DATA
void CountingAllocator::copy_data(void* dest, const void* src, std::size_t count) const {
  std::memcpy(dest, src, count);
}
#endif

PeakScope::PeakScope() {
  CountingAllocator& a = CountingAllocator::install();
  a.reset_peak();
  start_ = a.live_bytes();
}

int64_t PeakScope::peak() const { return CountingAllocator::install().peak_bytes(); }

}  // namespace dawnpiper
