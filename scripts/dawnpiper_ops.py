"""Operators that scripts/export_model.py keeps whole and DawnPiper runs as its own nodes.

dawnpiper::linear_cross_entropy(hidden, weight, bias, labels, chunk_tokens) is an output
projection and a mean cross-entropy (labels -100 ignored) computed `chunk_tokens` positions at a
time, the logits recomputed in backward: the [positions, classes] logits are never held whole.
An importer reads it as OpKind::LinearCrossEntropy (docs/model-format.md); in a user's own
model (export_model.py --module), call linear_cross_entropy() where the LM head and the loss
would be. Eager PyTorch runs the same computation here, so references and exports agree.
"""
from typing import Optional

import torch
import torch.nn.functional as F

IGNORED = -100


def _chunks(rows, chunk):
    for first in range(0, rows, chunk):
        yield first, min(chunk, rows - first)


@torch.library.custom_op("dawnpiper::linear_cross_entropy", mutates_args=())
def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],
                         labels: torch.Tensor, chunk_tokens: int) -> torch.Tensor:
    if chunk_tokens < 1:
        raise ValueError("linear_cross_entropy: chunk_tokens must be positive")
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    w = weight.to(h.dtype)  # bf16 activations: the projection in bf16, as DawnPiper's node does
    b = bias.to(h.dtype) if bias is not None else None
    total = torch.zeros((), dtype=torch.float32, device=h.device)
    for first, n in _chunks(h.shape[0], chunk_tokens):
        logits = F.linear(h[first:first + n], w, b).float()
        total = total + F.cross_entropy(logits, y[first:first + n], ignore_index=IGNORED, reduction="sum")
    return total / (y != IGNORED).sum()


@linear_cross_entropy.register_fake
def _(hidden, weight, bias, labels, chunk_tokens):
    return hidden.new_empty((), dtype=torch.float32)


def _setup_context(ctx, inputs, output):
    hidden, weight, bias, labels, chunk_tokens = inputs
    ctx.save_for_backward(hidden, weight, bias, labels)
    ctx.chunk_tokens = chunk_tokens


def _backward(ctx, grad):
    hidden, weight, bias, labels = ctx.saved_tensors
    h = hidden.reshape(-1, hidden.shape[-1])
    y = labels.reshape(-1)
    w = weight.to(h.dtype)
    b = bias.to(h.dtype) if bias is not None else None
    scale = grad.float() / (y != IGNORED).sum().clamp(min=1)  # none labelled: zero gradients
    grad_h = torch.empty_like(h)
    # summed over the chunks in the parameters' own dtype (fp32 masters: rounded once)
    grad_w = torch.zeros_like(weight)
    grad_b = torch.zeros_like(bias) if bias is not None else None
    for first, n in _chunks(h.shape[0], ctx.chunk_tokens):
        rows, labels_here = h[first:first + n], y[first:first + n]
        g = torch.softmax(F.linear(rows, w, b).float(), dim=-1)  # softmax - one_hot, scaled
        g[torch.arange(n, device=g.device), labels_here.clamp(min=0)] -= 1
        g *= ((labels_here != IGNORED).float() * scale).unsqueeze(1)
        grad_h[first:first + n] = g.to(h.dtype) @ w
        grad_w += g.t().to(grad_w.dtype) @ rows.to(grad_w.dtype)
        if grad_b is not None:
            grad_b += g.sum(0).to(grad_b.dtype)
    return grad_h.view(hidden.shape), grad_w, grad_b, None, None


linear_cross_entropy.register_autograd(_backward, setup_context=_setup_context)
