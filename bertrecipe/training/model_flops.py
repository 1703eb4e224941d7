"""Model FLOPs of a batch and the device's peak, for the logs' `tokens_per_second`, `mfu` and `input_wait_share`.

The FLOPs are the model's useful matrix work (PaLM's "model FLOPs", not what a kernel happens to execute): the
dense layers on the real tokens; attention over each token's span (its row's real tokens, its own document in a
packed row, at most the window of a local layer); the pooler on each row; the masked-LM head on the predicted
positions alone (as both families compute it). A training step is three forwards' worth (the backward pass does
two products per forward one). Element-wise work (norms, activations, softmax) is left out, as MFU conventions do.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping, Optional

import numpy as np
import torch

from bertrecipe.model.families import is_modern_config

# Dense bf16/fp16 tensor-core peaks (TFLOP/s, without sparsity) from the vendors' data sheets; the first name found
# in torch.cuda.get_device_name() wins, so the specific names come first.
PEAK_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.4), ("H200", 989.4), ("GH200", 989.4),
               ("B200", 2250.0), ("A100", 312.0), ("L40S", 362.1), ("L4", 121.0), ("A10G", 70.0), ("A10", 125.0),
               ("V100", 125.0), ("RTX 4090", 165.2))
TRAINING_PASSES = 3  # forward, and the backward's two products (inputs and weights)


@dataclass(frozen=True)
class BatchShape:
    """What a batch's FLOPs depend on: its rows' real tokens (per document in packed rows), predicted positions."""

    spans: np.ndarray  # int64: the real tokens of each attention span (a row, or a document of a packed row)
    rows: int
    predicted: int  # masked-LM positions predicted (0 for fine-tuning)

    @property
    def tokens(self) -> int:
        return int(self.spans.sum())


def batch_shape(batch: Mapping[str, torch.Tensor]) -> BatchShape:
    """The BatchShape of a micro-batch as the loops feed it (input_mask; document_ids where rows are packed;
    masked_lm_labels where masked positions are predicted)."""
    mask = batch["input_mask"].detach().cpu().numpy().astype(bool)
    documents = batch.get("document_ids")
    if documents is None:
        spans = mask.sum(axis=1)
    else:
        ids = documents.detach().cpu().numpy()
        spans = np.concatenate([np.unique(row[keep], return_counts=True)[1]
                                for row, keep in zip(ids, mask, strict=True)])
    labels = batch.get("masked_lm_labels")
    predicted = int((labels >= 0).sum()) if labels is not None else 0
    return BatchShape(spans.astype(np.int64), len(mask), predicted)


def windowed_pairs(length: np.ndarray, half_window: Optional[int]) -> np.ndarray:
    """Query-key pairs of spans of `length` tokens where a token sees half_window tokens on each side (None: all)."""
    n = length.astype(np.int64)
    if half_window is None:
        return n * n
    h = half_window
    # each side: sum over i < n of min(i, h)
    side = np.where(n - 1 <= h, n * (n - 1) // 2, h * (h + 1) // 2 + (n - 1 - h) * h)
    return 2 * side + n


def forward_flops(config, shape: BatchShape) -> float:
    """The forward FLOPs of one batch of either family (config: BertConfig or ModernBertConfig)."""
    h, tokens = config.hidden_size, shape.tokens
    if is_modern_config(config):
        dense = 4 * h * h + 3 * h * config.intermediate_size  # Wqkv, Wo; GeGLU's Wi (2 I wide) and Wo
        halves = [None if kind == "full_attention" else config.local_attention // 2 for kind in config.layer_types]
        head, vocab, pooled = h * h, config.vocab_size, 0
    else:
        dense = 4 * h * h + 2 * h * config.intermediate_size
        halves = [None] * config.num_hidden_layers
        head, vocab, pooled = h * h, config.vocab_size, h * h + 2 * h  # pooler and next-sentence classifier
    attention = sum(int(windowed_pairs(shape.spans, half).sum()) for half in halves) * 2 * h  # QK^T and PV
    macs = tokens * dense * len(halves) + attention + shape.predicted * (head + h * vocab) + shape.rows * pooled
    return 2.0 * macs


def training_flops(config, shape: BatchShape) -> float:
    return TRAINING_PASSES * forward_flops(config, shape)


def device_peak_tflops(device: torch.device, dtype: torch.dtype, given: Optional[float] = None) -> Optional[float]:
    """The peak MFU is measured against: --peak_tflops when given; a GPU's from PEAK_TFLOPS (None for one not in
    it); a CPU's measured on a GEMM of this run's precision (about 0.3 s)."""
    if given:
        return given
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        return next((peak for key, peak in PEAK_TFLOPS if key in name), None)
    return measured_gemm_tflops(dtype)


@lru_cache(maxsize=None)
def measured_gemm_tflops(dtype: torch.dtype, size: int = 512, seconds: float = 0.1) -> float:
    """The best rate of a square matmul of `dtype` on this CPU's threads over about `seconds` (once a process)."""
    own = torch.Generator().manual_seed(0)  # never the global one: that is the run's dropout stream
    a = torch.randn(size, size, generator=own).to(dtype)
    b = torch.randn(size, size, generator=own).to(dtype)
    torch.mm(a, b)  # warm-up: thread pool and kernels
    best, deadline = 0.0, time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        tick = time.perf_counter()
        torch.mm(a, b)
        best = max(best, 2 * size ** 3 / max(time.perf_counter() - tick, 1e-9))
    return best / 1e12
