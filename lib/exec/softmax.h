#pragma once
// The executor's OpKind::Softmax over the last dimension. Its backward writes the input's
// gradient over the output's gradient when nothing else holds that one (a gradient autograd
// made inside the stage and handed on to this node alone), so an attention's backward holds
// the probabilities and one gradient of their size instead of two: the replay
// (plan/stage_memory.cpp, NodeClass::InPlaceGradient) counts it the same way.
#include <ATen/ATen.h>

namespace dawnpiper {

at::Tensor softmax_last_dim(const at::Tensor& x);

}  // namespace dawnpiper
