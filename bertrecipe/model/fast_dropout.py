"""Dropout for CPU training that draws its mask from 16-bit slices of 64-bit random integers.

`torch.nn.functional.dropout` on a CPU draws one floating-point Bernoulli sample per element, which makes
dropout one of the most expensive operations of a BERT training step there. Four keep/drop decisions per
64-bit draw are about five times cheaper. The drop probability is p rounded to a multiple of 1/65536
(0.1 becomes 0.1000061). On other devices the native kernel is already fast and is used instead.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def _scaled_keep_mask(shape: torch.Size, p: float, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A tensor of `shape` holding 1 / (1 - p) where an element is kept and 0 where it is dropped."""
    count = math.prod(shape)
    draws = torch.empty((count + 3) // 4, dtype=torch.int64, device=device).random_(-(2**63), 2**63 - 1)
    lanes = draws.view(torch.int16)[:count].view(shape)  # uniform over [-32768, 32767]
    threshold = -32768 + round(p * 65536)
    kept, dropped = (torch.tensor(v, dtype=dtype, device=device) for v in (1.0 / (1.0 - p), 0.0))
    return torch.where(lanes >= threshold, kept, dropped)  # written once, in the activations' dtype


class _MaskedScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, mask: Tensor) -> Tensor:  # type: ignore[override]
        ctx.save_for_backward(mask)
        return x * mask

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return grad * mask, None


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """Same contract as F.dropout(x, p, training)."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return F.dropout(x, p, training=True)
    return _MaskedScale.apply(x, _scaled_keep_mask(x.shape, p, x.dtype, x.device))


class Dropout(torch.nn.Module):
    """Drop-in for nn.Dropout using `dropout` above."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: Tensor) -> Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
