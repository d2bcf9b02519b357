#include "exec/device_random.h"

#include <ATen/CPUGeneratorImpl.h>

#include <mutex>

#ifdef DAWNPIPER_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include "util/error.h"

namespace dawnpiper {

at::Generator seeded_generator(c10::Device device, uint64_t seed) {
  if (device.is_cpu()) return at::detail::createCPUGenerator(seed);
#ifdef DAWNPIPER_CUDA
  if (device.is_cuda()) {
    at::Generator gen = at::cuda::detail::createCUDAGenerator(device.index());
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_current_seed(seed);
    return gen;
  }
#endif
  throw ConfigError("no random number generator for device " + device.str());
}

}  // namespace dawnpiper
