#pragma once
// The executor's OpKind::LinearCrossEntropy: an output projection and a mean cross-entropy
// (labels -100 ignored) computed chunk_tokens positions at a time. Forward keeps only each
// position's log-sum-exp; backward recomputes each chunk's logits from the saved hidden states
// and weight. Peak extra memory is a chunk's logits (twice, fp32) instead of the whole
// [positions, classes] logits and log-probabilities that a projection and a loss keep.
#include <cstdint>

#include <ATen/ATen.h>

namespace dawnpiper {

// hidden [.., H]; weight [C, H]; bias [C] or undefined; labels [..] int64 (as hidden without
// its last dimension). The logits are computed in hidden's dtype (a bf16 copy of fp32 weights
// lives for the call only), the loss in fp32. Returns the scalar mean over labelled positions
// (NaN where none is labelled, as at::cross_entropy; the gradients are then zero).
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& labels, int64_t chunk_tokens);

}  // namespace dawnpiper
