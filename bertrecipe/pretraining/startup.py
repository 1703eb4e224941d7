"""What a pre-training run trains, set up before its first step from the parsed flags (run_pretraining's `args`):
the model, the optimizer (LAMB, AdamW or StableAdamW) with its schedule and loss scaler, restored from the
checkpoint the run continues, and the model wrapped for DDP; the ResumePoint the loop goes on from; and this
process's share of the sample stream, at that point, with what --dynamic_masking needs."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import h5py
import numpy as np
import torch

from bertrecipe.common.errors import InputError
from bertrecipe.model.families import ModelConfig, is_modern_config, pretraining_model
from bertrecipe.model.weights import load_weights_into, read_weights
from bertrecipe.pretraining import masking
from bertrecipe.pretraining.data import PretrainingData, StepShape, read_rows
from bertrecipe.pretraining.resume_rules import saved_optimizer
from bertrecipe.pretraining.run_tokenizer import refuse_checkpoint_of_another_tokenizer
from bertrecipe.pretraining.shard_schema import ShardInfo, check_run_kinds
from bertrecipe.tokenization.bpe import BpeVocab
from bertrecipe.tokenization.vocab_files import AnyVocab, TokenizerIdentity
from bertrecipe.training import checkpointing
from bertrecipe.training.metric_logger import MetricLogger
from bertrecipe.training.optimization import (
    PolyWarmUpScheduler,
    TimeBudgetScheduler,
    TimeBudgetWsdScheduler,
    TokenBudgetScheduler,
    TokenBudgetWsdScheduler,
    WarmupStableDecayScheduler,
    build_adam_optimizer,
    build_lamb,
    choose_compiled_lamb,
    restart_optimizer_steps,
    weight_decay_groups,
)
from bertrecipe.training.process_group import DistributedContext
from bertrecipe.training.stepper import Precision, seed_everything, unwrap, wrap_ddp


def with_dropout(config: ModelConfig, probability: float) -> ModelConfig:
    """A copy of `config` with every dropout of its family set to `probability`."""
    if is_modern_config(config):
        return dataclasses.replace(config, attention_dropout=probability, embedding_dropout=probability,
                                   mlp_dropout=probability)
    return dataclasses.replace(config, hidden_dropout_prob=probability, attention_probs_dropout_prob=probability)


def build_pretraining_model(args: argparse.Namespace, config: ModelConfig, device: torch.device,
                tokenizer: Optional[TokenizerIdentity] = None) -> torch.nn.Module:
    """The model the flags ask for (args: run_pretraining's), on `device`: --init_checkpoint's weights (refused
    when they record another tokenizer than the run's), the --pretrain_dropout, the NSP head frozen with --no_nsp,
    compiled with --compile."""
    if args.pretrain_dropout is not None:  # the model's own copy: the checkpoint keeps the config's dropout
        config = with_dropout(config, args.pretrain_dropout)
    model = pretraining_model(config)
    model.set_checkpoint_activations(args.checkpoint_activations)
    if args.init_checkpoint:
        weights = read_weights(args.init_checkpoint)
        refuse_checkpoint_of_another_tokenizer(tokenizer, weights.tokenizer, args.init_checkpoint,
                                               args.allow_vocab_mismatch)
        load_weights_into(model, weights, args.init_checkpoint)
    if args.no_nsp and not is_modern_config(config):  # the modern family has no NSP head to freeze
        # Frozen, so that neither LAMB nor DDP waits for gradients that never come (DDP would fail on unused
        # parameters); they are saved as they are.
        for param in [*model.bert.pooler.parameters(), *model.cls.seq_relationship.parameters()]:
            param.requires_grad_(False)
    model = model.to(device)
    if args.compile:
        model.compile()  # in place: parameter names, state_dict keys and checkpoints stay the same
    return model


@dataclass(frozen=True)
class ResumePoint:
    """Where the run's phase goes on from: its start (the defaults) or a checkpoint's training state."""

    path: Optional[Path] = None  # the checkpoint, which rotation must keep
    phase_step: int = 0
    data: Optional[dict[str, Any]] = None  # the sample stream's state (PretrainingData.load_state_dict)
    scheduler: Optional[dict[str, Any]] = None
    scaler: Optional[dict[str, Any]] = None
    rng: Optional[dict[str, Any]] = None  # this rank's generators
    skipped_steps: int = 0
    train_seconds: float = 0.0  # the phase's training time so far
    tokens: int = 0  # the phase's real tokens so far (all processes)


def restore_state(args: argparse.Namespace, ctx: DistributedContext, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, log: MetricLogger, path: Path,
                  ckpt: dict[str, Any]) -> ResumePoint:
    """Loads the checkpoint `ckpt` (read from `path`) into the model and optimizer; returns where the phase goes
    on: the checkpoint's state when the run continues its phase, the phase's start (with the path) when phase 2
    begins from it or when it is only evaluated."""
    unwrap(model).load_state_dict(ckpt["model"])
    fresh = ResumePoint(path=path)
    if "optimizer" not in ckpt:  # evaluation of a weights-only checkpoint (training refused it already)
        log.log("PARAMETER", {"evaluated": str(path)})
        return fresh
    handoff = args.phase2 and not ckpt.get("phase2", False)
    trained_without_nsp = bool((ckpt.get("args") or {}).get("no_nsp", False))
    if trained_without_nsp != args.no_nsp:  # the optimizer holds state for other parameters
        raise InputError(f"{path}: was trained {'with' if trained_without_nsp else 'without'} --no_nsp; continue it "
                         f"the same way, or start from it with --init_checkpoint in a new --output_dir")
    trained_with = saved_optimizer(ckpt)
    if trained_with != args.optimizer:  # its state is another optimizer's (compare_flags says so first on a resume)
        if not args.do_train:  # evaluation needs the weights only
            log.log("PARAMETER", {"evaluated": str(path)})
            return fresh
        raise InputError(f"{path}: was trained with --optimizer {trained_with}, this run has --optimizer "
                         f"{args.optimizer}: the checkpoint holds {trained_with}'s state; continue with --optimizer "
                         f"{trained_with}, or start from it with --init_checkpoint in a new --output_dir")
    load_optimizer_state(optimizer, ckpt["optimizer"])
    if handoff:  # phase 1 -> phase 2: same weights and moments, optimizer step and schedule start again
        restart_optimizer_steps(optimizer)
        for group in optimizer.param_groups:
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
        seed = np.random.SeedSequence([args.seed, ctx.rank, int(ckpt["phase_step"])]).generate_state(1)[0]
        seed_everything(int(seed))
        rng = checkpointing.rng_state()
    return ResumePoint(path, int(ckpt["phase_step"]), ckpt["data"], ckpt.get("scheduler"), ckpt.get("scaler"), rng,
                       int(ckpt.get("skipped_steps", 0)), float(ckpt.get("train_seconds", 0.0)),
                       int(ckpt.get("tokens", 0)))  # older checkpoints: resume_rules refuses a token flag there


# The hyper-parameters that the run's flags set (resume_rules.RULES: applied on a resume), not the checkpoint's.
FLAG_HYPERPARAMETERS = ("betas", "eps", "weight_decay")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> None:
    """The checkpoint's moments and step counts; betas, eps and weight decay stay the flags' (torch would take the
    checkpoint's)."""
    ours = [{key: group[key] for key in FLAG_HYPERPARAMETERS if key in group} for group in optimizer.param_groups]
    optimizer.load_state_dict(state)
    for group, values in zip(optimizer.param_groups, ours, strict=True):
        group.update(values)


def build_optimizer(args: argparse.Namespace, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """--optimizer over `groups` at --learning_rate: LAMB (apex's on CUDA where installed, fused by torch.compile as
    --compile_optimizer says), or AdamW / StableAdamW with --adam_beta1, --adam_beta2 and --adam_epsilon."""
    if args.optimizer == "lamb":
        return build_lamb(groups, lr=args.learning_rate, compiled=choose_compiled_lamb(groups, args.compile_optimizer))
    return build_adam_optimizer(args.optimizer, groups, args.learning_rate, (args.adam_beta1, args.adam_beta2),
                                args.adam_epsilon)


def build_scheduler(args: argparse.Namespace, optimizer: torch.optim.Optimizer, resume: ResumePoint) -> Any:
    """--lr_schedule over --max_steps, over --max_tokens (progress in tokens), or over --train_budget_minutes of
    training time (poly: Cramming's linear decay; wsd: warmup-stable-decay in time), at the step (tokens, time)
    the run resumes from."""
    budget = args.train_budget_minutes * 60
    scheduler: PolyWarmUpScheduler | TimeBudgetScheduler | WarmupStableDecayScheduler | TokenBudgetScheduler
    shape = {"decay": args.decay_proportion, "min_ratio": args.min_lr_ratio, "shape": args.decay_shape}
    if args.max_tokens:  # the flags refuse --max_tokens with --train_budget_minutes
        scheduler = (TokenBudgetWsdScheduler(optimizer, args.warmup_proportion, args.max_tokens, resume.tokens,
                                             **shape) if args.lr_schedule == "wsd"
                     else TokenBudgetScheduler(optimizer, args.warmup_proportion, args.max_tokens, resume.tokens))
    elif args.lr_schedule == "wsd":
        if budget:
            scheduler = TimeBudgetWsdScheduler(optimizer, args.warmup_proportion, budget, resume.train_seconds,
                                               **shape)
        else:
            scheduler = WarmupStableDecayScheduler(optimizer, args.warmup_proportion, max(args.max_steps, 1), **shape)
    elif budget:
        scheduler = TimeBudgetScheduler(optimizer, args.warmup_proportion, budget, resume.train_seconds)
    else:
        scheduler = PolyWarmUpScheduler(optimizer, args.warmup_proportion, max(args.max_steps, 1))
    if resume.scheduler is not None:
        scheduler.load_state_dict(resume.scheduler)
        scheduler.set_peak_lr(args.learning_rate)  # a changed --learning_rate applies (resume_rules.RULES)
    return scheduler


def set_up_optimizer(args: argparse.Namespace, ctx: DistributedContext, model: torch.nn.Module,
                     precision: Precision, log: MetricLogger, resume_from: Optional[tuple[Path, dict[str, Any]]]
                     ) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, ResumePoint]:
    """The optimizer, its schedule and the loss scaler, restored from the checkpoint `resume_from` (path, content)
    when the run has one; then the model wrapped for DDP. Returns those and where the phase goes on."""
    groups = weight_decay_groups(model, args.weight_decay)
    optimizer = build_optimizer(args, groups)
    resume = ResumePoint()
    if resume_from is not None:
        resume = restore_state(args, ctx, model, optimizer, log, *resume_from)
    # Built after the restore: a phase-2 handoff has just reset the optimizer's lr and step.
    scheduler = build_scheduler(args, optimizer, resume)
    if resume.scaler is not None and precision.scaler is not None:
        precision.scaler.load_state_dict(resume.scaler)
    compress = None
    if args.allreduce_post_accumulation_fp16:
        compress = torch.bfloat16 if args.bf16 else torch.float16
    return wrap_ddp(model, ctx, compress), optimizer, scheduler, resume


def masking_spec(args: argparse.Namespace, shards: list, config: ModelConfig, vocab: Optional[AnyVocab],
                 warn: bool = True) -> Optional[masking.MaskingSpec]:
    """What --dynamic_masking needs: the special and mask ids, from --vocab_file (loaded: `vocab`, a vocab.txt or a
    tokenizer.json), the attributes of document-chunk shards or read off the first shard. Refuses a mix of shard
    kinds, and document chunks without --no_nsp."""
    check_run_kinds(shards, args.no_nsp)  # document chunks without --dynamic_masking: inspect_shard refused them
    if not args.dynamic_masking:
        return None
    wanted = round(args.max_seq_length * args.masked_lm_prob)
    if warn and wanted > args.max_predictions_per_seq:
        print(f"warning: --max_predictions_per_seq {args.max_predictions_per_seq} caps --masked_lm_prob "
              f"{args.masked_lm_prob} at {args.max_predictions_per_seq / args.max_seq_length:.3f} of a full "
              f"{args.max_seq_length}-token sequence; pass --max_predictions_per_seq {wanted} for the full rate",
              file=sys.stderr, flush=True)
    try:
        if isinstance(vocab, BpeVocab):  # byte-level BPE: no '##' pieces to find whole words by
            if args.whole_word_masking:
                raise InputError(f"{args.vocab_file}: --whole_word_masking finds words by WordPiece's '##' pieces, "
                                 "which a tokenizer.json has none of; drop the flag")
            return masking.spec_from_special_ids(vocab.id("[CLS]"), vocab.id("[SEP]"), vocab.id("[PAD]"),
                                                 vocab.id("[MASK]"), len(vocab), args.masked_lm_prob,
                                                 args.max_predictions_per_seq)
        if vocab is not None:
            return masking.spec_from_vocab(vocab.tokens, args.masked_lm_prob, args.max_predictions_per_seq,
                                           args.whole_word_masking)
        special = shards[0].special
        if special is not None:  # a document-chunk shard records its ids: it holds no [MASK] to find them by
            return masking.spec_from_special_ids(special.cls, special.sep, special.pad, special.mask,
                                                 special.vocab_size, args.masked_lm_prob, args.max_predictions_per_seq)
        with h5py.File(shards[0].path, "r") as f:  # its first rows show the special ids: no need to read it whole
            rows = read_rows(shards[0], f, 0, min(shards[0].num_samples, 4096), config.vocab_size)
        return masking.spec_from_shard(rows, config.vocab_size, args.masked_lm_prob, args.max_predictions_per_seq)
    except ValueError as error:
        raise InputError(f"{args.vocab_file or shards[0].path}: cannot set up --dynamic_masking ({error})") from None


def sample_stream(args: argparse.Namespace, ctx: DistributedContext, shards: list[ShardInfo],
                  spec: Optional[masking.MaskingSpec], resume: ResumePoint, steps: int,
                  vocab_size: int) -> PretrainingData:
    """This process's share of the training stream for `steps` steps, at the position the run resumes from."""
    shape = StepShape(args.train_batch_size // args.gradient_accumulation_steps, args.gradient_accumulation_steps,
                      ctx.world_size, ctx.rank)
    data = PretrainingData(shards, args.seed, shape, args.data_lanes, vocab_size, max_steps=steps,
                           masking_spec=spec, bin_by_length=args.bin_by_length,
                           pack_sequences=args.pack_sequences)
    if resume.data is not None:
        data.load_state_dict(resume.data)
    return data
