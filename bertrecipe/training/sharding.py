"""Fully sharded data parallelism (`--sharding fsdp`): torch's FSDP2 (`fully_shard` over DTensor) per encoder layer
and at the root, so that each process holds 1/W of the parameters, gradients and optimizer state instead of DDP's
whole copy. Parameters are gathered for each layer's forward and backward and their gradients reduce-scattered
once per optimizer step (gradient accumulation syncs on the last micro-batch only, as DDP's no_sync does).

The optimizers (training/optimization.py) run on the local shards with whole-tensor norms, so that LAMB over
shards is LAMB. Checkpoints are folders that every process writes its shards into (model/sharded_checkpoint.py);
a resume on any number of processes, sharded or not, reads its slices of them, or shards a whole single-file
checkpoint again.
"""
from __future__ import annotations

import contextlib
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor, distribute_tensor

from bertrecipe.model import sharded_checkpoint
from bertrecipe.model.families import encoder_of, layers_of
from bertrecipe.training.process_group import DistributedContext

SHARDING = ("ddp", "fsdp")


def shard_model(model: nn.Module, ctx: DistributedContext, compute_dtype: Optional[torch.dtype] = None) -> nn.Module:
    """FSDP2 over every process: each encoder layer a unit of its own, the rest (embeddings, heads, tied decoder)
    the root's. In place: parameter names and state_dict keys stay the model's. With a compute_dtype (--bf16,
    --fp16) the layers are gathered in it and compute in it, while the gradients are reduce-scattered in fp32 into
    fp32 shards, which the optimizer updates (FSDP's mixed-precision policy: half the gather traffic and memory)."""
    # The first process's weights for all, as DDP does: each process seeds its own generators (dropout), so a
    # model initialised at random differs from one process to the next.
    with torch.no_grad():
        for tensor in [*model.parameters(), *model.buffers()]:
            dist.broadcast(tensor, src=0)
    mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32 if compute_dtype else None)
    for layer in layers_of(encoder_of(model)):
        fully_shard(layer, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def is_sharded(model: nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def gradient_sync(model: nn.Module, enabled: bool) -> contextlib.AbstractContextManager:
    """A context in which backward reduces gradients across processes (`enabled`) or only accumulates them
    locally: DDP's no_sync, FSDP2's requires_gradient_sync."""
    if enabled:
        return contextlib.nullcontext()
    if is_sharded(model):
        return _without_gradient_sync(model)
    return model.no_sync() if hasattr(model, "no_sync") else contextlib.nullcontext()


@contextlib.contextmanager
def _without_gradient_sync(model: FSDPModule):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def sharding_active(sharding: str, ctx: DistributedContext) -> bool:
    """Whether --sharding shards this run: fsdp on more than one process (one process has nothing to shard)."""
    return sharding == "fsdp" and ctx.enabled


def load_full_model_state(model: nn.Module, state: dict[str, torch.Tensor]) -> None:
    """Loads a whole (unsharded) state dict into a sharded model: each process keeps its shard of each tensor."""
    own = model.state_dict()
    sharded = {name: distribute_tensor(value.to(own[name].device_mesh.device_type), own[name].device_mesh,
                                       own[name].placements, src_data_rank=None)
               if name in own and isinstance(own[name], DTensor) else value for name, value in state.items()}
    model.load_state_dict(sharded)


def load_model_state(model: nn.Module, state: dict[str, torch.Tensor] | sharded_checkpoint.ShardedTensors) -> None:
    """A checkpoint's state into the model, sharded or not: a whole state dict, or a sharded checkpoint's tensors
    (each process reads the slices it holds)."""
    if isinstance(state, sharded_checkpoint.ShardedTensors):
        sharded_checkpoint.load_model(model, state)
    elif is_sharded(model):
        load_full_model_state(model, state)
    else:
        model.load_state_dict(state)


def shard_optimizer_state(optimizer: torch.optim.Optimizer) -> None:
    """After optimizer.load_state_dict of a whole state: each state tensor shaped as its sharded parameter becomes
    that parameter's shard (every process read the same checkpoint, so no data moves)."""
    for group in optimizer.param_groups:
        for param in group["params"]:
            if not isinstance(param, DTensor):
                continue
            entry = optimizer.state.get(param, {})
            for key, value in entry.items():
                if torch.is_tensor(value) and not isinstance(value, DTensor) and value.shape == param.shape:
                    entry[key] = distribute_tensor(value.to(param.device_mesh.device_type), param.device_mesh,
                                                   param.placements, src_data_rank=None)
