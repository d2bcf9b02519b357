#pragma once
// The executor's losses, each a custom autograd function that holds less than autograd's
// composition of its ops: OpKind::CrossEntropy over given logits, and OpKind::LinearCrossEntropy,
// an output projection and a mean cross-entropy that never holds the logits whole.
#include <cstdint>

#include <ATen/ATen.h>

namespace dawnpiper {

// OpKind::CrossEntropy: logits [.., C] (fp32 or bf16), labels [..] int64 (-100 ignored) -> the
// scalar mean over labelled positions, in fp32. Its backward keeps the fp32 log-probabilities
// and writes the logits' gradient over them: one buffer of the logits' size where autograd's
// composition (log_softmax, nll_loss) holds three. With overwrite_logits (the caller holds the
// only handle on fp32 logits) the log-probabilities are written over the logits too, a chunk of
// rows at a time (graph/op_graph.h, kCrossEntropyChunks), so the forward adds one chunk instead
// of a second buffer; bf16 logits are widened into a copy that is overwritten the same way.
// `log_probs`, if given, receives the saved log-probabilities (the evictor's handle on them).
at::Tensor cross_entropy(const at::Tensor& logits, const at::Tensor& labels, bool overwrite_logits,
                         at::Tensor* log_probs = nullptr);

// OpKind::LinearCrossEntropy: the projection and loss computed chunk_tokens positions at a time.
// Forward keeps only each position's log-sum-exp; backward recomputes each chunk's logits from
// the saved hidden states and weight. Peak extra memory is a chunk's logits (twice, fp32)
// instead of the whole [positions, classes] logits and log-probabilities.
// hidden [.., H]; weight [C, H]; bias [C] or undefined; labels [..] int64 (as hidden without
// its last dimension). The logits are computed in hidden's dtype (a bf16 copy of fp32 weights
// lives for the call only), the loss in fp32. Returns the scalar mean over labelled positions
// (NaN where none is labelled, as at::cross_entropy; the gradients are then zero).
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& bias,
                                const at::Tensor& labels, int64_t chunk_tokens);

}  // namespace dawnpiper
