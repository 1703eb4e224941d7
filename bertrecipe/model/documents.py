"""Rows that hold several documents (packed rows): which token may attend to which, and where positions restart.

A row's `document_ids` ([batch, seq] integers) number its documents in runs of consecutive tokens, with 0 at
padding. A document is an unbroken run of one id: an id that comes back later in the row starts another document
(document_runs, the one rule, which the models apply before attention, positions and the CUDA spans read the ids).
A token attends only to tokens of its own document (block-diagonal attention, so no document sees another), and
positions count from 0 at each document's first token, as if every document were alone in its row.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


def document_runs(document_ids: Tensor) -> Tensor:
    """document_ids renumbered so that each unbroken run of one id in a row is a document of its own (1, 2, ... in
    row order; padding, 0, stays 0): after it, equal ids anywhere in a row and runs of equal ids are the same
    documents, whichever of the two a consumer reads."""
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    runs = starts.to(document_ids.dtype).cumsum(dim=1)
    return torch.where(document_ids > 0, runs, torch.zeros_like(runs))


def positions_within_documents(document_ids: Tensor) -> Tensor:
    """[batch, seq] positions that restart at 0 where the document id changes (padding counts as one more run)."""
    seq = document_ids.shape[1]
    index = torch.arange(seq, device=document_ids.device).expand_as(document_ids)
    starts = torch.ones_like(document_ids, dtype=torch.bool)
    starts[:, 1:] = document_ids[:, 1:] != document_ids[:, :-1]
    first_of_run = torch.where(starts, index, torch.zeros_like(index)).cummax(dim=1).values
    return index - first_of_run


def document_attention_bias(document_ids: Tensor, dtype: torch.dtype,
                            half_window: Optional[int] = None) -> Tensor:
    """Additive bias [batch, 1, seq, seq]: 0 where a query may attend to a key (same document; within
    `half_window` positions of it when given, as local attention), the dtype's minimum elsewhere.

    A padding query attends to itself only: a row of nothing but masked keys would give NaN probabilities, and
    their backward would spread NaN into the keys' gradients even though padding outputs are never used."""
    same = document_ids[:, :, None] == document_ids[:, None, :]
    seq = document_ids.shape[1]
    index = torch.arange(seq, device=document_ids.device)
    diagonal = index[:, None] == index[None, :]
    allowed = same & ((document_ids[:, None, :] > 0) | diagonal)
    if half_window is not None:
        allowed = allowed & ((index[:, None] - index[None, :]).abs() <= half_window)  # not &=: ONNX lacks it
    bias = torch.zeros(allowed.shape, dtype=dtype, device=document_ids.device)
    bias.masked_fill_(~allowed, torch.finfo(dtype).min)
    return bias[:, None]
