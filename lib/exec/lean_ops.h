#pragma once
// Executor ops whose backward keeps or allocates less than autograd's composition of them.
#include <ATen/ATen.h>

namespace dawnpiper {

// Whether nothing but the caller's handle reads `t`'s memory, so it may be overwritten: its own
// storage, or a view of a base that only the view holds (at::matmul's backward hands on its
// product reshaped; at::linear returns a 3-d output so). Used for the softmax's incoming
// gradient and the loss's logits.
bool sole_owner(const at::Tensor& t);

// OpKind::Softmax over the last dimension. In fp32 its backward writes the input's gradient
// over the output's gradient when nothing else holds that one (a gradient autograd made inside
// the stage and handed on to this node alone), so an attention's backward holds the
// probabilities and one gradient of their size instead of two: the replay
// (plan/stage_memory.cpp, NodeClass::InPlaceGradient) counts it the same way.
at::Tensor softmax_last_dim(const at::Tensor& x);

// OpKind::RMSNorm: x * rsqrt(mean(x^2, -1) + eps) * weight, computed in x's dtype. Keeps x and
// one fp32 factor per row for its backward, where the composition keeps the normalized x too
// (one activation per norm: T5's three per decoder layer). A bf16 x takes the fp32 master
// weight, cast for the call only; the weight's gradient is fp32.
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

}  // namespace dawnpiper
