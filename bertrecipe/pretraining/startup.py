"""What a pre-training run trains, set up before its first step: the model, LAMB with its schedule and loss
scaler, restored from the checkpoint the run continues, and the model wrapped for DDP."""
from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from bertrecipe.common.errors import InputError
from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.model.weights import load_weights_into, read_weights
from bertrecipe.training import checkpointing
from bertrecipe.training.metric_logger import MetricLogger
from bertrecipe.training.optimization import (
    PolyWarmUpScheduler,
    TimeBudgetScheduler,
    build_lamb,
    choose_compiled_lamb,
    weight_decay_groups,
)
from bertrecipe.training.process_group import DistributedContext
from bertrecipe.training.stepper import Precision, seed_everything, unwrap, wrap_ddp


def build_model(args: argparse.Namespace, config: BertConfig, device: torch.device) -> BertForPreTraining:
    if args.pretrain_dropout is not None:  # the model's own copy: the checkpoint keeps the config's dropout
        config = dataclasses.replace(config, hidden_dropout_prob=args.pretrain_dropout,
                                     attention_probs_dropout_prob=args.pretrain_dropout)
    model = BertForPreTraining(config)
    model.set_checkpoint_activations(args.checkpoint_activations)
    if args.init_checkpoint:
        load_weights_into(model, read_weights(args.init_checkpoint), args.init_checkpoint)
    if args.no_nsp:
        # Frozen, so that neither LAMB nor DDP waits for gradients that never come (DDP would fail on unused
        # parameters); they are saved as they are.
        for param in [*model.bert.pooler.parameters(), *model.cls.seq_relationship.parameters()]:
            param.requires_grad_(False)
    model = model.to(device)
    if args.compile:
        model.compile()  # in place: parameter names, state_dict keys and checkpoints stay the same
    return model



# Where a run without a checkpoint to continue starts; restore_state returns the same keys.
FRESH_START: dict[str, Any] = {"phase_step": 0, "position": 0, "scheduler": None, "rng": None, "scaler": None,
                               "path": None, "skipped_steps": 0, "train_seconds": 0.0}



def restore_state(args: argparse.Namespace, ctx: DistributedContext, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, log: MetricLogger, path: Path,
                  ckpt: dict[str, Any]) -> dict[str, Any]:
    """Loads the checkpoint to resume from; returns where to continue (phase step, stream position, rng) and the
    checkpoint's path, which rotation must keep."""
    unwrap(model).load_state_dict(ckpt["model"])
    fresh = {**FRESH_START, "path": path}
    if "optimizer" not in ckpt:  # evaluation of a weights-only checkpoint (training refused it already)
        log.log("PARAMETER", {"evaluated": str(path)})
        return fresh
    handoff = args.phase2 and not ckpt.get("phase2", False)
    trained_without_nsp = bool((ckpt.get("args") or {}).get("no_nsp", False))
    if trained_without_nsp != args.no_nsp:  # the optimizer holds state for other parameters
        raise InputError(f"{path}: was trained {'with' if trained_without_nsp else 'without'} --no_nsp; continue it "
                         f"the same way, or start from it with --init_checkpoint in a new --output_dir")
    optimizer.load_state_dict(ckpt["optimizer"])
    if handoff:  # phase 1 -> phase 2: same weights and moments, optimizer step and schedule start again
        for group in optimizer.param_groups:
            group["step"] = 0
            group["lr"] = args.learning_rate  # phase 2 has its own peak lr
            group.pop("initial_lr", None)
        log.log("PARAMETER", {"phase2_start_from": str(path)})
        return fresh
    log.log("PARAMETER", {"resumed_from": str(path)})
    per_rank = ckpt.get("rng_per_rank") or ([ckpt["rng"]] if ckpt.get("rng") else [])  # older: rank 0's only
    # Each rank continues its own dropout stream; a rank that the resume added starts one of its own, drawn from
    # (seed, rank, step), since a copy of another rank's would give both the same dropout masks.
    if ctx.rank < len(per_rank):
        rng = per_rank[ctx.rank]
    else:
        seed_everything(int(np.random.SeedSequence([args.seed, ctx.rank, int(ckpt["phase_step"])]).generate_state(1)[0]))
        rng = checkpointing.rng_state()
    return {**fresh, "phase_step": int(ckpt["phase_step"]), "position": int(ckpt["data"]["stream_position"]),
            "scheduler": ckpt.get("scheduler"), "rng": rng, "scaler": ckpt.get("scaler"),
            "skipped_steps": int(ckpt.get("skipped_steps", 0)), "train_seconds": float(ckpt.get("train_seconds", 0.0))}



def set_up_optimizer(args: argparse.Namespace, ctx: DistributedContext, model: torch.nn.Module,
                     precision: Precision, log: MetricLogger, resume_from: Optional[tuple[Path, dict[str, Any]]]
                     ) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, dict[str, Any]]:
    """LAMB, its schedule and the loss scaler, restored from the checkpoint the run continues (see FRESH_START for
    what the returned resume point holds); then the model wrapped for DDP."""
    groups = weight_decay_groups(model, 0.01)
    optimizer = build_lamb(groups, lr=args.learning_rate, compiled=choose_compiled_lamb(groups, args.compile_optimizer))
    resume = dict(FRESH_START)
    if resume_from is not None:
        resume = restore_state(args, ctx, model, optimizer, log, *resume_from)
    # Built after the restore: a phase-2 handoff has just reset the optimizer's lr and step.
    scheduler: PolyWarmUpScheduler | TimeBudgetScheduler
    if args.train_budget_minutes:
        scheduler = TimeBudgetScheduler(optimizer, args.warmup_proportion, args.train_budget_minutes * 60,
                                        resume["train_seconds"])
    else:
        scheduler = PolyWarmUpScheduler(optimizer, args.warmup_proportion, max(args.max_steps, 1))
    if resume["scheduler"] is not None:
        scheduler.load_state_dict(resume["scheduler"])
        scheduler.set_peak_lr(args.learning_rate)  # a changed --learning_rate applies (resume_rules.RULES)
    if resume["scaler"] is not None and precision.scaler is not None:
        precision.scaler.load_state_dict(resume["scaler"])
    compress = None
    if args.allreduce_post_accumulation_fp16:
        compress = torch.bfloat16 if args.bf16 else torch.float16
    return wrap_ddp(model, ctx, compress), optimizer, scheduler, resume

