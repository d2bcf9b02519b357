#pragma once
// The global gradient norm and clipping by it, as torch.nn.utils.clip_grad_norm_: the norm is
// the 2-norm of every parameter's gradient norm, and every gradient is scaled by
// min(1, max_norm / (norm + 1e-6)). A pipeline sums the squares over its stages (each tied
// parameter once) before taking the root, so it clips as one process would.
#include <vector>

#include <ATen/ATen.h>

namespace dawnpiper {

// Sum of the squared 2-norms of the gradients of params[i] where counted[i] (empty: all);
// undefined gradients count 0. One device synchronization per device and dtype.
double grad_square_sum(const std::vector<at::Tensor>& params, const std::vector<bool>& counted = {});

// Scales every defined gradient by min(1, max_norm / (norm + 1e-6)); returns that factor.
double clip_grads(const std::vector<at::Tensor>& params, double norm, double max_norm);

}  // namespace dawnpiper
