#include "train/grad_norm.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <map>
#include <tuple>

namespace dawnpiper {

double grad_square_sum(const std::vector<at::Tensor>& params, const std::vector<bool>& counted) {
  at::NoGradGuard no_grad;
  // One multi-tensor norm per device and dtype (as clip_grad_norm_'s foreach path), each norm in
  // the gradient's precision, squared and summed in double.
  std::map<std::tuple<int, int, int>, std::vector<at::Tensor>> groups;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined() || (!counted.empty() && !counted[i])) continue;
    groups[{static_cast<int>(g.device().type()), g.device().index(), static_cast<int>(g.scalar_type())}].push_back(g);
  }
  double sum = 0;
  for (const auto& [key, grads] : groups)
    sum += at::stack(at::_foreach_norm(grads, 2)).to(at::kDouble).square().sum().item<double>();
  return sum;
}

double clip_grads(const std::vector<at::Tensor>& params, double norm, double max_norm) {
  const double factor = std::min(1.0, max_norm / (norm + 1e-6));
  if (factor >= 1.0) return 1.0;
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (!grads.empty()) at::_foreach_mul_(grads, factor);  // (a stage may hold no parameter: ATen refuses none)
  return factor;
}

}  // namespace dawnpiper
