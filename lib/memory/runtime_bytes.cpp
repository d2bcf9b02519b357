#include "memory/runtime_bytes.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <tuple>

#include "memory/device_memory.h"

namespace dawnpiper {

namespace {
// One forward and backward of each kind of product in `type`; every tensor dies on return.
void run_products(c10::Device device, at::ScalarType type, bool convolutions) {
  at::AutoGradMode grad(true);
  const at::TensorOptions options = at::TensorOptions(type).device(device);
  at::Tensor x = at::rand({64, 256}, options).requires_grad_(true);
  at::Tensor w = at::rand({256, 256}, options).requires_grad_(true);
  at::Tensor b = at::rand({256}, options).requires_grad_(true);
  at::Tensor h = at::linear(x, w, b);  // addmm (cuBLASLt with a bias)
  h = at::linear(h, w);                // mm
  at::Tensor q = h.view({4, 16, 256});
  at::Tensor s = at::matmul(q, q.transpose(1, 2));  // bmm
  at::Tensor loss = s.to(at::kFloat).sum();
  if (convolutions) {
    at::Tensor image = at::rand({2, 8, 16, 16}, options).requires_grad_(true);
    at::Tensor kernel = at::rand({8, 8, 3, 3}, options).requires_grad_(true);
    loss = loss + at::conv2d(image, kernel, {}, 1, 1).to(at::kFloat).sum();
  }
  loss.backward();
}
}  // namespace

int64_t measure_runtime_bytes(c10::Device device, Precision precision, bool convolutions) {
  if (!device.is_cuda()) return 0;
  static std::mutex mutex;
  static std::map<std::tuple<int, Precision, bool>, int64_t> measured;  // the first measurement stands
  std::lock_guard<std::mutex> lock(mutex);
  const auto key = std::make_tuple(static_cast<int>(device.index()), precision, convolutions);
  if (auto it = measured.find(key); it != measured.end()) return it->second;
  synchronize(device);
  const int64_t before = DeviceMemory::live_bytes(device);
  run_products(device, at::kFloat, convolutions);
  if (precision == Precision::Bf16) run_products(device, at::kBFloat16, convolutions);
  synchronize(device);
  const int64_t bytes = std::max<int64_t>(0, DeviceMemory::live_bytes(device) - before);
  measured[key] = bytes;
  return bytes;
}

}  // namespace dawnpiper
