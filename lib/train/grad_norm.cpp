#include "train/grad_norm.h"

#include <ATen/core/grad_mode.h>

#include <algorithm>

namespace dawnpiper {

double grad_square_sum(const std::vector<at::Tensor>& params, const std::vector<bool>& counted) {
  at::NoGradGuard no_grad;
  at::Tensor sum;
  for (size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& g = params[i].grad();
    if (!g.defined() || (!counted.empty() && !counted[i])) continue;
    // Each norm in the gradient's precision (as torch's), accumulated in double on the device.
    const at::Tensor square = at::linalg_vector_norm(g, 2).to(at::kDouble).square();
    sum = sum.defined() ? sum.add_(square) : square;
  }
  return sum.defined() ? sum.item<double>() : 0.0;
}

double clip_grads(const std::vector<at::Tensor>& params, double norm, double max_norm) {
  const double factor = std::min(1.0, max_norm / (norm + 1e-6));
  if (factor >= 1.0) return 1.0;
  at::NoGradGuard no_grad;
  for (const at::Tensor& p : params)
    if (p.grad().defined()) p.grad().mul_(factor);
  return factor;
}

}  // namespace dawnpiper
