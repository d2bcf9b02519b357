// The executor's lean ops (exec/lean_ops): the softmax gives at::softmax's values and
// gradients, with its input's gradient written over its output's where nothing else holds
// that one; the RMSNorm gives the composition's and keeps its input and a factor per row.
#include "torch_test.h"

#include <functional>

#include <torch/csrc/autograd/autograd.h>

#include "exec/lean_ops.h"
#include "memory/counting_allocator.h"
#include "memory/device_memory.h"

using namespace dawnpiper;

namespace {

using Softmax = std::function<at::Tensor(const at::Tensor&)>;
const Softmax ours = [](const at::Tensor& x) { return softmax_last_dim(x); };
const Softmax aten = [](const at::Tensor& x) { return at::softmax(x, -1); };

// The loss and x's gradient through `softmax` followed by `after` (a product with fresh
// gradients, or a matmul, whose backward hands on a reshaped view).
std::pair<at::Tensor, at::Tensor> run(const Softmax& softmax, const at::Tensor& x0,
                                      const std::function<at::Tensor(const at::Tensor&)>& after) {
  at::Tensor x = x0.detach().clone().requires_grad_(true);
  at::Tensor loss = after(softmax(x)).to(at::kFloat).sum();
  loss.backward();
  return {loss.detach(), x.grad()};
}

}  // namespace

TEST_CASE("the executor's softmax gives at::softmax's values and gradients", "[exec]") {
  at::manual_seed(3);
  const at::Tensor w = at::randn({2, 3, 8, 8});
  const at::Tensor v = at::randn({2, 3, 8, 5});
  const std::vector<std::function<at::Tensor(const at::Tensor&)>> afters{
      [&](const at::Tensor& y) { return y * w.to(y.scalar_type()); },
      [&](const at::Tensor& y) { return at::matmul(y, v.to(y.scalar_type())).square(); }};
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (size_t a = 0; a < afters.size(); ++a) {
      INFO("dtype " << dtype << " after " << a);
      const at::Tensor x = at::randn({2, 3, 8, 8}).mul_(3).to(dtype);
      auto [loss, grad] = run(ours, x, afters[a]);
      auto [want_loss, want_grad] = run(aten, x, afters[a]);
      const double tol = dtype == at::kFloat ? 1e-5 : 2e-2;
      CHECK(at::allclose(loss, want_loss, tol, tol));
      CHECK(at::allclose(grad.to(at::kFloat), want_grad.to(at::kFloat), tol, tol));
    }
}

TEST_CASE("the executor's softmax leaves a gradient someone else holds unchanged", "[exec]") {
  at::manual_seed(4);
  at::Tensor x = at::randn({4, 6}).requires_grad_(true);
  const at::Tensor y = softmax_last_dim(x);
  const at::Tensor g = at::randn({4, 6});
  const at::Tensor kept = g.clone();
  torch::autograd::backward({y}, {g});
  CHECK(at::equal(g, kept));
  const at::Tensor p = at::softmax(x.detach(), -1);
  CHECK(at::allclose(x.grad(), p * (g - (g * p).sum(-1, true)), 1e-6, 1e-6));
}

TEST_CASE("the executor's softmax writes its input's gradient over its output's", "[exec]") {
  at::set_num_threads(1);
  CountingAllocator::install();
  at::manual_seed(5);
  const at::Tensor x0 = at::randn({8, 4, 64, 64});
  const int64_t bytes = x0.numel() * 4;
  // What the backward allocates: the product's gradient (fresh), then the softmax's.
  auto backward_peak = [&](const Softmax& softmax) {
    at::Tensor x = x0.clone().requires_grad_(true);
    at::Tensor loss = (softmax(x) * 2).sum();
    PeakScope scope;
    loss.backward();
    return scope.above_start();
  };
  const int64_t in_place = backward_peak(ours), allocating = backward_peak(aten);
  WARN("backward peak: ours " << in_place << ", at::softmax " << allocating << ", one gradient " << bytes);
  CHECK(allocating >= 2 * bytes);
#ifdef DAWNPIPER_IN_PLACE_GRADIENTS
  CHECK(in_place < bytes + bytes / 16);  // the product's gradient and fp32 row sums
#else
  WARN("this LibTorch hands custom functions a copy of the gradient: not overwritten");
  CHECK(in_place >= 2 * bytes);
#endif
}

namespace {

// The composition the executor ran before: autograd keeps the normalized x as well.
at::Tensor composed_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  return x * at::rsqrt(x.pow(2).mean(-1, true) + eps) * weight.to(x.scalar_type());
}

}  // namespace

TEST_CASE("the executor's RMSNorm gives the composition's values and gradients", "[exec]") {
  at::manual_seed(6);
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    INFO("dtype " << dtype);
    const at::Tensor x0 = at::randn({3, 5, 16}).mul_(2).to(dtype);
    const at::Tensor w0 = at::randn({16});
    const at::Tensor g = at::randn({3, 5, 16}).to(dtype);
    auto run = [&](bool ours) {
      at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
      const at::Tensor y = ours ? rms_norm(x, w, 1e-6) : composed_rms_norm(x, w, 1e-6);
      torch::autograd::backward({y}, {g});
      return std::vector<at::Tensor>{y.detach().to(at::kFloat), x.grad().to(at::kFloat), w.grad()};
    };
    const std::vector<at::Tensor> got = run(true), want = run(false);
    const double tol = dtype == at::kFloat ? 1e-5 : 3e-2;
    for (size_t i = 0; i < got.size(); ++i) {
      INFO("output " << i);
      CHECK(got[i].scalar_type() == want[i].scalar_type());
      CHECK(at::allclose(got[i], want[i], tol, tol));
    }
  }
}

TEST_CASE("the executor's RMSNorm keeps its input and a factor per row", "[exec]") {
  at::set_num_threads(1);
  CountingAllocator::install();
  at::manual_seed(7);
  const at::Tensor x0 = at::randn({8, 64, 256});
  const at::Tensor w0 = at::randn({256});
  const int64_t bytes = x0.numel() * 4, rows = x0.numel() / 256;
  // Bytes the forward leaves allocated beyond its output (what autograd keeps besides x).
  auto kept = [&](bool ours) {
    at::Tensor x = x0.clone().requires_grad_(true), w = w0.clone().requires_grad_(true);
    const int64_t before = DeviceMemory::live_bytes(c10::Device(c10::kCPU));
    at::Tensor y = ours ? rms_norm(x, w, 1e-6) : composed_rms_norm(x, w, 1e-6);
    return DeviceMemory::live_bytes(c10::Device(c10::kCPU)) - before - bytes;
  };
  const int64_t ours = kept(true), composed = kept(false);
  WARN("kept beyond the output: ours " << ours << ", composed " << composed << ", one activation " << bytes);
  CHECK(ours == rows * 4);
  CHECK(composed >= bytes);
}
