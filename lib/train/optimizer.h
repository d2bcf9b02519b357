#pragma once
// Optimizers over a stage's parameters, with PyTorch's semantics (torch.optim.SGD with momentum,
// torch.optim.Adam, torch.optim.AdamW), written with ATen ops so every stage of a pipeline applies
// exactly the update the reference trainer applies to the same parameter. Weight decay applies to
// parameters of two or more dimensions (matrices, embeddings, convolution kernels), not to biases
// and normalization scales, as transformers' Trainer and nanoGPT group them.
#include <memory>
#include <string>
#include <vector>

#include <ATen/ATen.h>

#include "train/lr_schedule.h"
#include "train/optimizer_kind.h"

namespace dawnpiper {

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::Sgd;
  double lr = 0.01;                               // peak rate: the schedule's
  double momentum = 0.9;                          // sgd
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw
  double weight_decay = 0;                        // sgd, adam: L2 added to the gradient; adamw: decoupled
  LrSchedule schedule;
  double grad_clip = 0;  // clip the global gradient norm to this before each update; 0: never
};

// Whether weight decay applies to a parameter of this many dimensions.
inline bool decays(int64_t dims) { return dims >= 2; }

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  // Applies one update from each parameter's .grad() (undefined grads are skipped), then zeroes
  // the gradients.
  virtual void step() = 0;
  // The rate the next step() uses (the schedule's for that step).
  void set_lr(double lr) { lr_ = lr; }
  double lr() const { return lr_; }
  // Optimizer state tensors (momentum buffers, Adam moments), for checkpoints and accounting.
  virtual std::vector<at::Tensor> state() const = 0;
  // Updates applied so far (Adam's bias correction needs it).
  int64_t steps() const { return steps_; }
  // Restores what state() and steps() returned (checkpoints); undefined tensors stay unset.
  virtual void restore(const std::vector<at::Tensor>& state, int64_t steps) = 0;
  const std::vector<at::Tensor>& params() const { return params_; }

 protected:
  Optimizer(std::vector<at::Tensor> params, const OptimizerConfig& config)
      : params_(std::move(params)), config_(config), lr_(config.lr) {}
  std::vector<at::Tensor> params_;
  OptimizerConfig config_;
  double lr_;
  int64_t steps_ = 0;
};

// Throws ConfigError for a non-positive learning rate, negative decay, a bad schedule.
std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, std::vector<at::Tensor> params);

}  // namespace dawnpiper
