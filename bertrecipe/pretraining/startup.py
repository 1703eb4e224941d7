"""What a pre-training run trains, set up before its first step from its settings (settings.PretrainingSettings):
the model, the optimizer (LAMB, AdamW or StableAdamW) with its schedule and loss scaler, restored from the
checkpoint the run continues, and the model wrapped for DDP; the ResumePoint the loop goes on from; and this
process's share of the sample stream, at that point, with what --dynamic_masking needs."""
from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import h5py
import numpy as np
import torch

from bertrecipe.common.errors import InputError
from bertrecipe.model import sharded_checkpoint
from bertrecipe.model.families import ModelConfig, is_modern_config, pretraining_model
from bertrecipe.model.weights import LoadedWeights, load_weights_into, read_weights
from bertrecipe.pretraining import masking
from bertrecipe.pretraining.data import PretrainingData, StepShape, read_rows
from bertrecipe.pretraining.resume_rules import saved_optimizer
from bertrecipe.pretraining.run_tokenizer import TextCasing, check_init_checkpoint_tokenizer
from bertrecipe.pretraining.settings import ModelSettings, OptimizerSettings, PretrainingSettings, StreamSettings
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
from bertrecipe.training.sharding import load_model_state, shard_model, shard_optimizer_state, sharding_active
from bertrecipe.training.stepper import Precision, seed_everything, unwrap, wrap_ddp


def with_dropout(config: ModelConfig, probability: float) -> ModelConfig:
    """A copy of `config` with every dropout of its family set to `probability`."""
    if is_modern_config(config):
        return dataclasses.replace(config, attention_dropout=probability, embedding_dropout=probability,
                                   mlp_dropout=probability)
    return dataclasses.replace(config, hidden_dropout_prob=probability, attention_probs_dropout_prob=probability)


def read_init_checkpoint(settings: ModelSettings, config: ModelConfig, tokenizer: Optional[TokenizerIdentity],
                         casing: Optional[TextCasing], allow_vocab_mismatch: bool,
                         warn: bool = True) -> Optional[LoadedWeights]:
    """--init_checkpoint's weights (None without the flag), read before the run's first write and refused when their
    config computes otherwise than `config` (refuse_another_function), or when they were trained with another
    tokenizer or casing than the run's, unless allow_vocab_mismatch (run_tokenizer.check_init_checkpoint_tokenizer;
    `warn`: print its warnings)."""
    if not settings.init_checkpoint:
        return None
    weights = read_weights(settings.init_checkpoint)
    refuse_another_function(weights.config, config, settings.init_checkpoint, settings.config_file)
    check_init_checkpoint_tokenizer(weights, settings.init_checkpoint, tokenizer, casing, allow_vocab_mismatch, warn)
    return weights


# Config keys that change what the weights compute without changing a shape (load_weights_into checks shapes).
FUNCTION_KEYS = ("hidden_act", "layer_norm_eps", "hidden_activation", "norm_eps")


def refuse_another_function(theirs: Optional[ModelConfig], ours: ModelConfig, source: str, config_file: str) -> None:
    """One line naming both files when the checkpoint's config (its folder's config.json, our checkpoint's record)
    has another activation or normalisation epsilon than --config_file's: the weights would compute another
    function than the one they were trained as."""
    if theirs is None:
        return
    recorded, given = theirs.to_dict(), ours.to_dict()
    changed = [f"{key} {recorded[key]} -> {given[key]}" for key in FUNCTION_KEYS
               if key in recorded and key in given and recorded[key] != given[key]]
    if changed:
        raise InputError(f"{source}: its config differs from {config_file} in what the weights compute "
                         f"({'; '.join(changed)}); pass the checkpoint's own config as --config_file")


def build_pretraining_model(settings: ModelSettings, config: ModelConfig, device: torch.device,
                            init_weights: Optional[LoadedWeights] = None, warn: bool = True,
                            init_source: Optional[str] = None) -> torch.nn.Module:
    """The model the settings ask for, on `device`: --init_checkpoint's weights (`init_weights` as
    read_init_checkpoint read them, else read here; or an objective's, named `init_source`), with a warning for
    each head they lack and the weights they hold beyond the model (when `warn`), the --pretrain_dropout, the NSP
    head frozen with --no_nsp, compiled with --compile."""
    if settings.pretrain_dropout is not None:  # the model's own copy: the checkpoint keeps the config's dropout
        config = with_dropout(config, settings.pretrain_dropout)
    model = pretraining_model(config)
    model.set_checkpoint_activations(settings.checkpoint_activations)
    if settings.init_checkpoint or init_weights is not None:  # the flag's, or an objective's (a teacher's layers)
        weights = init_weights or read_weights(settings.init_checkpoint)
        source = settings.init_checkpoint or init_source or "the initial weights"
        missing = load_weights_into(model, weights, source)
        if warn:
            warn_of_partial_weights(model, weights, missing, source, settings.no_nsp)
    if settings.no_nsp and not is_modern_config(config):  # the modern family has no NSP head to freeze
        # Frozen, so that neither LAMB nor DDP waits for gradients that never come (DDP would fail on unused
        # parameters); they are saved as they are.
        for param in [*model.bert.pooler.parameters(), *model.cls.seq_relationship.parameters()]:
            param.requires_grad_(False)
    model = model.to(device)
    if settings.compile:
        model.compile()  # in place: parameter names, state_dict keys and checkpoints stay the same
    return model


MASKED_LM_HEAD, NSP_HEAD, OTHER_WEIGHTS = "masked-LM head", "next-sentence head", "other weights"
# The weights of each head of the pre-training models (both families) by name; the rest is the encoder.
HEAD_PREFIXES = {MASKED_LM_HEAD: ("cls.predictions.", "head.", "decoder."),
                 NSP_HEAD: ("bert.pooler.", "cls.seq_relationship.")}
SHOWN_AS_GROUP = ("cls.predictions.transform.", "bert.pooler.", "cls.seq_relationship.", "head.")  # prefix.*
MASKED_LM_NOTE = ("the decoder is the word embeddings (tied), so only the transform and the output bias are new, and "
                  "the first losses can exceed ln(vocab_size), a uniform guess's")
MOST_NAMES_SHOWN = 6


def head_groups(names: list[str]) -> dict[str, list[str]]:
    """Weight names by the head they belong to (OTHER_WEIGHTS for the rest), each head's layers shown as
    `prefix.*`, in a fixed order."""
    groups: dict[str, set[str]] = {}
    for name in names:
        head = next((h for h, prefixes in HEAD_PREFIXES.items() if name.startswith(prefixes)), OTHER_WEIGHTS)
        groups.setdefault(head, set()).add(next((p + "*" for p in SHOWN_AS_GROUP if name.startswith(p)), name))
    order = [MASKED_LM_HEAD, NSP_HEAD, OTHER_WEIGHTS]
    return {head: sorted(groups[head]) for head in order if head in groups}


def warn_of_partial_weights(model: torch.nn.Module, weights: LoadedWeights, missing: list[str], source: str,
                            no_nsp: bool) -> None:
    """One line per head the init checkpoint lacks (a sentence-transformers or bare BertModel folder has neither:
    each starts at random), and one naming the weights it holds that the model has no place for (a task head),
    which are dropped. The NSP head is left unsaid under --no_nsp, where it is frozen and unused."""
    for head, names in head_groups(missing).items():
        if head == NSP_HEAD and no_nsp:
            continue
        lacks = (f"lacks {', '.join(names)}: they start at random" if head == OTHER_WEIGHTS
                 else f"no {head} ({', '.join(names)}): it starts at random")
        note = f"; {MASKED_LM_NOTE}" if head == MASKED_LM_HEAD else ""
        print(f"warning: {source}: {lacks}{note}", file=sys.stderr, flush=True)
    own = model.state_dict()
    dropped = sorted(name for name in weights.state_dict if name not in own)
    if dropped:
        shown = ", ".join(dropped[:MOST_NAMES_SHOWN]) + (", ..." if len(dropped) > MOST_NAMES_SHOWN else "")
        print(f"warning: {source}: {len(dropped)} weights the model has no place for are dropped: {shown}",
              file=sys.stderr, flush=True)


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


def restore_state(settings: PretrainingSettings, ctx: DistributedContext, model: torch.nn.Module,
                  optimizer: torch.optim.Optimizer, log: MetricLogger, path: Path,
                  ckpt: dict[str, Any]) -> ResumePoint:
    """Loads the checkpoint `ckpt` (read from `path`) into the model and optimizer; returns where the phase goes
    on: the checkpoint's state when the run continues its phase, the phase's start (with the path) when phase 2
    begins from it or when it is only evaluated."""
    load_model_state(unwrap(model), ckpt["model"])
    fresh = ResumePoint(path=path)
    if "optimizer" not in ckpt or not continues_optimizer_state(settings, path, ckpt):
        log.log("PARAMETER", {"evaluated": str(path)})  # the weights alone
        return fresh
    load_optimizer_state(optimizer, ckpt["optimizer"], unwrap(model))
    if settings.run.phase2 and not ckpt.get("phase2", False):
        # phase 1 -> phase 2: same weights and moments; the optimizer's step and the schedule start again
        restart_optimizer_steps(optimizer)
        for group in optimizer.param_groups:
            group["lr"] = settings.optimizer.learning_rate  # phase 2 has its own peak lr
            group.pop("initial_lr", None)
        log.log("PARAMETER", {"phase2_start_from": str(path)})
        return fresh
    log.log("PARAMETER", {"resumed_from": str(path)})
    return ResumePoint(path, int(ckpt["phase_step"]), ckpt["data"], ckpt.get("scheduler"), ckpt.get("scaler"),
                       rank_rng(settings.stream.seed, ctx.rank, ckpt), int(ckpt.get("skipped_steps", 0)),
                       float(ckpt.get("train_seconds", 0.0)),
                       int(ckpt.get("tokens", 0)))  # older checkpoints: resume_rules refuses a token flag there


def continues_optimizer_state(settings: PretrainingSettings, path: Path, ckpt: dict[str, Any]) -> bool:
    """True when the run goes on with the checkpoint's optimizer state; False when it only evaluates the weights
    of another optimizer's checkpoint; InputError when training cannot go on with it (other heads trained, another
    optimizer: compare_flags says so first on a resume)."""
    trained_without_nsp = bool((ckpt.get("args") or {}).get("no_nsp", False))
    if trained_without_nsp != settings.model.no_nsp:  # the optimizer holds state for other parameters
        raise InputError(f"{path}: was trained {'with' if trained_without_nsp else 'without'} --no_nsp; continue it "
                         f"the same way, or start from it with --init_checkpoint in a new --output_dir")
    trained_with, ours = saved_optimizer(ckpt), settings.optimizer.optimizer
    if trained_with == ours:
        return True
    if not settings.run.do_train:  # evaluation needs the weights only
        return False
    raise InputError(f"{path}: was trained with --optimizer {trained_with}, this run has --optimizer {ours}: the "
                     f"checkpoint holds {trained_with}'s state; continue with --optimizer {trained_with}, or start "
                     "from it with --init_checkpoint in a new --output_dir")


def rank_rng(seed: int, rank: int, ckpt: dict[str, Any]) -> dict[str, Any]:
    """This rank's dropout stream of the checkpoint. A rank that the resume added starts one of its own, drawn from
    (seed, rank, step), since a copy of another rank's would give both the same dropout masks."""
    per_rank = ckpt.get("rng_per_rank") or ([ckpt["rng"]] if ckpt.get("rng") else [])  # older: rank 0's only
    if rank < len(per_rank):
        return per_rank[rank]
    seed_everything(int(np.random.SeedSequence([seed, rank, int(ckpt["phase_step"])]).generate_state(1)[0]))
    return checkpointing.rng_state()


# The hyper-parameters that the run's flags set (resume_rules.RULES: applied on a resume), not the checkpoint's.
FLAG_HYPERPARAMETERS = ("betas", "eps", "weight_decay")


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict[str, Any],
                         model: Optional[torch.nn.Module] = None) -> None:
    """The checkpoint's moments and step counts (a sharded checkpoint's, whose parameters are named by `model`:
    each process reads its slices); betas, eps and weight decay stay the flags' (torch would take the
    checkpoint's)."""
    ours = [{key: group[key] for key in FLAG_HYPERPARAMETERS if key in group} for group in optimizer.param_groups]
    if isinstance(state.get("state"), sharded_checkpoint.ShardedTensors):  # model is then always given
        state = sharded_checkpoint.optimizer_state_dict(state, model, optimizer)
    optimizer.load_state_dict(state)
    shard_optimizer_state(optimizer)  # a sharded model's optimizer keeps its shard of each moment
    for group, values in zip(optimizer.param_groups, ours, strict=True):
        group.update(values)


def build_optimizer(settings: OptimizerSettings, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
    """--optimizer over `groups` at --learning_rate: LAMB (apex's on CUDA where installed, fused by torch.compile as
    --compile_optimizer says), or AdamW / StableAdamW with --adam_beta1, --adam_beta2 and --adam_epsilon."""
    if settings.optimizer == "lamb":
        compiled = choose_compiled_lamb(groups, settings.compile_optimizer)
        return build_lamb(groups, lr=settings.learning_rate, compiled=compiled)
    return build_adam_optimizer(settings.optimizer, groups, settings.learning_rate,
                                (settings.adam_beta1, settings.adam_beta2), settings.adam_epsilon)


def build_scheduler(settings: OptimizerSettings, optimizer: torch.optim.Optimizer, resume: ResumePoint) -> Any:
    """--lr_schedule over --max_steps, over --max_tokens (progress in tokens), or over --train_budget_minutes of
    training time (poly: Cramming's linear decay; wsd: warmup-stable-decay in time), at the step (tokens, time)
    the run resumes from."""
    budget, warmup = settings.train_budget_minutes * 60, settings.warmup_proportion
    scheduler: PolyWarmUpScheduler | TimeBudgetScheduler | WarmupStableDecayScheduler | TokenBudgetScheduler
    shape = {"decay": settings.decay_proportion, "min_ratio": settings.min_lr_ratio, "shape": settings.decay_shape}
    wsd = settings.lr_schedule == "wsd"
    if settings.max_tokens:  # the flags refuse --max_tokens with --train_budget_minutes
        scheduler = (TokenBudgetWsdScheduler(optimizer, warmup, settings.max_tokens, resume.tokens, **shape) if wsd
                     else TokenBudgetScheduler(optimizer, warmup, settings.max_tokens, resume.tokens))
    elif wsd and budget:
        scheduler = TimeBudgetWsdScheduler(optimizer, warmup, budget, resume.train_seconds, **shape)
    elif wsd:
        scheduler = WarmupStableDecayScheduler(optimizer, warmup, max(settings.max_steps, 1), **shape)
    elif budget:
        scheduler = TimeBudgetScheduler(optimizer, warmup, budget, resume.train_seconds)
    else:
        scheduler = PolyWarmUpScheduler(optimizer, warmup, max(settings.max_steps, 1))
    if resume.scheduler is not None:
        scheduler.load_state_dict(resume.scheduler)
        scheduler.set_peak_lr(settings.learning_rate)  # a changed --learning_rate applies (resume_rules.RULES)
    return scheduler


def set_up_optimizer(settings: PretrainingSettings, ctx: DistributedContext, model: torch.nn.Module,
                     precision: Precision, log: MetricLogger, resume_from: Optional[tuple[Path, dict[str, Any]]]
                     ) -> tuple[torch.nn.Module, torch.optim.Optimizer, Any, ResumePoint]:
    """The optimizer, its schedule and the loss scaler, restored from the checkpoint `resume_from` (path, content)
    when the run has one, with the model wrapped for DDP (after the restore) or sharded by FSDP (before it: the
    optimizer holds the shards). Returns those and where the phase goes on."""
    sharded = sharding_active(settings.device.sharding, ctx)
    if sharded:
        model = shard_model(model, ctx, precision.dtype)
    groups = weight_decay_groups(model, settings.optimizer.weight_decay)
    optimizer = build_optimizer(settings.optimizer, groups)
    resume = ResumePoint()
    if resume_from is not None:
        resume = restore_state(settings, ctx, model, optimizer, log, *resume_from)
    # Built after the restore: a phase-2 handoff has just reset the optimizer's lr and step.
    scheduler = build_scheduler(settings.optimizer, optimizer, resume)
    if resume.scaler is not None and precision.scaler is not None:
        precision.scaler.load_state_dict(resume.scaler)
    if sharded:
        return model, optimizer, scheduler, resume
    compress = None
    if settings.device.allreduce_post_accumulation_fp16:
        compress = torch.bfloat16 if settings.device.bf16 else torch.float16
    return wrap_ddp(model, ctx, compress), optimizer, scheduler, resume


def masking_spec(settings: StreamSettings, shards: list, config: ModelConfig, vocab: Optional[AnyVocab],
                 masked_lm_only: bool, warn: bool = True) -> Optional[masking.MaskingSpec]:
    """What --dynamic_masking needs: the special and mask ids, from --vocab_file (loaded: `vocab`, a vocab.txt or a
    tokenizer.json), the attributes of document-chunk shards or read off the first shard. Refuses a mix of shard
    kinds, and document chunks in a run that trains next-sentence prediction (not `masked_lm_only`)."""
    check_run_kinds(shards, masked_lm_only)  # document chunks without --dynamic_masking: inspect_shard refused them
    if not settings.dynamic_masking:
        return None
    predictions, length = settings.max_predictions_per_seq, settings.max_seq_length
    highest = max(settings.masked_lm_prob, settings.masked_lm_prob_end or 0.0)  # a schedule's highest rate
    wanted = round(length * highest)
    if warn and wanted > predictions:
        print(f"warning: --max_predictions_per_seq {predictions} caps --masked_lm_prob {highest} at "
              f"{predictions / length:.3f} of a full {length}-token sequence; pass --max_predictions_per_seq "
              f"{wanted} for the full rate", file=sys.stderr, flush=True)
    rate = settings.masked_lm_prob
    try:
        if isinstance(vocab, BpeVocab):  # byte-level BPE: no '##' pieces to find whole words by
            if settings.whole_word_masking:
                raise InputError(f"{settings.vocab_file}: --whole_word_masking finds words by WordPiece's '##' "
                                 "pieces, which a tokenizer.json has none of; drop the flag")
            return masking.spec_from_special_ids(vocab.id("[CLS]"), vocab.id("[SEP]"), vocab.id("[PAD]"),
                                                 vocab.id("[MASK]"), len(vocab), rate, predictions)
        if vocab is not None:
            return masking.spec_from_vocab(vocab.tokens, rate, predictions, settings.whole_word_masking)
        special = shards[0].special
        if special is not None:  # a document-chunk shard records its ids: it holds no [MASK] to find them by
            return masking.spec_from_special_ids(special.cls, special.sep, special.pad, special.mask,
                                                 special.vocab_size, rate, predictions)
        with h5py.File(shards[0].path, "r") as f:  # its first rows show the special ids: no need to read it whole
            rows = read_rows(shards[0], f, 0, min(shards[0].num_samples, 4096), config.vocab_size)
        return masking.spec_from_shard(rows, config.vocab_size, rate, predictions)
    except ValueError as error:
        raise InputError(f"{settings.vocab_file or shards[0].path}: cannot set up --dynamic_masking ({error})"
                         ) from None


def mask_schedule(settings: StreamSettings, phase_steps: int) -> masking.MaskSchedule:
    """The mask rate of each step of a phase of `phase_steps` steps (--max_steps): --masked_lm_prob to
    --masked_lm_prob_end along --masked_lm_prob_schedule."""
    start = settings.masked_lm_prob
    end = start if settings.masked_lm_prob_end is None else settings.masked_lm_prob_end
    return masking.MaskSchedule(start, end, settings.masked_lm_prob_schedule, phase_steps)


def sample_stream(settings: StreamSettings, lanes: int, ctx: DistributedContext, shards: list[ShardInfo],
                  spec: Optional[masking.MaskingSpec], resume: ResumePoint, steps: int,
                  vocab_size: int, phase_steps: int) -> PretrainingData:
    """This process's share of the training stream (of `lanes` lanes) for `steps` steps, at the position the run
    resumes from; with dynamic masking, at the rate of each step of the phase's `phase_steps`."""
    shape = StepShape(settings.micro_batch, settings.gradient_accumulation_steps, ctx.world_size, ctx.rank)
    schedule = mask_schedule(settings, phase_steps) if spec is not None else None
    data = PretrainingData(shards, settings.seed, shape, lanes, vocab_size, max_steps=steps, masking_spec=spec,
                           bin_by_length=settings.bin_by_length, pack_sequences=settings.pack_sequences,
                           mask_schedule=schedule, first_step=resume.phase_step)
    if resume.data is not None:
        data.load_state_dict(resume.data)
    return data
