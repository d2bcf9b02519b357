#pragma once
// Optimizers over a stage's parameters, with PyTorch's semantics (torch.optim.SGD with momentum,
// torch.optim.Adam), written with ATen ops so every stage of a pipeline applies exactly the
// update the reference trainer applies to the same parameter.
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "train/optimizer_kind.h"

namespace dawnpiper {

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::Sgd;
  double lr = 0.01;
  double momentum = 0.9;                          // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update from each parameter's .grad() (undefined grads are skipped), then zeroes
  // the gradients.
  virtual void step() = 0;
  // Optimizer state tensors (momentum buffers, Adam moments), for checkpoints and accounting.
  virtual std::vector<at::Tensor> state() const = 0;
  // Updates applied so far (Adam's bias correction needs it).
  int64_t steps() const { return steps_; }
  // Restores what state() and steps() returned (checkpoints); undefined tensors stay unset.
  virtual void restore(const std::vector<at::Tensor>& state, int64_t steps) = 0;
  const std::vector<at::Tensor>& params() const { return params_; }

 protected:
  explicit Optimizer(std::vector<at::Tensor> params) : params_(std::move(params)) {}
  std::vector<at::Tensor> params_;
  int64_t steps_ = 0;
};

// Throws ConfigError for a non-positive learning rate.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, std::vector<at::Tensor> params);

}  // namespace dawnpiper
