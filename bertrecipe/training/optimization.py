"""Optimizers and learning-rate schedules of the recipe: LAMB (the pre-training default), AdamW and StableAdamW
(modern encoders' pre-training, AdamW also fine-tuning); the poly, warmup-stable-decay and linear schedules.

LAMB (You et al., 2019) as NVIDIA's BERT recipe runs it: gradients clipped by one global norm, Adam moments with
bias correction, decoupled weight decay inside the update, and a per-tensor trust ratio ||w|| / ||update||.
The update runs over all tensors of a group at once with `torch._foreach_*` kernels. StableAdamW (Wortsman et al.
2023, ModernBERT's optimizer) is AdamW with AdaFactor's update clipping as a per-tensor learning rate.

Under FSDP (`--sharding fsdp`) each parameter is a DTensor of which a process holds one shard; the updates run on
the local shards, and every quantity of a whole tensor (LAMB's trust ratio, the clipping norm, StableAdamW's RMS)
is the whole tensor's: the shards' squared norms summed over the shard group in one all-reduce per step and group.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Iterable, Optional

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.distributed.tensor import DTensor, Shard

NO_DECAY_NAME_PARTS = ("bias", "LayerNorm", "layer_norm", "gamma", "beta")
# Parameters of these modules never decay, whatever their names (ModernBERT's `attn_norm`, `final_norm`...).
NORM_MODULES = tuple(t for t in (nn.LayerNorm, getattr(nn, "RMSNorm", None)) if t is not None)
OPTIMIZERS = ("lamb", "adamw", "stable_adamw")
LR_SCHEDULES = ("poly", "wsd")
DECAY_SHAPES = ("linear", "1-sqrt")


def local_part(tensor: Tensor) -> Tensor:
    """The part of `tensor` this process holds: a DTensor's local shard, a plain tensor itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def shard_group(tensors: list[Tensor]) -> Optional[dist.ProcessGroup]:
    """The process group over which `tensors` (an optimizer's parameters) are sharded, None when none is a
    DTensor. Only FSDP's layout is taken: every tensor sharded along one dimension of one 1-D mesh."""
    sharded = [t for t in tensors if isinstance(t, DTensor)]
    if not sharded:
        return None
    mesh = sharded[0].device_mesh
    if len(sharded) != len(tensors) or mesh.ndim != 1 or any(
            t.device_mesh != mesh or not isinstance(t.placements[0], Shard) for t in sharded):
        raise ValueError("the optimizers take plain tensors, or DTensors sharded over one 1-D mesh (FSDP's layout)")
    return mesh.get_group()


def whole_tensor_norms(local_tensors: list[Tensor], group: Optional[dist.ProcessGroup]) -> Tensor:
    """The L2 norm of each tensor as a whole (fp32 at least, one per tensor) from the parts this process holds:
    with a shard group, the local norms' squares summed over it in one all-reduce."""
    norms = torch.stack(torch._foreach_norm(local_tensors, 2.0))
    norms = norms.to(torch.promote_types(norms.dtype, torch.float32))
    if group is None:
        return norms
    squares = norms.square()
    dist.all_reduce(squares, group=group)
    return squares.sqrt()


def global_grad_norm(optimizer: torch.optim.Optimizer) -> Tensor:
    """The L2 norm over every gradient of the optimizer's parameters (a 0-dim float32 tensor), sharded or not."""
    params = [p for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    if not params:
        return torch.zeros(())
    norms = whole_tensor_norms([local_part(p.grad) for p in params], shard_group(params))
    return torch.linalg.vector_norm(norms.float(), 2.0)


def weight_decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Two parameter groups: every weight decays by `weight_decay`; biases, LayerNorm parameters (by name, or of
    a NORM_MODULES module whatever its name, with or without a bias) do not."""
    norm_params = {id(p) for m in model.modules() if isinstance(m, NORM_MODULES) for p in m.parameters(recurse=False)}
    decay, no_decay = [], []
    for name, param in model.named_parameters():  # shared (tied) parameters are listed once
        if not param.requires_grad:
            continue
        plain = id(param) in norm_params or any(part in name for part in NO_DECAY_NAME_PARTS)
        (no_decay if plain else decay).append(param)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def _lamb_tensor_update(
    w: Tensor,
    g: Tensor,
    m: Tensor,
    v: Tensor,
    clip: Tensor,
    lr: Tensor,
    step_size: Tensor,
    eps: Tensor,
    beta1: float,
    beta2: float,
    weight_decay: float,
) -> None:
    """The whole LAMB update of one (flattened) tensor, for torch.compile to fuse into two passes over memory
    (the foreach path needs about a dozen). step_size = sqrt(bc2) / bc1 and eps = eps * sqrt(bc2) fold the bias
    corrections in."""
    g = g.float() / clip
    m.lerp_(g, 1 - beta1)
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    update = step_size * m / (v.sqrt() + eps)
    if weight_decay != 0:
        update = update + weight_decay * w
        w_norm, u_norm = torch.linalg.vector_norm(w), torch.linalg.vector_norm(update)
        ratio = torch.where((w_norm > 0) & (u_norm > 0), w_norm / u_norm, torch.ones_like(w_norm))
        w.sub_(lr * ratio * update)
    else:
        w.sub_(lr * update)


_compiled_lamb_update = None


def _compiled_update():
    # One graph for every size (dynamic shapes on 1-D views), so compiling takes seconds, not minutes.
    global _compiled_lamb_update
    if _compiled_lamb_update is None:
        _compiled_lamb_update = torch.compile(_lamb_tensor_update, dynamic=True)
    return _compiled_lamb_update


class Lamb(torch.optim.Optimizer):
    """LAMB with NVIDIA's semantics.

    Per step: g_norm = ||all gradients||_2 over every group; g = grad / max(g_norm / max_grad_norm, 1);
    m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; update = m_hat / (sqrt(v_hat) + eps) + wd w;
    ratio = ||w|| / ||update|| (1 if either is 0, and 1 in groups without weight decay); w -= lr ratio update.

    `compiled=True` runs the update through torch.compile (needs a C++ compiler on CPUs): about 4x faster on a
    CPU, after a one-off compilation of some seconds.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0.01,
        max_grad_norm: float = 1.0,
        compiled: bool = False,
    ) -> None:
        if lr < 0 or eps < 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1:
            raise ValueError(f"invalid LAMB hyper-parameters: lr={lr}, betas={betas}, eps={eps}")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, max_grad_norm=max_grad_norm, step=0)
        super().__init__(params, defaults)
        self.compiled = compiled

    def _global_grad_norm(self) -> Tensor | None:
        if not any(p.grad is not None for g in self.param_groups for p in g["params"]):
            return None
        return global_grad_norm(self)

    def _state_lists(self, params: list[Tensor]) -> tuple[list[Tensor], list[Tensor]]:
        exp_avgs, exp_avg_sqs = [], []
        for p in params:
            state = self.state[p]
            if not state:
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            exp_avgs.append(state["exp_avg"])
            exp_avg_sqs.append(state["exp_avg_sq"])
        return exp_avgs, exp_avg_sqs

    @torch.no_grad()
    def step(self, closure: Any = None, global_grad_norm: Tensor | None = None) -> Any:
        """`global_grad_norm`: the norm over all gradients when the caller has it already (saves a pass)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        global_norm = global_grad_norm if global_grad_norm is not None else self._global_grad_norm()
        if global_norm is None:
            return loss
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("LAMB does not support sparse gradients")
            beta1, beta2 = group["betas"]
            group["step"] += 1
            bias_correction1 = 1 - beta1 ** group["step"]
            bias_correction2 = 1 - beta2 ** group["step"]
            step_size = bias_correction2**0.5 / bias_correction1
            eps = group["eps"] * bias_correction2**0.5
            # Dividing by max(norm / max_grad_norm, 1) leaves gradients alone unless the norm exceeds the limit.
            clip = torch.clamp(global_norm / group["max_grad_norm"], min=1.0)
            exp_avgs, exp_avg_sqs = self._state_lists(params)
            group_of_shards = shard_group(params)
            params, grads = [local_part(p) for p in params], [local_part(p.grad) for p in params]
            exp_avgs, exp_avg_sqs = [local_part(m) for m in exp_avgs], [local_part(v) for v in exp_avg_sqs]
            if self.compiled and group_of_shards is None:
                # A fused kernel per tensor: a loop of calls, but each call makes only two passes over memory.
                device = params[0].device
                scalars = [torch.tensor(x, dtype=torch.float32, device=device) for x in (group["lr"], step_size, eps)]
                update = _compiled_update()
                for w, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs, strict=True):
                    update(w.view(-1), g.reshape(-1), m.view(-1), v.view(-1), clip, *scalars,
                           beta1, beta2, group["weight_decay"])
            else:
                self._foreach_update(params, grads, exp_avgs, exp_avg_sqs, clip, group, step_size, eps,
                                     group_of_shards)
        return loss

    @staticmethod
    def _foreach_update(params, grads, exp_avgs, exp_avg_sqs, clip, group, step_size, eps,
                        shards: Optional[dist.ProcessGroup] = None) -> None:
        beta1, beta2 = group["betas"]
        grads = torch._foreach_div([g.float() for g in grads], clip)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)  # m = b1 m + (1 - b1) g
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denom, eps)
        weight_decay = group["weight_decay"]
        if weight_decay == 0:  # trust ratio 1: one fused pass straight into the weights
            torch._foreach_addcdiv_(params, exp_avgs, denom, value=-group["lr"] * step_size)
            return
        updates = torch._foreach_mul(params, weight_decay)
        torch._foreach_addcdiv_(updates, exp_avgs, denom, value=step_size)
        # The trust ratio of each whole tensor: one all-reduce for both norms of every tensor when sharded.
        weight_norms, update_norms = whole_tensor_norms([*params, *updates], shards).split(len(params))
        ratios = torch.where(
            (weight_norms > 0) & (update_norms > 0), weight_norms / update_norms, torch.ones_like(weight_norms)
        )
        torch._foreach_mul_(updates, list(ratios.unbind()))
        torch._foreach_add_(params, updates, alpha=-group["lr"])


# Below this many parameters the one-off compilation of the LAMB update (seconds) costs more than it saves.
COMPILE_LAMB_MIN_PARAMETERS = 10_000_000


def compiled_lamb_works(device: torch.device) -> Optional[str]:
    """None when torch.compile can build the fused LAMB update here (the graph it builds is the one the
    optimizer reuses for every size), else the reason it cannot (no C++ compiler, no inductor backend...)."""
    try:
        w, g, m, v = (torch.ones(8, device=device) for _ in range(4))
        scalars = [torch.tensor(x, device=device) for x in (1.0, 1e-3, 1.0, 1e-6)]
        _compiled_update()(w, g, m, v, *scalars, 0.9, 0.999, 0.01)
        return None
    except Exception as error:  # any failure of the compiler stack means: use the multi-tensor path
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:200]


def choose_compiled_lamb(param_groups: list[dict[str, Any]], requested: Optional[bool]) -> bool:
    """--compile_optimizer / --no_compile_optimizer, or by default on CPUs for models of
    COMPILE_LAMB_MIN_PARAMETERS or more (a fused update is about 4x faster there); falls back with one line when
    torch.compile does not work on this machine. Never for sharded parameters (the run's flags refuse asking)."""
    params = [p for g in param_groups for p in g["params"]]
    if requested is False or not params or shard_group(params) is not None:
        return False  # the fused update takes whole tensors: shards update through the multi-tensor path
    device = params[0].device
    if requested is None and (device.type != "cpu" or sum(p.numel() for p in params) < COMPILE_LAMB_MIN_PARAMETERS):
        return False
    problem = compiled_lamb_works(device)
    if problem is not None:
        print(f"note: torch.compile cannot fuse the LAMB update here ({problem}); using the multi-tensor LAMB",
              file=sys.stderr, flush=True)
    return problem is None


def build_lamb(param_groups: list[dict[str, Any]], lr: float, compiled: bool = False,
               **kwargs: Any) -> torch.optim.Optimizer:
    """apex's FusedLAMB where apex is importable and the parameters live on CUDA, our LAMB otherwise."""
    on_cuda = any(p.is_cuda for g in param_groups for p in g["params"])
    if on_cuda:
        try:
            from apex.optimizers import FusedLAMB  # type: ignore[import-not-found]
        except ImportError:
            pass
        else:
            return FusedLAMB(param_groups, lr=lr, **kwargs)
    return Lamb(param_groups, lr=lr, compiled=compiled, **kwargs)


def adamw_kernel(param_groups: list[dict[str, Any]]) -> dict[str, bool]:
    """torch's fused AdamW kernel where every tensor allows it (floating point on the CPU or CUDA: one pass over
    memory per tensor, about 5x faster than the multi-tensor path on a CPU), else the multi-tensor one. It is also
    what transformers' Trainer picks by default (`adamw_torch_fused`)."""
    params = [p for g in param_groups for p in g["params"]]
    fused = bool(params) and all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    return {"fused": True} if fused else {"foreach": True}


def build_adamw(model: nn.Module, lr: float, weight_decay: float = 0.01) -> torch.optim.Optimizer:
    """AdamW for fine-tuning, without decay on biases and LayerNorm parameters (adamw_kernel's kernel)."""
    groups = weight_decay_groups(model, weight_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6, **adamw_kernel(groups))


class StableAdamW(torch.optim.Optimizer):
    """StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale vision-language
    models"; ModernBERT's optimizer): AdamW with AdaFactor's update clipping as a per-tensor learning rate, so that a
    tensor whose gradient outgrows its second-moment estimate takes a smaller step (in place of gradient clipping).

    Per step and tensor: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; m_hat, v_hat bias-corrected;
    RMS = sqrt(mean(g^2 / max(v_hat, eps^2))); lr_t = lr / max(1, RMS); w -= lr_t wd w (decoupled, as torch's AdamW
    scales it); w -= lr_t m_hat / (sqrt(v_hat) + eps). State per tensor: step (an int), exp_avg, exp_avg_sq.
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.98),
                 eps: float = 1e-6, weight_decay: float = 0.01) -> None:
        if lr < 0 or eps <= 0 or weight_decay < 0 or not 0 <= betas[0] < 1 or not 0 <= betas[1] < 1:
            raise ValueError(f"invalid StableAdamW hyper-parameters: lr={lr}, betas={betas}, eps={eps}, "
                             f"weight_decay={weight_decay}")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if any(p.grad.is_sparse for p in params):
                raise RuntimeError("StableAdamW does not support sparse gradients")
            if params:
                self._update_group(group, params)
        return loss

    def _update_group(self, group: dict[str, Any], params: list[Tensor]) -> None:
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in params]
        for p, state in zip(params, states, strict=True):
            if not state:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
        shards = shard_group(params)
        sizes = [float(p.numel()) for p in params]  # a DTensor's numel is the whole tensor's
        params, grads = [local_part(p) for p in params], [local_part(p.grad) for p in params]
        exp_avgs = [local_part(s["exp_avg"]) for s in states]
        exp_avg_sqs = [local_part(s["exp_avg_sq"]) for s in states]
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, value=1 - beta2)
        denoms = torch._foreach_sqrt(exp_avg_sqs)  # sqrt(v_hat) = sqrt(v) / sqrt(1 - b2^t)
        torch._foreach_div_(denoms, [math.sqrt(1 - beta2 ** s["step"]) for s in states])
        # RMS = ||g / max(sqrt(v_hat), eps)||_2 / sqrt(n): the same as sqrt(mean(g^2 / max(v_hat, eps^2))).
        ratios = torch._foreach_clamp_min(denoms, group["eps"])
        torch._foreach_reciprocal_(ratios)
        torch._foreach_mul_(ratios, grads)
        norms = whole_tensor_norms(ratios, shards)  # the rates in fp32
        del ratios
        sizes = torch.tensor(sizes, dtype=norms.dtype, device=norms.device)
        # One tensor of per-tensor rates: no host sync, unlike a .item() per tensor.
        lrs = group["lr"] / torch.clamp(norms / sizes.sqrt(), min=1.0)
        if group["weight_decay"] != 0:
            torch._foreach_mul_(params, list((1 - lrs * group["weight_decay"]).unbind()))
        torch._foreach_add_(denoms, group["eps"])
        updates = torch._foreach_div(exp_avgs, denoms)
        del denoms
        bias_corrections = torch.tensor([1 - beta1 ** s["step"] for s in states], dtype=norms.dtype,
                                        device=norms.device)
        torch._foreach_mul_(updates, list((-lrs / bias_corrections).unbind()))
        torch._foreach_add_(params, updates)


def build_adam_optimizer(kind: str, param_groups: list[dict[str, Any]], lr: float, betas: tuple[float, float],
                         eps: float) -> torch.optim.Optimizer:
    """--optimizer adamw (torch's AdamW with adamw_kernel's kernel) or stable_adamw over `param_groups`
    (weight_decay_groups': each group keeps its own decay)."""
    if kind == "stable_adamw":
        return StableAdamW(param_groups, lr=lr, betas=betas, eps=eps)
    if kind != "adamw":
        raise ValueError(f"unknown optimizer {kind!r}; expected one of {OPTIMIZERS}")
    return torch.optim.AdamW(param_groups, lr=lr, betas=betas, eps=eps, **adamw_kernel(param_groups))


def restart_optimizer_steps(optimizer: torch.optim.Optimizer) -> None:
    """Every step count back to 0, the moments kept (the phase-2 hand-off): LAMB counts steps per group, AdamW and
    StableAdamW per tensor."""
    for group in optimizer.param_groups:
        if "step" in group:
            group["step"] = 0
        for param in group["params"]:
            state = optimizer.state.get(param) or {}
            if torch.is_tensor(state.get("step")):
                state["step"].zero_()
            elif "step" in state:
                state["step"] = 0


class _WarmUpScheduler:
    """Sets each group's lr from the number of optimizer steps taken. Call `step()` just before
    `optimizer.step()`; a step that the grad scaler skips must not call it, so the schedule stays on time."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, total_steps: int) -> None:
        if total_steps <= 0:
            raise ValueError(f"total_steps must be positive, got {total_steps}")
        self.optimizer = optimizer
        self.warmup = warmup
        self.total_steps = total_steps
        self.base_lrs = [group.setdefault("initial_lr", group["lr"]) for group in optimizer.param_groups]
        self.last_step = 0
        self._apply()

    def factor(self, progress: float) -> float:
        raise NotImplementedError

    def progress(self) -> float:
        """The fraction of the schedule behind us: optimizer steps over total_steps."""
        return self.last_step / self.total_steps

    def _apply(self) -> None:
        scale = self.factor(self.progress())
        for group, base_lr in zip(self.optimizer.param_groups, self.base_lrs, strict=True):
            group["lr"] = base_lr * scale

    def step(self) -> None:
        self.last_step += 1
        self._apply()

    def get_last_lr(self) -> list[float]:
        return [group["lr"] for group in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step, "base_lrs": list(self.base_lrs), "warmup": self.warmup,
                "total_steps": self.total_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])
        self.base_lrs = list(state["base_lrs"])
        self._apply()

    def set_peak_lr(self, lr: float) -> None:
        """Another peak learning rate for the steps to come (a resume with a new --learning_rate): the schedule
        goes on from the step it is at."""
        self.base_lrs = [lr] * len(self.optimizer.param_groups)
        for group in self.optimizer.param_groups:
            group["initial_lr"] = lr
        self._apply()


class PolyWarmUpScheduler(_WarmUpScheduler):
    """Linear warm-up over `warmup` (a fraction of total_steps), then base_lr * (1 - progress) ** degree."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, total_steps: int, degree: float = 0.5):
        self.degree = degree
        super().__init__(optimizer, warmup, total_steps)

    def factor(self, progress: float) -> float:
        if progress < self.warmup:
            return progress / self.warmup
        return max(1.0 - progress, 0.0) ** self.degree


class LinearWarmUpScheduler(_WarmUpScheduler):
    """Linear warm-up over `warmup`, then linear decay to 0 at total_steps (fine-tuning)."""

    def factor(self, progress: float) -> float:
        if progress < self.warmup:
            return progress / self.warmup
        return max((1.0 - progress) / (1.0 - self.warmup), 0.0) if self.warmup < 1 else 0.0


class TimeBudgetScheduler(LinearWarmUpScheduler):
    """Cramming's budget schedule (Geiping & Goldstein 2022): progress is the share of a wall-clock budget spent,
    not of a step count, so the schedule ends exactly when the time does, whatever the speed of the machine.
    Linear warm-up over `warmup` of the budget, then linear decay to 0 at its end. The training loop sets
    `elapsed_seconds` (the same value on every process) before each step."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, budget_seconds: float,
                 elapsed_seconds: float = 0.0) -> None:
        if not budget_seconds > 0:
            raise ValueError(f"budget_seconds must be positive, got {budget_seconds}")
        self.budget_seconds = budget_seconds
        self.elapsed_seconds = elapsed_seconds
        super().__init__(optimizer, warmup, total_steps=1)

    def progress(self) -> float:
        return min(self.elapsed_seconds / self.budget_seconds, 1.0)


def wsd_factor(progress: float, warmup: float, decay: float, min_ratio: float, shape: str) -> float:
    """Warmup-stable-decay (Hägele et al. 2024): linear warm-up over `warmup` of the run, the peak, then a decay
    over its last `decay` to min_ratio x the peak, linear or 1-sqrt (1 - sqrt(share of the decay done))."""
    if progress < warmup:
        return progress / warmup
    start = 1.0 - decay
    if progress < start or decay == 0:  # no decay: the peak through the last step (a phase that hands on)
        return 1.0
    done = min((progress - start) / decay, 1.0)
    left = 1.0 - (math.sqrt(done) if shape == "1-sqrt" else done)
    return min_ratio + (1.0 - min_ratio) * left


class _WsdShape:
    """The warmup-stable-decay factor for a _WarmUpScheduler, whatever measures its progress (steps or time)."""

    def _set_shape(self, decay: float, min_ratio: float, shape: str) -> None:
        if shape not in DECAY_SHAPES or not 0 <= decay <= 1 or not 0 <= min_ratio <= 1:
            raise ValueError(f"invalid warmup-stable-decay schedule: decay={decay}, min_ratio={min_ratio}, "
                             f"shape={shape!r} (one of {DECAY_SHAPES})")
        self.decay, self.min_ratio, self.shape = decay, min_ratio, shape

    def factor(self, progress: float) -> float:
        return wsd_factor(progress, self.warmup, self.decay, self.min_ratio, self.shape)

    def state_dict(self) -> dict[str, Any]:
        # The shape is recorded, not restored: like warmup and total_steps, the run's flags rule (resume_rules).
        return {**super().state_dict(), "decay": self.decay, "min_ratio": self.min_ratio, "shape": self.shape}


class WarmupStableDecayScheduler(_WsdShape, _WarmUpScheduler):
    """Linear warm-up over `warmup`, constant peak, then decay over the last `decay` of total_steps to
    min_ratio x the peak (`shape`: "linear" or "1-sqrt")."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, total_steps: int, decay: float = 0.1,
                 min_ratio: float = 0.0, shape: str = "linear") -> None:
        self._set_shape(decay, min_ratio, shape)
        super().__init__(optimizer, warmup, total_steps)


class TimeBudgetWsdScheduler(_WsdShape, TimeBudgetScheduler):
    """Warmup-stable-decay over a wall-clock budget: progress is the share of the budget spent, as in
    TimeBudgetScheduler, so the decay takes the budget's last `decay` share."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, budget_seconds: float,
                 elapsed_seconds: float = 0.0, decay: float = 0.1, min_ratio: float = 0.0,
                 shape: str = "linear") -> None:
        self._set_shape(decay, min_ratio, shape)
        super().__init__(optimizer, warmup, budget_seconds, elapsed_seconds)


class _TokenProgress:
    """Progress measured in tokens (--max_tokens): the share of a token budget consumed, as TimeBudgetScheduler's
    is the share of a time budget. The training loop sets `tokens_seen` (all processes' real tokens through the
    step about to be applied, the same value on every process) before each step, so step s's lr is the schedule at
    tokens_through_s / budget, as a step count's is at s / total_steps."""

    def _set_budget(self, budget_tokens: int, tokens_seen: int) -> None:
        if not budget_tokens > 0:
            raise ValueError(f"budget_tokens must be positive, got {budget_tokens}")
        self.budget_tokens = int(budget_tokens)
        self.tokens_seen = int(tokens_seen)

    def progress(self) -> float:
        return min(self.tokens_seen / self.budget_tokens, 1.0)


class TokenBudgetScheduler(_TokenProgress, PolyWarmUpScheduler):
    """The poly schedule over a token budget: linear warm-up over `warmup` of the budget's tokens, then
    base_lr * (1 - progress) ** degree with progress = tokens_seen / budget_tokens."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, budget_tokens: int, tokens_seen: int = 0,
                 degree: float = 0.5) -> None:
        self._set_budget(budget_tokens, tokens_seen)
        super().__init__(optimizer, warmup, total_steps=1, degree=degree)


class TokenBudgetWsdScheduler(_TokenProgress, _WsdShape, _WarmUpScheduler):
    """Warmup-stable-decay over a token budget: the decay takes the budget's last `decay` share of tokens."""

    def __init__(self, optimizer: torch.optim.Optimizer, warmup: float, budget_tokens: int, tokens_seen: int = 0,
                 decay: float = 0.1, min_ratio: float = 0.0, shape: str = "linear") -> None:
        self._set_shape(decay, min_ratio, shape)
        self._set_budget(budget_tokens, tokens_seen)
        super().__init__(optimizer, warmup, total_steps=1)
