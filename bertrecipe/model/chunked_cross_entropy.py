"""The masked-LM loss of the predicted positions through the vocabulary projection, a chunk of rows at a time.

The usual path writes the [rows, vocab] logits in the compute dtype, a float32 copy, its log-softmax and, in the
backward, as many tensors again: with a 30,000-50,000 token vocab that traffic costs more than the projection
itself on a CPU (and the memory on a GPU). Here each chunk's logits are made, turned into the loss and into their
gradient (softmax - one-hot, over the rows), and multiplied back into the gradients of the hidden states, the
weight and the bias at once; the backward only scales what the forward left. The numbers are the usual path's:
logits in the compute dtype, the softmax in float32, the GEMMs of the gradient in the compute dtype; the weight's
gradient is summed over the chunks in float32.

Not for fp16: its gradients would be cast to fp16 before the loss scale that keeps them from underflowing reaches
them (they are made in the forward); masked_lm_loss, which both families' heads call, keeps the usual path there
and wherever no gradient is recorded (evaluation wants the logits).
"""
from __future__ import annotations

from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from bertrecipe.model.autocast import compute_dtype

CHUNK_ROWS = 256  # the fastest of 128/256/512 on a 2-core CPU at vocab 30,528, hidden 256


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, hidden: Tensor, weight: Tensor, bias: Optional[Tensor], labels: Tensor,
                dtype: torch.dtype) -> Tensor:
        rows, vocab = hidden.shape[0], weight.shape[0]
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        # The chunks' [rows, vocab] tensors are written into the same buffers: fresh ones of that size would each
        # cost the CPU allocator new pages (and their zeroing) per chunk.
        size = min(CHUNK_ROWS, rows)
        logits_buffer = hidden.new_empty((size, vocab), dtype=dtype)
        probs_buffer = hidden.new_empty((size, vocab), dtype=torch.float32)
        grad_buffer = hidden.new_empty((size, vocab), dtype=dtype)
        weight_grad_buffer = torch.empty_like(w)
        grad_hidden = torch.empty_like(hidden)
        grad_weight: Optional[Tensor] = None
        grad_bias = torch.zeros_like(bias, dtype=torch.float32) if bias is not None else None
        total = torch.zeros((), dtype=torch.float64, device=hidden.device)
        for start in range(0, rows, CHUNK_ROWS):
            chunk = hidden[start: start + CHUNK_ROWS]
            y = labels[start: start + CHUNK_ROWS]
            logits = logits_buffer[: len(y)]
            if b is not None:
                torch.addmm(b, chunk.to(dtype), w.t(), out=logits)
            else:
                torch.mm(chunk.to(dtype), w.t(), out=logits)
            # From the compute dtype to float32 log-probabilities in one pass; their exp is the softmax, in place.
            log_probs = torch.log_softmax(logits, dim=-1, dtype=torch.float32, out=probs_buffer[: len(y)])
            total -= log_probs.gather(1, y[:, None]).sum(dtype=torch.float64)
            grad_logits = log_probs.exp_()
            grad_logits[torch.arange(len(y), device=y.device), y] -= 1.0
            if grad_bias is not None:
                grad_bias += grad_logits.sum(0)
            g = grad_buffer[: len(y)].copy_(grad_logits)
            grad_hidden[start: start + CHUNK_ROWS] = g @ w
            # The loss is the mean over the rows: 1 / rows scales the small [chunk, hidden] factor, not [vocab, hidden].
            torch.mm(g.t(), (chunk / rows).to(dtype), out=weight_grad_buffer)
            if grad_weight is None:  # a copy even in float32, where .float() would hand back the buffer itself
                grad_weight = weight_grad_buffer.to(torch.float32, copy=True)
            else:
                grad_weight.add_(weight_grad_buffer)
        grad_hidden /= rows
        if grad_bias is not None:
            grad_bias /= rows
        assert grad_weight is not None  # rows > 0: chunked_linear_cross_entropy refuses none
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype),
                              grad_bias.to(bias.dtype) if grad_bias is not None else None)
        return (total / rows).float()

    @staticmethod
    def backward(ctx: Any, grad_loss: Tensor) -> tuple[Optional[Tensor], ...]:
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return (grad_hidden * grad_loss, grad_weight * grad_loss,
                grad_bias * grad_loss if grad_bias is not None else None, None, None)


def chunked_linear_cross_entropy(hidden: Tensor, weight: Tensor, bias: Optional[Tensor], labels: Tensor,
                                 dtype: torch.dtype) -> Tensor:
    """mean cross-entropy of (hidden @ weight.T + bias) against labels [rows] (every label a class: no ignored
    rows), the GEMMs in `dtype` (float32 or bfloat16), as F.cross_entropy(F.linear(...).float(), labels)."""
    if dtype == torch.float16 or labels.numel() == 0:
        raise ValueError(f"chunked_linear_cross_entropy: not for fp16 (its loss scale comes after the casts) nor "
                         f"for no rows (got {dtype}, {labels.numel()} rows)")
    with torch.autocast(hidden.device.type, enabled=False):
        return _ChunkedLinearCrossEntropy.apply(hidden, weight, bias, labels, dtype)


def masked_lm_loss(hidden: Tensor, weight: Tensor, bias: Optional[Tensor],
                   labels: Tensor) -> tuple[Optional[Tensor], Tensor]:
    """(logits [rows, vocab] or None, mean cross-entropy in fp32) of the predicted positions' final hidden states
    through the vocabulary projection: chunked (no logits) while gradients are recorded in bf16 or fp32, else the
    usual path."""
    dtype = compute_dtype(hidden)
    if torch.is_grad_enabled() and dtype != torch.float16 and labels.numel():
        return None, chunked_linear_cross_entropy(hidden, weight, bias, labels, dtype)
    logits = F.linear(hidden, weight, bias)
    return logits, F.cross_entropy(logits.float(), labels)
