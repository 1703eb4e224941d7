"""Process-group set-up for runs launched by torchrun (env://), and the few collectives the loops need.

Model code knows nothing of this module; the training loops call it. One process per device: gloo on CPUs,
NCCL on GPUs. A run started without torchrun is a world of one and needs no process group.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    local_rank: int
    world_size: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(no_cuda: bool = False) -> DistributedContext:
    """Reads RANK/WORLD_SIZE/LOCAL_RANK set by torchrun and joins the process group when there is more than one."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    use_cuda = torch.cuda.is_available() and not no_cuda
    if use_cuda:
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    if world_size > 1 and not dist.is_initialized():
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            init_method="env://",
            rank=rank,
            world_size=world_size,
            timeout=timedelta(minutes=30),
        )
    return DistributedContext(rank, local_rank, world_size, device)


def all_reduce_sum(values: torch.Tensor, ctx: DistributedContext) -> torch.Tensor:
    """Sum of `values` over all processes (returned; the input is left alone)."""
    if not ctx.enabled:
        return values
    total = values.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def any_process(flag: bool, ctx: DistributedContext) -> bool:
    """True on every process when `flag` is true on any (e.g. one of them received SIGTERM)."""
    if not ctx.enabled:
        return flag
    value = torch.tensor([1.0 if flag else 0.0], device=ctx.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return bool(value.item())


def all_gather_objects(value: Any, ctx: DistributedContext) -> list[Any]:
    """Every process's `value` (picklable; e.g. RNG states), indexed by rank, on every process."""
    if not ctx.enabled:
        return [value]
    gathered: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(gathered, value)
    return gathered


# How gloo words a collective whose peer process has gone (NCCL raises torch.distributed.DistError).
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "Broken pipe")


def peer_has_gone(error: BaseException, ctx: DistributedContext) -> bool:
    """True when `error` is a collective failing because another process of the run has stopped (it says why in
    its own line)."""
    if not ctx.enabled or not isinstance(error, RuntimeError):
        return False
    return isinstance(error, dist.DistError) or any(words in str(error) for words in PEER_GONE)


def barrier(ctx: DistributedContext) -> None:
    if ctx.enabled:
        dist.barrier()


def shutdown(ctx: DistributedContext) -> None:
    if ctx.enabled and dist.is_initialized():
        # A collective returns once its result is in, but gloo's worker thread drops the work (and the tensors it
        # holds) a moment later, and that needs the GIL. Caught by the interpreter's exit, the thread is ended
        # inside a C++ destructor and the process aborts after a run that ended well ("terminate called without an
        # active exception", 1 run in about 100 on two busy cores; the core dump shows ~AsyncAllreduceWork under
        # Py_FinalizeEx). Releasing the GIL for a moment lets the workers finish first.
        time.sleep(0.1)
        dist.destroy_process_group()
