#include "exec/softmax.h"

#include <torch/csrc/autograd/custom_function.h>

namespace dawnpiper {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Whether nothing but the caller's handle reads `t`'s memory, so it may be overwritten: its own
// storage, or a view of a base that only the view holds (at::matmul's backward hands on its
// product reshaped).
bool sole_owner(const at::Tensor& t) {
  if (t.use_count() != 1 || !t.is_non_overlapping_and_dense()) return false;
  if (!t.is_view()) return t.storage().use_count() == 1;
  return t._base().use_count() == 1 && t.storage().use_count() == 2;
}

struct SoftmaxFunction : torch::autograd::Function<SoftmaxFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor y = at::softmax(x, -1);
    ctx->save_for_backward({y});
    return y;
  }

  // dx = y * (dy - sum(dy * y)), as y * dy - y * sum(y * dy) in three passes that need no
  // buffer of dy's size beyond the one they write. The row sums are fp32 (bf16 runs too).
  // grad_outputs by reference: autograd's engine hands this node its only handle on a gradient
  // made inside the stage (taking it by value would add one).
  static variable_list backward(AutogradContext* ctx, variable_list& grad_outputs) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    at::Tensor g = std::move(grad_outputs[0]);
    g = sole_owner(g) ? g.mul_(y) : g * y;
    const at::Tensor sums = g.sum(-1, /*keepdim=*/true, at::kFloat);
    g.addcmul_(y, sums, -1);
    return {g};
  }
};

}  // namespace

at::Tensor softmax_last_dim(const at::Tensor& x) { return SoftmaxFunction::apply(x); }

}  // namespace dawnpiper
