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
  Sgd(std::vector<at::Tensor> params, double lr, double momentum)
      : Optimizer(std::move(params)), lr_(lr), momentum_(momentum), buffers_(params_.size()) {}

  void step() override {
    at::NoGradGuard no_grad;
    ++steps_;
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i];
      if (!p.grad().defined()) continue;
      at::Tensor d = p.grad();
      if (momentum_ != 0) {
        if (!buffers_[i].defined())
          buffers_[i] = d.clone();
        else
          buffers_[i].mul_(momentum_).add_(d);
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
  double lr_, momentum_;
  std::vector<at::Tensor> buffers_;
};

class Adam final : public Optimizer {
 public:
  Adam(std::vector<at::Tensor> params, const OptimizerConfig& c)
      : Optimizer(std::move(params)), c_(c), m_(params_.size()), v_(params_.size()) {}

  void step() override {
    at::NoGradGuard no_grad;
    ++steps_;
    const double bc1 = 1 - std::pow(c_.beta1, steps_), bc2 = 1 - std::pow(c_.beta2, steps_);
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& p = params_[i];
      if (!p.grad().defined()) continue;
      const at::Tensor& g = p.grad();
      if (!m_[i].defined()) {
        m_[i] = at::zeros_like(p);
        v_[i] = at::zeros_like(p);
      }
      m_[i].mul_(c_.beta1).add_(g, 1 - c_.beta1);
      v_[i].mul_(c_.beta2).addcmul_(g, g, 1 - c_.beta2);
      // One temporary the size of the parameter (the memory replay accounts for it).
      at::Tensor denom = v_[i].sqrt();
      denom.div_(std::sqrt(bc2)).add_(c_.eps);
      p.addcdiv_(m_[i], denom, -c_.lr / bc1);
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
  OptimizerConfig c_;
  std::vector<at::Tensor> m_, v_;
};

}  // namespace

std::unique_ptr<Optimizer> make_optimizer(const OptimizerConfig& config, std::vector<at::Tensor> params) {
  if (!(config.lr > 0)) throw ConfigError("learning rate must be positive");
  if (config.kind == OptimizerKind::Adam) return std::make_unique<Adam>(std::move(params), config);
  return std::make_unique<Sgd>(std::move(params), config.lr, config.momentum);
}

}  // namespace dawnpiper
