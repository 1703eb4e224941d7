"""Attention over a batch's tokens by document spans, with torch's variable-length FlashAttention kernels (CUDA).

On a GPU the real tokens of a batch need neither be put back into [batch, seq] rows nor given a [seq, seq] bias:
torch.nn.attention.varlen.varlen_attn (FlashAttention-2's varlen kernels as torch ships them) takes the tokens
[tokens, heads, head_dim] and the cumulative lengths of their documents (cu_seqlens), keeps each query inside its
document and, for local layers, inside a window on each side. It serves where it can run: CUDA, bf16 or fp16, no
attention dropout (the kernel has none), a torch that has it (2.10 and later; the window from 2.11); elsewhere the
model keeps its bias or Band path (documents.py, local_attention.py), which gives the same attention.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable, Optional

import torch
from torch import Tensor

Kernel = Callable[..., Tensor]
FLASH_DTYPES = (torch.bfloat16, torch.float16)
MAX_HEAD_DIM = 256  # FlashAttention-2's largest head size


@dataclass(frozen=True)
class DocumentSpans:
    """The documents of a batch's tokens in token order (see in_token_order): cu_seqlens int32 [documents + 1] where
    each starts, then the number of tokens; the longest one's length; the kernel that attends within them."""

    cu_seqlens: Tensor
    max_length: int
    kernel: Kernel


def _torch_varlen() -> Optional[Kernel]:
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def takes_a_window(kernel: Kernel) -> bool:
    """Whether the kernel limits keys to a window (torch 2.10's varlen_attn has no window_size)."""
    try:
        return "window_size" in inspect.signature(kernel).parameters
    except (TypeError, ValueError):
        return False


def kernel_for(device: torch.device, dtype: torch.dtype, head_dim: int, dropout_prob: float,
               training: bool, local: bool) -> Optional[Kernel]:
    """The varlen kernel for attention of this kind here, or None where it cannot serve."""
    if device.type != "cuda" or dtype not in FLASH_DTYPES or head_dim > MAX_HEAD_DIM or head_dim % 8:
        return None
    if training and dropout_prob > 0:
        return None
    kernel = _torch_varlen()
    if kernel is None or (local and not takes_a_window(kernel)):
        return None
    return kernel


def in_token_order(values: Tensor, token_index: Optional[Tensor]) -> Tensor:
    """values [batch, seq] of the attended tokens in order: those at token_index (flat [batch * seq] positions, as
    TokenPacking keeps them), or every position's where token_index is None."""
    flat = values.reshape(-1)
    return flat if token_index is None else flat.index_select(0, token_index)


def document_spans(document_ids: Tensor, token_index: Optional[Tensor], kernel: Kernel) -> DocumentSpans:
    """Spans of the attended tokens' documents: runs of equal (row, document id) in token order."""
    documents = in_token_order(document_ids, token_index)
    rows = torch.div(in_token_order(torch.arange(document_ids.numel(), device=documents.device).view_as(
        document_ids), token_index), document_ids.shape[1], rounding_mode="floor")
    starts = torch.ones_like(documents, dtype=torch.bool)
    starts[1:] = (documents[1:] != documents[:-1]) | (rows[1:] != rows[:-1])
    boundaries = torch.cat((starts.nonzero().squeeze(1), torch.tensor([documents.numel()], device=documents.device)))
    return DocumentSpans(boundaries.to(torch.int32), int((boundaries[1:] - boundaries[:-1]).max()), kernel)


def varlen_attention(q: Tensor, k: Tensor, v: Tensor, spans: DocumentSpans, half_window: Optional[int]) -> Tensor:
    """q, k, v [tokens, heads, head_dim] -> [tokens, heads, head_dim]: each query attends to the keys of its
    document (within half_window positions on each side when given), scaled by head_dim ** -0.5."""
    window = {} if half_window is None else {"window_size": (half_window, half_window)}
    return spans.kernel(q, k, v, spans.cu_seqlens, spans.cu_seqlens, spans.max_length, spans.max_length, **window)
