#pragma once
// The tensors of one micro-batch by OpGraph tensor id: what data sources fill and a stage's
// module computes in; undefined where not (or no longer) held.
#include <vector>

#include <ATen/core/Tensor.h>

namespace dawnpiper {

using TensorEnv = std::vector<at::Tensor>;

}  // namespace dawnpiper
