#include "train/optimizer.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace dawnpiper {

namespace {

// The parameters that have a gradient this step, their gradients, and the subsets that decay.
// Updates go through ATen's multi-tensor (_foreach_) ops: a handful of kernels per step for the
// whole stage instead of a few per parameter; each element gets the arithmetic of the
// per-tensor ops, in the same order.
struct StepLists {
  std::vector<size_t> index;
  std::vector<at::Tensor> params, grads, decayed_params, decayed_grads;
};

StepLists step_lists(const std::vector<at::Tensor>& params, double weight_decay) {
  StepLists l;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined()) continue;
    l.index.push_back(i);
    l.params.push_back(params[i]);
    l.grads.push_back(g);
    if (weight_decay != 0 && decays(params[i].dim())) {
      l.decayed_params.push_back(params[i]);
      l.decayed_grads.push_back(g);
    }
  }
  return l;
}

void zero_grads(const StepLists& l) {
  for (const at::Tensor& p : l.params) p.mutable_grad() = at::Tensor();  // the handle is const, the gradient not
}

class Sgd final : public Optimizer {
 public:
  Sgd(std::vector<at::Tensor> params, const OptimizerConfig& c)
      : Optimizer(std::move(params), c), buffers_(params_.size()) {}

  void step() override {
    at::NoGradGuard no_grad;
    ++steps_;
    const StepLists l = step_lists(params_, config_.weight_decay);
    if (l.params.empty()) return;
    // In place: the gradient is the optimizer's to spend (torch adds into a new tensor).
    if (!l.decayed_grads.empty()) at::_foreach_add_(l.decayed_grads, l.decayed_params, config_.weight_decay);
    std::vector<at::Tensor> directions = l.grads;
    if (config_.momentum != 0) {
      std::vector<at::Tensor> buffers, grads;
      for (size_t k = 0; k < l.index.size(); ++k) {
        at::Tensor& b = buffers_[l.index[k]];
        if (!b.defined()) {
          b = l.grads[k].clone();
        } else {
          buffers.push_back(b);
          grads.push_back(l.grads[k]);
        }
        directions[k] = b;
      }
      if (!buffers.empty()) {
        at::_foreach_mul_(buffers, config_.momentum);
        at::_foreach_add_(buffers, grads);
      }
    }
    at::_foreach_add_(l.params, directions, -lr_);
    zero_grads(l);
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
    const StepLists l = step_lists(params_, config_.weight_decay);
    if (l.params.empty()) return;
    if (!l.decayed_params.empty()) {
      if (c.kind == OptimizerKind::AdamW)
        at::_foreach_mul_(l.decayed_params, 1 - lr_ * c.weight_decay);
      else
        at::_foreach_add_(l.decayed_grads, l.decayed_params, c.weight_decay);
    }
    std::vector<at::Tensor> m, v;
    for (size_t i : l.index) {
      if (!m_[i].defined()) {
        m_[i] = at::zeros_like(params_[i]);
        v_[i] = at::zeros_like(params_[i]);
      }
      m.push_back(m_[i]);
      v.push_back(v_[i]);
    }
    at::_foreach_mul_(m, c.beta1);
    at::_foreach_add_(m, l.grads, 1 - c.beta1);
    at::_foreach_mul_(v, c.beta2);
    at::_foreach_addcmul_(v, l.grads, l.grads, 1 - c.beta2);
    // The denominators are temporaries: made a group at a time, each group no larger than the
    // largest parameter, so the step never holds more than one parameter's size of them (what
    // the memory replay accounts for).
    int64_t largest = 0;
    for (const at::Tensor& p : l.params) largest = std::max(largest, static_cast<int64_t>(p.nbytes()));
    for (size_t begin = 0; begin < l.params.size();) {
      size_t end = begin;
      int64_t bytes = 0;
      while (end < l.params.size() && (end == begin || bytes + static_cast<int64_t>(l.params[end].nbytes()) <= largest))
        bytes += l.params[end++].nbytes();
      const auto span = [&](const std::vector<at::Tensor>& t) {
        return std::vector<at::Tensor>(t.begin() + begin, t.begin() + end);
      };
      std::vector<at::Tensor> denom = at::_foreach_sqrt(span(v));
      at::_foreach_div_(denom, std::sqrt(bc2));
      at::_foreach_add_(denom, c.eps);
      at::_foreach_addcdiv_(span(l.params), span(m), denom, -lr_ / bc1);
      begin = end;
    }
    zero_grads(l);
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
