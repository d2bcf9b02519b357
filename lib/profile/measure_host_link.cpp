#include "profile/measure_host_link.h"

#include <algorithm>
#include <map>
#include <mutex>

#ifdef DAWNPIPER_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dawnpiper {

#ifdef DAWNPIPER_CUDA
namespace {
constexpr int kRepeats = 3;

// Best seconds of `copies` (issued on `streams`) over kRepeats, from an event on the first stream
// before all of them to the last stream's end.
template <class Copies>
double best_seconds(const std::vector<c10::cuda::CUDAStream>& streams, Copies&& copies) {
  double best = 1e30;
  for (int r = 0; r < kRepeats; ++r) {
    for (const auto& s : streams) s.synchronize();
    at::cuda::CUDAEvent start(cudaEventDefault);
    start.record(streams.front());
    for (size_t i = 1; i < streams.size(); ++i) start.block(streams[i]);
    copies();
    std::vector<at::cuda::CUDAEvent> ends;
    ends.reserve(streams.size());
    double ms = 0;
    for (const auto& s : streams) {
      ends.emplace_back(cudaEventDefault);
      ends.back().record(s);
    }
    for (auto& end : ends) {
      end.synchronize();
      ms = std::max(ms, static_cast<double>(start.elapsed_time(end)));
    }
    best = std::min(best, ms / 1e3);
  }
  return best;
}

HostLink measure(c10::Device device) {
  HostLink link;
  const c10::cuda::CUDAStream out = c10::cuda::getStreamFromPool(false, device.index());
  const c10::cuda::CUDAStream in = c10::cuda::getStreamFromPool(false, device.index());
  for (int64_t bytes = int64_t{256} << 10; bytes <= int64_t{64} << 20; bytes *= 4) {
    const size_t n = static_cast<size_t>(bytes);
    c10::DataPtr from_device = c10::cuda::CUDACachingAllocator::get()->allocate(n);
    c10::DataPtr to_device = c10::cuda::CUDACachingAllocator::get()->allocate(n);
    c10::DataPtr host_out = at::getHostAllocator(at::kCUDA)->allocate(n);
    c10::DataPtr host_in = at::getHostAllocator(at::kCUDA)->allocate(n);
    auto copy_out = [&] {
      C10_CUDA_CHECK(cudaMemcpyAsync(host_out.get(), from_device.get(), n, cudaMemcpyDeviceToHost, out.stream()));
    };
    auto copy_in = [&] {
      C10_CUDA_CHECK(cudaMemcpyAsync(to_device.get(), host_in.get(), n, cudaMemcpyHostToDevice, in.stream()));
    };
    best_seconds({out}, copy_out);  // warm-up: first touches of the pinned pages
    LinkSample s;
    s.bytes = bytes;
    s.to_host = static_cast<double>(bytes) / best_seconds({out}, copy_out);
    s.to_device = static_cast<double>(bytes) / best_seconds({in}, copy_in);
    s.both = 2.0 * static_cast<double>(bytes) / best_seconds({out, in}, [&] { copy_out(), copy_in(); });
    link.samples.push_back(s);
    out.synchronize();
    in.synchronize();
  }
  return link;
}
}  // namespace
#endif

HostLink measure_host_link(c10::Device device) {
#ifdef DAWNPIPER_CUDA
  if (!device.is_cuda()) return {};
  static std::mutex mutex;
  static std::map<int, HostLink> measured;
  std::lock_guard<std::mutex> lock(mutex);
  auto [it, fresh] = measured.try_emplace(device.index());
  if (fresh) it->second = measure(device);
  return it->second;
#else
  (void)device;
  return {};
#endif
}

}  // namespace dawnpiper
