"""Timed batched inference over in-memory feature arrays (prediction and evaluation of run_squad.py and run_glue.py,
inference.py's logits), and the latency summary the runs report."""
from __future__ import annotations

import time
from typing import Callable, Sequence

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from bertrecipe.finetuning.loop import Arrays, Batch, as_tensors
from bertrecipe.training.stepper import Precision, batches_to_device, unwrap


@torch.no_grad()
def timed_inference(model: nn.Module, arrays: Arrays, batch_size: int, precision: Precision,
                    forward: Callable[[nn.Module, Batch], Sequence[torch.Tensor]],
                    progress_bar: bool = False, trim: bool = False) -> tuple[list[np.ndarray], list[float]]:
    """forward(model, batch) over all rows in order, batch_size at a time, in eval mode; returns each output
    concatenated as float32 numpy arrays and the wall time (seconds) of every batch. trim: see as_tensors
    (only for outputs without a sequence axis)."""
    model = unwrap(model)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n = len(next(iter(arrays.values())))
    outputs: list[list[np.ndarray]] = []
    latencies: list[float] = []
    for first in tqdm(range(0, n, batch_size), disable=not progress_bar, desc="inference", unit="batch"):
        rows = np.arange(first, min(first + batch_size, n))
        batch = batches_to_device(as_tensors(arrays, rows, trim), device)
        tick = time.perf_counter()
        with precision.autocast():
            result = forward(model, batch)
        result = [r.float().cpu().numpy() for r in result]  # .cpu() waits for the device: the time is honest
        latencies.append(time.perf_counter() - tick)
        for i, r in enumerate(result):
            if len(outputs) <= i:
                outputs.append([])
            outputs[i].append(r)
    model.train(was_training)
    return [np.concatenate(o) for o in outputs], latencies


def latency_summary(latencies: Sequence[float], sequences: int) -> dict[str, float]:
    """Inference throughput and per-batch latency statistics in milliseconds (mean, p50/p90/p95/p99)."""
    total = float(sum(latencies))
    ms = np.asarray(latencies, np.float64) * 1000.0
    summary = {"e2e_inference_time": total, "inference_sequences_per_second": sequences / total if total else 0.0,
               "latency_avg_ms": float(ms.mean()) if ms.size else 0.0}
    for p in (50, 90, 95, 99):
        summary[f"latency_p{p}_ms"] = float(np.percentile(ms, p)) if ms.size else 0.0
    return summary
