// The counting CPU allocator: live/peak bytes of a hand-computed allocation sequence, capacity;
// the allocator headroom a plan leaves.
#include "torch_test.h"

#include "memory/counting_allocator.h"
#include "memory/device_memory.h"
#include "util/error.h"

using namespace dawnpiper;

TEST_CASE("peak matches a hand-computed allocation sequence", "[memory]") {
  CountingAllocator& a = CountingAllocator::install();
  a.set_capacity(kUnlimitedBytes);
  const int64_t base = a.live_bytes();
  a.reset_peak();
  {
    at::Tensor x = at::empty({1000}, at::kFloat);  // 4000 B
    CHECK(a.live_bytes() - base == 4000);
    at::Tensor y = at::empty({500}, at::kDouble);  // 4000 B -> 8000 live
    {
      at::Tensor z = at::empty({250}, at::kLong);  // 2000 B -> 10000 live (the peak)
    }
    CHECK(a.live_bytes() - base == 8000);
    y.reset();
    at::Tensor w = at::empty({100}, at::kFloat);  // 400 B -> 4400 live
    CHECK(a.live_bytes() - base == 4400);
  }
  CHECK(a.live_bytes() == base);
  CHECK(a.peak_bytes() - base == 10000);
  a.reset_peak();
  CHECK(a.peak_bytes() == a.live_bytes());
}

TEST_CASE("allocations beyond the capacity raise the project's out-of-memory error", "[memory]") {
  CountingAllocator& a = CountingAllocator::install();
  const int64_t base = a.live_bytes();
  a.set_capacity(base + (1 << 20));                  // 1 MiB of headroom
  at::Tensor ok = at::empty({1 << 17}, at::kFloat);  // 512 KiB fits
  try {
    at::Tensor too_big = at::empty({1 << 18}, at::kFloat);  // 1 MiB more does not
    FAIL("allocation should have been refused");
  } catch (const OutOfMemoryError& e) {
    std::string what = e.what();
    CHECK(what.find("cannot allocate 1.00 MiB") != std::string::npos);
    CHECK(what.find("--device-memory") != std::string::npos);
  }
  CHECK(a.live_bytes() == base + (1 << 19));  // the refused request left no trace
  a.set_capacity(kUnlimitedBytes);
}

TEST_CASE("the allocator headroom is a share of the device memory", "[memory]") {
  CHECK(parse_allocator_headroom("5%") == Approx(0.05));
  CHECK(parse_allocator_headroom("0.1") == Approx(0.1));
  CHECK(parse_allocator_headroom("0") == 0);
  CHECK_THROWS_WITH(parse_allocator_headroom("five"), Catch::Contains("give a share of the memory, e.g. 5% or 0.05"));
  CHECK_THROWS_WITH(parse_allocator_headroom("5 %"), Catch::Contains("give a share of the memory"));
  CHECK_THROWS_WITH(parse_allocator_headroom("60%"), Catch::Contains("between 0 and 50%"));
  CHECK_THROWS_WITH(parse_allocator_headroom("-1%"), Catch::Contains("between 0 and 50%"));
  // The CPU's counting allocator keeps nothing back; CUDA's caching allocator does.
  CHECK(default_allocator_headroom("cpu") == 0);
  CHECK(default_allocator_headroom("") == 0);
  CHECK(default_allocator_headroom("cuda:0") > 0);
  // On the CPU the most held is the allocated peak.
  CountingAllocator::install();
  CHECK(DeviceMemory::reserved_peak_bytes(c10::Device(c10::kCPU)) == DeviceMemory::peak_bytes(c10::Device(c10::kCPU)));
}
