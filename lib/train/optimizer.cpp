#include "train/optimizer.h"

#include <ATen/core/grad_mode.h>

#include <cmath>

#include "util/error.h"

namespace dawnpiper {

namespace {

void zero_grad(at::Tensor& p) {
  if (p.grad().defined()) p.mutable_grad() = at::Tensor();
}

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<at::Tensor> params, const OptimizerConfig& c)
      : Optimizer(std::move(params), c), buffers_(params_.size()) {}

  void step() override {
    at::NoGradGuard no_grad;
    ++steps_;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i];
      if (!p.grad().defined()) continue;
      at::Tensor d = p.grad();
      // In place: the gradient is the optimizer's to spend (torch adds into a new tensor).
      if (const double wd = weight_decay(i); wd != 0) d.add_(p, wd);
      if (config_.momentum != 0) {
        if (!buffers_[i].defined())
          buffers_[i] = d.clone();
        else
          buffers_[i].mul_(config_.momentum).add_(d);
        d = buffers_[i];
      }
      p.add_(d, -lr_);
      zero_grad(p);
    }
  }
  std::vector<at::Tensor> state() const override { return buffers_; }
  void restore(const std::vector<at::Tensor>& state, int64_t steps) override {
    buffers_ = state;
    buffers_.resize(params_.size());
    steps_ = steps;
  }

 private:
  std::vector<at::Tensor> buffers_;
};

// Adam, and AdamW where the decay is decoupled from the gradient.
class Adam final : public Optimizer {
 public:
  Adam(std::vector<at::Tensor> params, const OptimizerConfig& c)
      : Optimizer(std::move(params), c), m_(params_.size()), v_(params_.size()) {}

  void step() override {
    at::NoGradGuard no_grad;
    ++steps_;
    const OptimizerConfig& c = config_;
    const double bc1 = 1 - std::pow(c.beta1, steps_), bc2 = 1 - std::pow(c.beta2, steps_);
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i];
      if (!p.grad().defined()) continue;
      at::Tensor g = p.grad();
      if (const double wd = weight_decay(i); wd != 0) {
        if (c.kind == OptimizerKind::AdamW)
          p.mul_(1 - lr_ * wd);
        else
          g.add_(p, wd);
      }
      if (!m_[i].defined()) {
        m_[i] = at::zeros_like(p);
        v_[i] = at::zeros_like(p);
      }
      m_[i].mul_(c.beta1).add_(g, 1 - c.beta1);
      v_[i].mul_(c.beta2).addcmul_(g, g, 1 - c.beta2);
      // One temporary the size of the parameter (the memory replay accounts for it).
      at::Tensor denom = v_[i].sqrt();
      denom.div_(std::sqrt(bc2)).add_(c.eps);
      p.addcdiv_(m_[i], denom, -lr_ / bc1);
      zero_grad(p);
    }
  }
  std::vector<at::Tensor> state() const override {
    std::vector<at::Tensor> s = m_;
    s.insert(s.end(), v_.begin(), v_.end());
    return s;
  }
  void restore(const std::vector<at::Tensor>& state, int64_t steps) override {
    for (size_t i = 0; i < params_.size(); ++i) {
      m_[i] = i < state.size() ? state[i] : at::Tensor();
      v_[i] = params_.size() + i < state.size() ? state[params_.size() + i] : at::Tensor();
    }
    steps_ = steps;
  }

 private:
  std::vector<at::Tensor> m_, v_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, std::vector<at::Tensor> params) {
  if (!(config.lr > 0)) throw ConfigError("learning rate must be positive");
  if (config.weight_decay < 0) throw ConfigError("--weight-decay must not be negative");
  if (config.grad_clip < 0) throw ConfigError("--grad-clip must not be negative (0: no clipping)");
  check_lr_schedule(config.lr, config.schedule);
  if (config.kind == OptimizerKind::Sgd) return std::make_unique<Sgd>(std::move(params), config);
  return std::make_unique<Adam>(std::move(params), config);
}

}  // namespace dawnpiper
