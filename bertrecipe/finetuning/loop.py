"""The fine-tuning loop that run_squad.py and run_glue.py share on top of training.Stepper, in the shape of the
pre-training loop (pretraining/loop.py): LoopSettings and finetuning_loop, which runs AdamW under a linear warm-up over
epochs of in-memory feature arrays, shuffled, split across processes and grouped into optimizer steps, with the
loss logged."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from bertrecipe.common.errors import InputError
from bertrecipe.training.metric_logger import MetricLogger
from bertrecipe.training.model_flops import BatchShape, batch_shape, device_peak_tflops, training_flops
from bertrecipe.training.optimization import LinearWarmUpScheduler, build_adamw
from bertrecipe.training.process_group import DistributedContext, all_reduce_sum
from bertrecipe.training.stepper import Precision, Stepper, batches_to_device, take, unwrap, wrap_ddp

Arrays = dict[str, np.ndarray]
Batch = dict[str, torch.Tensor]


@dataclass(frozen=True)
class LoopSettings:
    """What a fine-tuning run's loop is asked to do (the common flags of run_squad.py and run_glue.py)."""

    micro_batch_size: int  # per process
    accumulation: int
    epochs: float
    max_steps: int  # > 0 overrides epochs
    learning_rate: float  # AdamW's peak, reached after the warm-up
    warmup_proportion: float  # of the optimizer steps, then a linear decay to 0
    seed: int
    log_freq: int = 50
    progress_bar: bool = True
    num_workers: int = 0
    trim_padding: bool = False  # see as_tensors
    peak_tflops: Optional[float] = None  # --peak_tflops: the device's peak that mfu is against (None: looked up)


def finetuning_loop(model: nn.Module, arrays: Arrays, compute_loss: Callable[[nn.Module, Batch], torch.Tensor],
               settings: LoopSettings, precision: Precision, ctx: DistributedContext,
               log: MetricLogger) -> dict[str, float]:
    """Fine-tunes `model` (on ctx.device, not yet wrapped for DDP) on the rows of `arrays`: optimizer_steps AdamW
    steps of compute_loss(model, batch) under a linear warm-up and decay. Returns e2e_train_time,
    training_sequences_per_second (all processes) and final_loss (the last step's, averaged over processes)."""
    total_steps = optimizer_steps(len(next(iter(arrays.values()))), settings, ctx)
    optimizer = build_adamw(model, settings.learning_rate)
    scheduler = LinearWarmUpScheduler(optimizer, settings.warmup_proportion, total_steps)
    return _run_steps(wrap_ddp(model, ctx), optimizer, scheduler, precision, arrays, compute_loss, settings,
                      total_steps, ctx, log)


def optimizer_steps(n: int, settings: LoopSettings, ctx: DistributedContext) -> int:
    """Optimizer steps of the run: max_steps when > 0, else the epochs' worth (a last partial step counts)."""
    if settings.max_steps > 0:
        return settings.max_steps
    micro_batches = math.ceil(math.ceil(n / ctx.world_size) / settings.micro_batch_size)
    return max(1, math.ceil(math.ceil(micro_batches / settings.accumulation) * settings.epochs))


def _run_steps(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, precision: Precision,
               arrays: Arrays, compute_loss: Callable[[nn.Module, Batch], torch.Tensor], settings: LoopSettings,
               total_steps: int, ctx: DistributedContext, log: MetricLogger) -> dict[str, float]:
    """Runs total_steps optimizer steps over shuffled epochs of `arrays`; returns e2e_train_time,
    training_sequences_per_second (all processes) and final_loss (the last step's, averaged over processes)."""
    n = len(next(iter(arrays.values())))
    if n == 0:
        raise InputError("no training features")
    stepper = Stepper(model, optimizer, scheduler, precision, compute_loss)
    progress = _Progress(total_steps, settings, ctx, log, optimizer, stepper)
    config = getattr(unwrap(model), "config", None)
    # Looked up (measured, on a CPU) the first time the logging process writes a record, after its all-reduce.
    peak = partial(device_peak_tflops, ctx.device, precision.dtype or torch.float32, settings.peak_tflops)
    model.train()
    epoch = 0
    while progress.steps < total_steps:
        batches = epoch_micro_batches(n, settings.micro_batch_size, settings.seed, epoch, ctx)
        loader = DataLoader(_Rows(arrays, batches, settings.trim_padding), batch_size=None,
                            num_workers=settings.num_workers,
                            pin_memory=ctx.device.type == "cuda")
        iterator = iter(loader)
        for _ in range(math.ceil(len(batches) / settings.accumulation)):
            tick = time.perf_counter()
            rows = take(iterator, settings.accumulation)
            progress.wait(time.perf_counter() - tick, [batch_shape(b) for b in rows], config)
            micro = [batches_to_device(b, ctx.device) for b in rows]
            progress.count(epoch, micro, stepper.step(micro).loss, peak)
            if progress.steps == total_steps:
                break
        epoch += 1
    return progress.finish()


class _Progress:
    """_run_steps' counts, progress bar and log records: the loss (averaged over processes), learning rate,
    skipped steps and throughput every log_freq optimizer steps and at the last one."""

    def __init__(self, total_steps: int, settings: LoopSettings, ctx: DistributedContext, log: MetricLogger,
                 optimizer: torch.optim.Optimizer, stepper: Stepper) -> None:
        self.total_steps, self.log_freq, self.ctx, self.log = total_steps, settings.log_freq, ctx, log
        self.optimizer, self.stepper = optimizer, stepper
        self.bar = tqdm(total=total_steps, disable=not (settings.progress_bar and ctx.is_main), desc="fine-tuning",
                        unit="step", dynamic_ncols=True)
        self.start = time.perf_counter()
        self.steps, self.sequences = 0, 0
        # Per-step throughput: sequences of all processes since the previous record, over the wall time since
        # then, read once the record's loss all-reduce has synchronised.
        self.record_clock, self.sequences_at_record = self.start, 0
        self.final_loss = float("nan")
        # this process's real tokens, model FLOPs and seconds waiting for its rows since the previous record
        self.tokens, self.flops, self.waited = 0, 0.0, 0.0

    def wait(self, seconds: float, shapes: Sequence[BatchShape], config: Any) -> None:
        """What the next step's rows cost: the time waited for them, their real tokens and model FLOPs."""
        self.waited += seconds
        self.tokens += sum(shape.tokens for shape in shapes)
        if config is not None:
            self.flops += sum(training_flops(config, shape) for shape in shapes)

    def count(self, epoch: int, micro: Sequence[Batch], loss: float,
              peak_tflops: Optional[Callable[[], Optional[float]]] = None) -> None:
        """One optimizer step over the micro-batches `micro`, whose loss (this process's) was `loss`."""
        self.steps += 1
        self.sequences += sum(len(next(iter(b.values()))) for b in micro) * self.ctx.world_size
        self.bar.update(1)
        if self.steps % self.log_freq == 0 or self.steps == self.total_steps:
            self.record(epoch, loss, peak_tflops)

    def record(self, epoch: int, loss: float, peak_tflops: Optional[Callable[[], Optional[float]]]) -> None:
        sums = all_reduce_sum(torch.tensor([loss, self.tokens, self.flops, self.waited], dtype=torch.float64,
                                           device=self.ctx.device), self.ctx)
        self.final_loss = float(sums[0]) / self.ctx.world_size
        now = time.perf_counter()
        seconds = max(now - self.record_clock, 1e-9)
        record = {"step_loss": self.final_loss, "learning_rate": self.optimizer.param_groups[0]["lr"],
                  "skipped_steps": self.stepper.skipped_steps,
                  "training_sequences_per_second": (self.sequences - self.sequences_at_record) / seconds,
                  "tokens_per_second": float(sums[1]) / seconds,
                  "input_wait_share": min(float(sums[3]) / self.ctx.world_size / seconds, 1.0)}
        peak = peak_tflops() if peak_tflops is not None and self.ctx.is_main else None  # the logging process's
        if peak and self.flops:
            record["mfu"] = float(sums[2]) / seconds / (peak * 1e12 * self.ctx.world_size)
        self.log.log([epoch, self.steps], record)
        self.record_clock, self.sequences_at_record = now, self.sequences
        self.tokens, self.flops, self.waited = 0, 0.0, 0.0
        self.bar.set_postfix(loss=f"{self.final_loss:.4f}")

    def finish(self) -> dict[str, float]:
        self.bar.close()
        elapsed = time.perf_counter() - self.start
        return {"e2e_train_time": elapsed, "training_sequences_per_second": self.sequences / elapsed,
                "final_loss": self.final_loss}


def epoch_micro_batches(n: int, micro_batch_size: int, seed: int, epoch: int,
                        ctx: DistributedContext) -> list[np.ndarray]:
    """This process's micro-batches of one epoch: a seeded shuffle of all n rows, wrapped around so that every
    process gets the same count (DDP needs the same number of steps everywhere), dealt out round-robin."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    order = np.resize(order, math.ceil(n / ctx.world_size) * ctx.world_size)
    mine = order[ctx.rank :: ctx.world_size]
    return [mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]


class _Rows(Dataset):
    """Micro-batches given as lists of row indexes, turned into tensors (in a worker when num_workers > 0)."""

    def __init__(self, arrays: Arrays, batches: Sequence[np.ndarray], trim: bool) -> None:
        self.arrays, self.batches, self.trim = arrays, batches, trim

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        return as_tensors(self.arrays, self.batches[index], self.trim)


SEQUENCE_KEYS = ("input_ids", "segment_ids", "input_mask")


def as_tensors(arrays: Arrays, rows: np.ndarray, trim: bool = False) -> Batch:
    """Rows of the feature arrays as tensors: integers as int64 (embedding indexes, labels), floats as they are.
    trim: cut the sequence columns after the longest real sequence of these rows (padding is masked out, so
    the outputs at real positions do not change; short GLUE sentences then cost far less)."""
    width = int(arrays["input_mask"][rows].sum(1).max()) if trim and len(rows) else None
    batch = {}
    for key, values in arrays.items():
        values = values[rows]
        if width is not None and key in SEQUENCE_KEYS:
            values = values[:, :width]
        tensor = torch.from_numpy(np.ascontiguousarray(values))
        batch[key] = tensor.long() if values.dtype.kind in "iub" else tensor
    return batch
