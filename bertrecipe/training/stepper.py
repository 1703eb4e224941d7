"""The machinery every training loop of the recipe shares: precision (autocast and loss scaling), DDP
wrapping with gradients all-reduced once per optimizer step, gradient accumulation, the optimizer step with
non-finite handling, and a SIGTERM-triggered stop. Pre-training and fine-tuning both build on it."""
from __future__ import annotations

import contextlib
import math
import os
import random
import signal
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Optional

import numpy as np
import torch
from torch import nn
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler
from torch.nn.parallel import DistributedDataParallel

from bertrecipe.common.errors import InputError
from bertrecipe.training.optimization import Lamb, global_grad_norm
from bertrecipe.training.process_group import DistributedContext
from bertrecipe.training.sharding import gradient_sync

MAX_CONSECUTIVE_NON_FINITE = 10


def seed_everything(seed: int) -> None:
    """Seeds Python's, NumPy's and torch's generators (torch's on every device) from one integer."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


class TrainingFailure(RuntimeError):
    """Training cannot go on (e.g. the loss stays non-finite); the last good checkpoint is on disk."""


@dataclass
class Precision:
    """autocast dtype (None for fp32) and, for fp16, the dynamic loss scaler."""

    device_type: str
    dtype: Optional[torch.dtype] = None
    scaler: Optional[torch.amp.GradScaler] = None

    @property
    def name(self) -> str:
        return {None: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}[self.dtype]

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.dtype)


def make_precision(device: torch.device, fp16: bool, bf16: bool, init_loss_scale: float = 2.0**20,
                   sharded: bool = False) -> Precision:
    """--fp16/--amp: fp16 autocast with dynamic loss scaling (NVIDIA's default), on CUDA or on a CPU (where it is
    correct but slow: CPUs without AVX512-FP16/AMX-FP16 have no fast fp16 matmul); --bf16: bf16 autocast; else
    fp32. A `sharded` model's scaler decides on overflow from every process's gradients: each holds a shard of
    them, and all must skip the same steps."""
    if fp16 and bf16:
        raise InputError("--fp16/--amp and --bf16 exclude each other: choose one")
    if fp16:
        if device.type not in ("cuda", "cpu"):
            raise InputError(f"--fp16/--amp runs on CUDA or CPU, not on {device.type}")
        if not math.isfinite(init_loss_scale) or init_loss_scale <= 0:
            raise InputError(f"--init_loss_scale {init_loss_scale}: must be a finite number above 0 (e.g. 65536)")
        # GradScaler's defaults are NVIDIA's dynamic scaling: halve on overflow, double after 2000 good steps.
        scaler_class = ShardedGradScaler if sharded else torch.amp.GradScaler
        scaler = scaler_class(device.type, init_scale=init_loss_scale)
        return Precision(device.type, torch.float16, scaler)
    if bf16:
        return Precision(device.type, torch.bfloat16)
    return Precision(device.type)


def allow_tf32(enabled: bool) -> None:
    """NVIDIA's "tf32" precision: fp32 training whose matmuls and convolutions use TF32 tensor cores (Ampere and
    later). torch leaves TF32 matmuls off by default since 1.12, so a tf32 preset has to ask for it; False turns
    them off again (cuDNN's convolutions default to TF32: off too)."""
    torch.backends.cuda.matmul.allow_tf32 = enabled
    torch.backends.cudnn.allow_tf32 = enabled


def use_deterministic_algorithms(enabled: bool) -> None:
    """Bit-reproducible GPU runs (a resume equal to the run that went on, to the last bit): torch's deterministic
    kernels, an error where an op has none, and cuBLAS's deterministic workspace, which its handles read when they
    are created (so before the first matmul; a value already in the environment is kept). Off is torch's default:
    torch's setter is called only to turn it on or back off, since it imports inductor (~2.7 s of CPU a process)."""
    if enabled:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    elif torch.are_deterministic_algorithms_enabled():
        torch.use_deterministic_algorithms(False)


def wrap_ddp(model: nn.Module, ctx: DistributedContext, compress: Optional[torch.dtype] = None) -> nn.Module:
    """DDP over the process group, with gradients optionally all-reduced in fp16 or bf16 to halve traffic."""
    if not ctx.enabled:
        return model
    device_ids = [ctx.local_rank] if ctx.device.type == "cuda" else None
    ddp = DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=True)
    if compress is not None:
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        hook = default_hooks.fp16_compress_hook if compress == torch.float16 else default_hooks.bf16_compress_hook
        ddp.register_comm_hook(state=None, hook=hook)
    return ddp


def unwrap(model: nn.Module) -> nn.Module:
    return model.module if isinstance(model, DistributedDataParallel) else model


@dataclass
class StepResult:
    loss: float  # mean micro-batch loss of this process
    applied: bool  # False when the step was skipped (overflow or non-finite gradients)


@dataclass
class Stepper:
    """Runs one optimizer step over a list of micro-batches: forward/backward under autocast, DDP's all-reduce
    (FSDP's reduce-scatter) on the last micro-batch only, scheduler stepped just before the optimizer (and not for
    a skipped step)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Any
    precision: Precision
    compute_loss: Callable[[nn.Module, Any], torch.Tensor]
    skipped_steps: int = 0
    consecutive_non_finite: int = field(default=0)

    def step(self, micro_batches: list[Any]) -> StepResult:
        count = len(micro_batches)
        total = torch.zeros((), device=next(self.model.parameters()).device)
        scaler = self.precision.scaler
        for index, batch in enumerate(micro_batches):
            last = index == count - 1
            with gradient_sync(self.model, last):
                with self.precision.autocast():
                    loss = self.compute_loss(self.model, batch) / count
                (scaler.scale(loss) if scaler is not None else loss).backward()
            total += loss.detach()
        if scaler is not None:
            scaler.unscale_(self.optimizer)
        norm = global_grad_norm(self.optimizer)
        applied = bool(torch.isfinite(norm))
        # LAMB clips by this very norm: hand it over instead of computing it twice.
        step_kwargs = {"global_grad_norm": norm} if isinstance(self.optimizer, Lamb) else {}
        if applied:
            self.scheduler.step()
            self.consecutive_non_finite = 0
        else:
            self.skipped_steps += 1
            self.consecutive_non_finite += 1
        if scaler is not None:
            scaler.step(self.optimizer, **step_kwargs)  # skips by itself when gradients overflowed
            scaler.update()
        elif applied:
            self.optimizer.step(**step_kwargs)
        elif self.consecutive_non_finite >= MAX_CONSECUTIVE_NON_FINITE:
            raise TrainingFailure(f"the loss was not finite for {self.consecutive_non_finite} steps in a row")
        self.optimizer.zero_grad(set_to_none=True)
        return StepResult(float(total), applied)


def outlive_job_sigterm(worker_id: int) -> None:
    """DataLoader worker_init_fn: a SIGTERM sent to the whole job (Slurm signals every process of it) must not end
    the workers under the main process while it finishes its step and checkpoint, but the main process's own
    SIGTERM at shutdown (torch's way to stop a worker) must. So SIGTERM is taken by a thread that tells the two
    apart by the sender's pid."""
    parent = os.getppid()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})

    def wait_for_parent() -> None:
        while True:
            if signal.sigwaitinfo({signal.SIGTERM}).si_pid == parent:
                os._exit(0)

    threading.Thread(target=wait_for_parent, daemon=True, name="sigterm-filter").start()


class StopSignal:
    """Remembers a SIGTERM (Slurm preemption) so the loop can finish its step, checkpoint and exit 0."""

    def __init__(self) -> None:
        self.requested = False
        self._previous = signal.signal(signal.SIGTERM, self._handle)

    def _handle(self, signum: int, frame: Any) -> None:
        self.requested = True

    def restore(self) -> None:
        signal.signal(signal.SIGTERM, self._previous)


def batches_to_device(batch: dict[str, torch.Tensor], device: torch.device) -> dict[str, torch.Tensor]:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def take(iterator: Iterable[Any], count: int) -> list[Any]:
    items = []
    for item in iterator:
        items.append(item)
        if len(items) == count:
            break
    return items
