#include "exec/lean_ops.h"

#include <numeric>
#include <stdexcept>
#include <vector>

#include <torch/csrc/autograd/custom_function.h>

namespace dawnpiper {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct SoftmaxFunction : torch::autograd::Function<SoftmaxFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x) {
    at::Tensor y = at::softmax(x, -1);
    ctx->save_for_backward({y});
    return y;
  }

  // fp32: dx = y * (dy - sum(dy * y)), as y * dy - y * sum(y * dy) in three passes that need no
  // buffer of dy's size beyond the one they write. Narrower types take ATen's kernel, out of
  // place: rounding y * dy to bf16 before the row sum is subtracted would make the error scale
  // with dy rather than with the result (attention gradients share an offset per row).
  // grad_outputs by reference: autograd's engine hands this node its only handle on a gradient
  // made inside the stage (taking it by value would add one).
  static variable_list backward(AutogradContext* ctx, variable_list& grad_outputs) {
    const at::Tensor y = ctx->get_saved_variables()[0];
    at::Tensor g = std::move(grad_outputs[0]);
    if (y.scalar_type() != at::kFloat) return {at::_softmax_backward_data(g, y, -1, y.scalar_type())};
    g = sole_owner(g) ? g.mul_(y) : g * y;
    const at::Tensor sums = g.sum(-1, /*keepdim=*/true);
    g.addcmul_(y, sums, -1);
    return {g};
  }
};

// Rows as a column [.., 1] in x's dtype, for broadcasting over the last dimension.
at::Tensor per_row(const at::Tensor& rows, const at::Tensor& x) { return rows.to(x.scalar_type()); }

struct RMSNormFunction : torch::autograd::Function<RMSNormFunction> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight, double eps) {
    // r = 1 / sqrt(mean(x^2) + eps) per row, in fp32, from the rows' norms (no square of x)
    const double width = static_cast<double>(x.size(-1));
    const at::Tensor norm = at::linalg_vector_norm(x, 2, {-1}, /*keepdim=*/true, at::kFloat);
    const at::Tensor r = norm.square_().div_(width).add_(eps).rsqrt_();
    ctx->save_for_backward({x, weight, r});
    return (x * per_row(r, x)).mul_(weight.to(x.scalar_type()));
  }

  // With dn = g * w: dx = r * dn - x * r^3 * mean(dn * x); dw = sum over rows of g * x * r.
  // g * x * r is the one temporary of x's size: summed over the rows, then times w summed
  // over each row (r * sum(dn * x), times r^2 / width). Only the gradients asked for (a split
  // backward asks for dx and dw apart).
  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &r = saved[2];
    const at::Tensor& g = grad_outputs[0];
    const at::Tensor w = weight.to(x.scalar_type());
    std::vector<int64_t> rows(static_cast<size_t>(x.dim() - 1));
    std::iota(rows.begin(), rows.end(), 0);
    const bool want_x = ctx->needs_input_grad(0), want_w = ctx->needs_input_grad(1);
    at::Tensor grad_w, scale;  // scale: r^3 * mean(dn * x) per row
    {
      at::Tensor t = (g * x).mul_(per_row(r, x));
      if (want_w) grad_w = t.sum(rows, /*keepdim=*/false, weight.scalar_type());
      if (!want_x) return {at::Tensor(), grad_w, at::Tensor()};
      scale = t.mul_(w).sum(-1, /*keepdim=*/true, at::kFloat).mul_(r.square()).div_(static_cast<double>(x.size(-1)));
    }
    at::Tensor grad_x = (g * w).mul_(per_row(r, x));
    grad_x.addcmul_(x, per_row(scale, x), -1);
    return {grad_x, grad_w, at::Tensor()};
  }
};

}  // namespace

// For a gradient: LibTorch 2.11 hands a custom function's backward the engine's only handle on
// it; 1.13 kept a copy, so the softmax overwrites no gradient there (and the replay does not
// count on it: DAWNPIPER_IN_PLACE_GRADIENTS, CMakeLists.txt). The loss's logits (a handle the
// executor moved out of its env) are sole-owned on either version.
bool sole_owner(const at::Tensor& t) {
  if (t.use_count() != 1 || !t.has_storage() || t._is_zerotensor() || !t.is_non_overlapping_and_dense()) return false;
  if (!t.is_view()) return t.storage().use_count() == 1;
  return t._base().use_count() == 1 && t.storage().use_count() == 2;
}

at::Tensor softmax_last_dim(const at::Tensor& x) { return SoftmaxFunction::apply(x); }

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  if (x.dim() < 2) throw std::invalid_argument("rms_norm: the input needs rows (two or more dimensions)");
  return RMSNormFunction::apply(x, weight, eps);
}

}  // namespace dawnpiper
