#include "runtime/swap_copier.h"

#include <c10/core/CPUAllocator.h>

#include <cstdlib>
#include <cstring>

#include "util/error.h"

#ifdef DAWNPIPER_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CachingHostAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace dawnpiper {

#ifdef DAWNPIPER_CUDA
struct SwapCopier::Cuda {
  explicit Cuda(c10::Device device) : side(c10::cuda::getStreamFromPool(false, device.index())) {}
  c10::cuda::CUDAStream side;
};
#else
struct SwapCopier::Cuda {};
#endif

SwapCopier::SwapCopier(c10::Device device) : device_(device) {
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) cuda_ = std::make_unique<Cuda>(device);
#endif
  if (!device.is_cpu() && !cuda_) throw ConfigError("swapping needs a CPU or CUDA device, not " + device.str());
}

SwapCopier::~SwapCopier() = default;

c10::DataPtr SwapCopier::copy_out(c10::DataPtr device_data, int64_t bytes) {
  const size_t n = static_cast<size_t>(bytes);
#ifdef DAWNPIPER_CUDA
  if (cuda_) {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    c10::DataPtr host = at::getHostAllocator(at::kCUDA)->allocate(n);
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(cuda_->side);
    C10_CUDA_CHECK(cudaMemcpyAsync(host.get(), device_data.get(), n, cudaMemcpyDeviceToHost, cuda_->side.stream()));
    // Freed when device_data goes out of scope; the allocator waits for the side stream.
    c10::cuda::CUDACachingAllocator::recordStream(device_data, cuda_->side);
    return host;
  }
#endif
  void* host = std::malloc(n);
  if (!host) throw OutOfMemoryError("host memory for swapping " + std::to_string(bytes) + " bytes");
  std::memcpy(host, device_data.get(), n);
  return c10::DataPtr(host, host, &std::free, c10::Device(c10::kCPU));
}

SwapCopier::Incoming SwapCopier::copy_in(c10::DataPtr host, int64_t bytes) {
  const size_t n = static_cast<size_t>(bytes);
  Incoming in;
#ifdef DAWNPIPER_CUDA
  if (cuda_) {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    in.data = c10::cuda::CUDACachingAllocator::get()->allocate(n);  // from the compute stream's pool
    at::cuda::CUDAEvent ready;
    ready.record(compute);
    ready.block(cuda_->side);
    C10_CUDA_CHECK(cudaMemcpyAsync(in.data.get(), host.get(), n, cudaMemcpyHostToDevice, cuda_->side.stream()));
    // The pinned block is reused, and the device block freed early, only after the copy.
    at::getHostAllocator(at::kCUDA)->record_event(host.get(), host.get_context(), cuda_->side.unwrap());
    c10::cuda::CUDACachingAllocator::recordStream(in.data, cuda_->side);
    auto done = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);  // timed: waits() reads it
    done->record(cuda_->side);
    in.done = done;
    return in;
  }
#endif
  in.data = c10::GetCPUAllocator()->allocate(n);
  std::memcpy(in.data.get(), host.get(), n);
  return in;
}

void SwapCopier::wait(const Incoming& incoming) {
#ifdef DAWNPIPER_CUDA
  if (cuda_ && incoming.done) {
    const c10::cuda::CUDAStream compute = c10::cuda::getCurrentCUDAStream(device_.index());
    auto arrived = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);
    arrived->record(compute);
    static_cast<at::cuda::CUDAEvent*>(incoming.done.get())->block(compute);
    meetings_.emplace_back(incoming.done, std::move(arrived));
  }
#else
  (void)incoming;
#endif
}

SwapCopier::Waits SwapCopier::waits() const {
  Waits w;
#ifdef DAWNPIPER_CUDA
  for (const auto& [done, arrived] : meetings_) {
    auto* end = static_cast<at::cuda::CUDAEvent*>(done.get());
    auto* reached = static_cast<at::cuda::CUDAEvent*>(arrived.get());
    end->synchronize();
    reached->synchronize();
    const double late_ms = reached->elapsed_time(*end);  // > 0: the copy ended after the stream got there
    ++w.copies;
    if (late_ms > 0) ++w.waited, w.stall_ms += late_ms;
  }
#endif
  return w;
}

}  // namespace dawnpiper
