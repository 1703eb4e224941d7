"""Local (sliding-window) attention in memory linear in the sequence length.

A query attends to the keys within `reach` positions of it (ModernBERT: local_attention // 2) and of its own
document. The sequence is cut into chunks of `reach` queries; a chunk's keys are its own chunk and the two beside
it, so the scores take [chunks, reach, 3 * reach] instead of [seq, seq]: at 8,192 tokens and a reach of 64,
1/43 of the dense scores. Gives what dense attention with documents.document_attention_bias(..., reach) gives.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from bertrecipe.model.fast_dropout import dropout

OUTSIDE = -1  # the document id of the positions added around the sequence to fill its first and last chunks


@dataclass(frozen=True)
class Band:
    """What a local layer attends within: documents.py's document_ids [batch, seq] and the reach."""

    document_ids: Tensor
    reach: int

    def worth_it(self) -> bool:
        """Chunks pay when the sequence spans more than three of them; shorter ones attend densely."""
        return self.document_ids.shape[1] > 3 * self.reach


def _allowed(band: Band, chunks: int) -> Tensor:
    """[batch, chunks, reach, 3 * reach] bool: which key of the chunk's window each query may attend to."""
    reach = band.reach
    padded_length = chunks * reach
    tail = padded_length - band.document_ids.shape[1]
    query_docs = F.pad(band.document_ids, (0, tail), value=OUTSIDE).view(-1, chunks, reach)
    key_docs = F.pad(band.document_ids, (reach, tail + reach), value=OUTSIDE).unfold(1, 3 * reach, reach)
    device = band.document_ids.device
    query_pos = torch.arange(padded_length, device=device).view(chunks, reach)
    key_pos = (torch.arange(padded_length + 2 * reach, device=device) - reach).unfold(0, 3 * reach, reach)
    distance = query_pos[:, :, None] - key_pos[:, None, :]
    within = (distance.abs() <= reach)[None]
    diagonal = (distance == 0)[None]
    same = query_docs[..., None] == key_docs[:, :, None, :]
    # Padding (and the added positions) attend to themselves only: never a row of nothing (see documents.py).
    return same & within & ((key_docs[:, :, None, :] > 0) | diagonal)


def _windows(x: Tensor, reach: int, chunks: int) -> Tensor:
    """x [batch, heads, seq, head_dim] -> each chunk's keys (or values) [batch, heads, chunks, 3 * reach, head_dim]:
    the chunk before, its own and the one after. Three shifted views concatenated rather than an unfold, whose
    backward (a scatter-add) costs more than the concatenation's slices."""
    batch, heads, seq, head_dim = x.shape
    padded = F.pad(x, (0, 0, reach, chunks * reach - seq + reach)).view(batch, heads, chunks + 2, reach, head_dim)
    return torch.cat((padded[:, :, :-2], padded[:, :, 1:-1], padded[:, :, 2:]), dim=3)


def banded_attention(q: Tensor, k: Tensor, v: Tensor, band: Band, dropout_prob: float, training: bool) -> Tensor:
    """Attention of q, k, v [batch, heads, seq, head_dim] within the band; returns [batch, heads, seq, head_dim]."""
    batch, heads, seq, head_dim = q.shape
    reach = band.reach
    chunks = -(-seq // reach)
    q_chunks = F.pad(q, (0, 0, 0, chunks * reach - seq)).view(batch, heads, chunks, reach, head_dim)
    scores = torch.matmul(q_chunks * head_dim ** -0.5, _windows(k, reach, chunks).transpose(-1, -2))
    allowed = _allowed(band, chunks)[:, None]  # scores: [B, H, chunks, r, 3r]
    scores = scores.masked_fill(~allowed, torch.finfo(scores.dtype).min)
    probs = dropout(torch.softmax(scores, dim=-1), dropout_prob, training=training)
    context = torch.matmul(probs, _windows(v, reach, chunks))  # [B, H, chunks, r, D]
    return context.reshape(batch, heads, chunks * reach, head_dim)[:, :, :seq]
