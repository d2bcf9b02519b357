// The fused LM head and loss (exec/cross_entropy): PyTorch's projection + cross-entropy,
// its loss and gradients, with a chunk's logits as its only large buffer.
#include "torch_test.h"

#include <torch/csrc/autograd/autograd.h>

#include <tuple>

#include "exec/cross_entropy.h"
#include "graph/op_graph.h"
#include "memory/counting_allocator.h"
#include "memory/device_memory.h"

using namespace dawnpiper;

namespace {

struct Case {
  at::Tensor hidden, weight, bias, labels;
};

// hidden [2, 9, 16], 37 classes, labels with ignored (-100) positions.
Case make_case(at::ScalarType dtype, bool with_bias) {
  at::manual_seed(5);
  Case c;
  c.hidden = at::randn({2, 9, 16}).to(dtype).requires_grad_(true);
  c.weight = at::randn({37, 16}).mul_(0.3).to(dtype).requires_grad_(true);
  if (with_bias) c.bias = at::randn({37}).to(dtype).requires_grad_(true);
  c.labels = at::randint(0, 37, {2, 9}, at::kLong);
  c.labels.index_put_({0, at::indexing::Slice(0, 4)}, -100);
  c.labels.index_put_({1, 8}, -100);
  return c;
}

std::vector<at::Tensor> grads_of(const at::Tensor& loss, const Case& c) {
  std::vector<at::Tensor> inputs{c.hidden, c.weight};
  if (c.bias.defined()) inputs.push_back(c.bias);
  return torch::autograd::grad({loss}, inputs);
}

}  // namespace

TEST_CASE("the fused LM loss gives a projection + cross-entropy's loss and gradients", "[exec]") {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (bool with_bias : {false, true})
      for (int64_t chunk : {1, 5, 18, 100}) {  // one position, uneven chunks, exact, all in one
        INFO("dtype " << c10::toString(dtype) << " bias " << with_bias << " chunk " << chunk);
        const Case c = make_case(dtype, with_bias);
        // the reference: logits in the activations' dtype, the loss in fp32 (as the zoo's loss)
        const at::Tensor logits = with_bias ? at::linear(c.hidden, c.weight, c.bias) : at::linear(c.hidden, c.weight);
        const at::Tensor reference =
            at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, 37}), c.labels.reshape({-1}));
        const at::Tensor fused = linear_cross_entropy(c.hidden, c.weight, c.bias, c.labels, chunk);
        CHECK(fused.dim() == 0);
        CHECK(fused.scalar_type() == at::kFloat);
        CHECK(fused.item<double>() == Approx(reference.item<double>()).epsilon(dtype == at::kFloat ? 1e-6 : 1e-3));
        const std::vector<at::Tensor> want = grads_of(reference, c), got = grads_of(fused, c);
        REQUIRE(got.size() == want.size());
        for (size_t i = 0; i < want.size(); ++i) {
          INFO("gradient " << i);
          CHECK(got[i].sizes() == want[i].sizes());
          CHECK(got[i].scalar_type() == want[i].scalar_type());
          const double scale = want[i].abs().max().item<double>();
          const double error = (got[i].to(at::kFloat) - want[i].to(at::kFloat)).abs().max().item<double>();
          CHECK(error <= (dtype == at::kFloat ? 1e-5 : 2e-2) * scale);
        }
      }
}

// No labelled position (a masked-LM micro-batch without a mask): the loss is NaN, as
// at::cross_entropy's, but the gradients are zeros, not 0 * inf, so the weights stay finite.
TEST_CASE("the fused LM loss ignores unlabelled positions and refuses an empty chunk", "[exec]") {
  Case c = make_case(at::kFloat, true);
  c.labels.fill_(-100);
  const at::Tensor loss = linear_cross_entropy(c.hidden, c.weight, c.bias, c.labels, 4);
  CHECK(std::isnan(loss.item<double>()));
  for (const at::Tensor& g : grads_of(loss, c)) CHECK(g.eq(0).all().item<bool>());
  CHECK_THROWS(linear_cross_entropy(c.hidden, c.weight, c.bias, c.labels, 0));
}

// bf16 activations with fp32 master weights, as the executor runs a bf16 graph: the weight's and
// bias's gradients come back fp32, summed over the chunks in fp32.
TEST_CASE("the fused LM loss sums fp32 weights' gradients in fp32 under bf16 activations", "[exec]") {
  const Case c = make_case(at::kFloat, true);
  const at::Tensor hidden = c.hidden.detach().to(at::kBFloat16).requires_grad_(true);
  const at::Tensor logits = at::linear(hidden, c.weight.to(at::kBFloat16), c.bias.to(at::kBFloat16));
  const at::Tensor reference = at::cross_entropy_loss(logits.to(at::kFloat).reshape({-1, 37}), c.labels.reshape({-1}));
  const at::Tensor fused = linear_cross_entropy(hidden, c.weight, c.bias, c.labels, 1);  // 18 chunks
  CHECK(fused.item<double>() == Approx(reference.item<double>()).epsilon(1e-3));
  const auto want = torch::autograd::grad({reference}, {hidden, c.weight, c.bias});
  const auto got = torch::autograd::grad({fused}, {hidden, c.weight, c.bias});
  for (size_t i = 0; i < 3; ++i) {
    INFO("gradient " << i);
    CHECK(got[i].scalar_type() == want[i].scalar_type());
    const double error = (got[i].to(at::kFloat) - want[i].to(at::kFloat)).abs().max().item<double>();
    CHECK(error <= 1e-2 * want[i].abs().max().item<double>());
  }
}

// What makes it worth having: forward and backward hold a chunk's logits, not all of them.
TEST_CASE("the fused LM loss holds one chunk of logits at a time", "[exec][memory]") {
  CountingAllocator::install();
  const at::Device cpu(at::kCPU);
  const int64_t positions = 512, classes = 2000, dim = 32, chunk = 64;
  at::manual_seed(1);
  const at::Tensor hidden = at::randn({positions, dim}).requires_grad_(true);
  const at::Tensor weight = at::randn({classes, dim}).mul_(0.1).requires_grad_(true);
  const at::Tensor labels = at::randint(0, classes, {positions}, at::kLong);
  auto extra_peak = [&](const std::function<at::Tensor()>& loss_of) {
    const int64_t live = DeviceMemory::live_bytes(cpu);
    DeviceMemory::reset_peak(cpu);
    {
      at::Tensor loss = loss_of();
      torch::autograd::grad({loss}, {hidden, weight});
    }
    return DeviceMemory::peak_bytes(cpu) - live;
  };
  const int64_t grads = (positions + classes) * dim * 4;
  const int64_t fused = extra_peak([&] { return linear_cross_entropy(hidden, weight, at::Tensor(), labels, chunk); });
  const int64_t whole = extra_peak([&] { return at::cross_entropy_loss(at::linear(hidden, weight), labels); });
  const int64_t logits = positions * classes * 4, chunk_logits = chunk * classes * 4;
  WARN("fused peak " << fused << ", projection + cross-entropy " << whole << ", logits " << logits);
  CHECK(whole > grads + 2 * logits);                     // logits and log-probabilities held
  CHECK(fused <= grads + 2 * chunk_logits + 64 * 1024);  // a chunk's logits, twice, and small things
}

// OpKind::CrossEntropy over given logits (exec/cross_entropy.h): at::cross_entropy's loss and
// the logits' gradient, whether it writes over the logits or not, fp32 and bf16.
TEST_CASE("the zoo's cross-entropy gives at::cross_entropy's loss and gradient", "[exec]") {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    for (bool overwrite : {false, true}) {
      INFO("dtype " << c10::toString(dtype) << " overwrite " << overwrite);
      const Case c = make_case(dtype, false);
      const at::Tensor values = at::linear(c.hidden, c.weight).detach();
      const at::Tensor reference_logits = values.clone().requires_grad_(true);
      const at::Tensor reference =
          at::cross_entropy_loss(reference_logits.to(at::kFloat).reshape({-1, 37}), c.labels.reshape({-1}));
      const at::Tensor logits = values.clone().requires_grad_(true);
      const at::Tensor loss = cross_entropy(logits, c.labels, overwrite);
      CHECK(loss.scalar_type() == at::kFloat);
      CHECK(loss.item<double>() == Approx(reference.item<double>()).epsilon(dtype == at::kFloat ? 1e-6 : 1e-3));
      // overwritten fp32 logits hold the log-probabilities; bf16 ones are widened into a copy
      CHECK(at::equal(logits, values) == (overwrite && dtype == at::kFloat ? false : true));
      const at::Tensor want = torch::autograd::grad({reference}, {reference_logits})[0];
      const at::Tensor got = torch::autograd::grad({loss}, {logits})[0];
      CHECK(got.sizes() == want.sizes());
      CHECK(got.scalar_type() == want.scalar_type());
      const double error = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
      CHECK(error <= (dtype == at::kFloat ? 1e-6 : 1e-2) * want.abs().max().item<double>());
    }
}

// What makes it worth having: writing over the logits, the forward adds one chunk of rows
// (graph/op_graph.h) to the logits, and the backward's gradient is the log-probabilities'
// buffer, the logits' own storage. at::cross_entropy holds two buffers of the logits' size in
// its forward and three in its backward.
TEST_CASE("the zoo's cross-entropy writes over its logits and their log-probabilities", "[exec][memory]") {
  CountingAllocator::install();
  const at::Device cpu(at::kCPU);
  const int64_t rows = 640, classes = 1000;
  const int64_t logits_bytes = rows * classes * 4, chunk_bytes = cross_entropy_chunk_rows(rows) * classes * 4;
  at::manual_seed(2);
  const at::Tensor labels = at::randint(0, classes, {rows}, at::kLong);
  auto peaks = [&](bool overwrite, bool ours) {
    at::Tensor logits = at::randn({rows, classes}).requires_grad_(true);
    const void* storage = logits.data_ptr();
    const int64_t live = DeviceMemory::live_bytes(cpu);
    DeviceMemory::reset_peak(cpu);
    at::Tensor loss = ours ? cross_entropy(logits, labels, overwrite) : at::cross_entropy_loss(logits, labels);
    const int64_t forward = DeviceMemory::peak_bytes(cpu) - live;
    DeviceMemory::reset_peak(cpu);
    const int64_t before_backward = DeviceMemory::live_bytes(cpu) - live;
    const at::Tensor grad = torch::autograd::grad({loss}, {logits})[0];
    const int64_t backward = DeviceMemory::peak_bytes(cpu) - live;
    if (ours && overwrite) CHECK(grad.data_ptr() == storage);
    return std::make_tuple(forward, before_backward, backward);
  };
  const auto [aten_fwd, aten_held, aten_bwd] = peaks(false, false);
  const auto [copy_fwd, copy_held, copy_bwd] = peaks(false, true);
  const auto [over_fwd, over_held, over_bwd] = peaks(true, true);
  WARN("logits " << logits_bytes << "; forward / held / backward peaks beyond the logits: at::cross_entropy "
                 << aten_fwd << " / " << aten_held << " / " << aten_bwd << ", ours " << copy_fwd << " / " << copy_held
                 << " / " << copy_bwd << ", writing over the logits " << over_fwd << " / " << over_held << " / "
                 << over_bwd);
  const int64_t small = 64 * 1024;
  CHECK(aten_bwd > 2 * logits_bytes);  // log-probabilities, nll's gradient, the logits' gradient
  CHECK(copy_fwd <= logits_bytes + small);
  CHECK(copy_bwd <= copy_held + small);  // the gradient is the saved buffer
  CHECK(over_fwd <= chunk_bytes + small);
  CHECK(over_held <= small);
  CHECK(over_bwd <= small);
}
