"""Training measured in tokens (--max_tokens, --batch_size_warmup_tokens): how a step's real tokens are counted
across the processes, and how many micro-batches a step takes during a batch-size warm-up.

A step's tokens are its samples' non-padding tokens (the sum of input_mask, which packing keeps: a packed row's
mask holds its samples' masks side by side), summed over all processes by one all-reduce of an integer: every
process holds the same exact count, which the checkpoint keeps ("tokens") so that a resume goes on from it. The
loop sums on every step only when the step reads the count (a token budget, a batch-size warm-up); otherwise at the
log records, the checkpoints and the end, since the all-reduce waits for the device.

The batch-size warm-up (ModernBERT's) grows the step from a few micro-batches per process to the full
--gradient_accumulation_steps, linearly in the tokens consumed before the step, in whole multiples of the
granule: the smallest number of micro-batches per process whose samples every lane of the stream splits evenly
(sample_order.py: a step takes the same count from each lane). Each step reads exactly the samples it trains:
the stream position advances by what was taken, never skipping any.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Optional

import torch

from bertrecipe.common.errors import InputError
from bertrecipe.training.process_group import DistributedContext, all_reduce_sum


def count_tokens(micro_batches: Iterable[dict[str, torch.Tensor]]) -> int:
    """This process's real (non-padding) tokens in a step's micro-batches."""
    return sum(int(batch["input_mask"].sum()) for batch in micro_batches)


def tokens_of_all_processes(local: int, ctx: DistributedContext) -> int:
    """The sum of `local` over the processes, exact (int64), the same on every process."""
    if ctx.world_size == 1:
        return local
    return int(all_reduce_sum(torch.tensor([local], dtype=torch.int64, device=ctx.device), ctx)[0])


def ramp_granule(lanes: int, micro_batch: int, world_size: int) -> int:
    """Micro-batches per process that a step must take a multiple of: its micro_batch x world_size x count
    samples must split evenly over the lanes."""
    return lanes // math.gcd(lanes, micro_batch * world_size)


@dataclass(frozen=True)
class BatchRamp:
    """A step's micro-batches per process as a function of the tokens consumed before it: `start` at 0 tokens,
    growing linearly to `full` at `warmup_tokens`, rounded down to a multiple of `granule` (never below
    `start`); `full` from `warmup_tokens` on."""

    full: int
    granule: int
    start: int
    warmup_tokens: int

    def micro_batches(self, tokens: int) -> int:
        if tokens >= self.warmup_tokens:
            return self.full
        grown = self.start + (self.full - self.start) * tokens // self.warmup_tokens  # integers: exact everywhere
        return max(self.start, grown // self.granule * self.granule)


def batch_ramp(warmup_tokens: int, start_fraction: float, accumulation: int, micro_batch: int, world_size: int,
               lanes: int) -> Optional[BatchRamp]:
    """The ramp --batch_size_warmup_tokens and --batch_size_warmup_start ask for (None without a warm-up);
    InputError when the stream's lanes leave no step smaller than the full one."""
    if not warmup_tokens:
        return None
    granule = ramp_granule(lanes, micro_batch, world_size)
    if granule >= accumulation:
        raise InputError(f"--batch_size_warmup_tokens: the sample stream's {lanes} lanes take a step of whole "
                         f"multiples of {granule} micro-batches per process, and a full step is "
                         f"{accumulation}: no smaller batch to start from; use --data_lanes {world_size} (at the "
                         "start of a run) or more --gradient_accumulation_steps")
    start = max(granule, math.floor(start_fraction * accumulation / granule) * granule)
    return BatchRamp(accumulation, granule, min(start, accumulation), warmup_tokens)
