"""BERT pre-training (masked LM + next sentence) with LAMB, mixed precision, gradient accumulation and DDP.

Flags are NVIDIA DeepLearningExamples' (`--input_dir --config_file --output_dir --train_batch_size ...`), plus
--bf16, --num_workers, --eval_dir/--eval_steps, --compile_optimizer and, off by default, the time-to-accuracy
options (--no_nsp, --dynamic_masking --masked_lm_prob, --train_budget_minutes, --pretrain_dropout, --compile).
Launch with torchrun for more than one
process: `torchrun --nproc_per_node=8 run_pretraining.py ...`.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, NoReturn, Optional

import h5py
import numpy as np
import torch
from torch.utils.data import DataLoader
from tqdm import tqdm

from bertrecipe.training import checkpointing
from bertrecipe.pretraining import masking
from bertrecipe.pretraining import resume_rules
from bertrecipe.training.process_group import (
    DistributedContext,
    all_gather_objects,
    all_reduce_sum,
    any_process,
    init_distributed,
    shutdown,
)
from bertrecipe.common.atomic_files import remove_stale_temporaries
from bertrecipe.common.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.training.metric_logger import MetricLogger, check_log_paths
from bertrecipe.common.output_paths import check_writable_folder, refuse_input_as_output
from bertrecipe.model.bert import BertConfig, BertForPreTraining
from bertrecipe.model.weights import load_weights_into, read_config, read_weights
from bertrecipe.training.optimization import (
    PolyWarmUpScheduler,
    TimeBudgetScheduler,
    build_lamb,
    choose_compiled_lamb,
    weight_decay_groups,
)
from bertrecipe.pretraining.sample_order import check_lanes, default_lanes
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH, check_vocab_for_model, load_vocab
from bertrecipe.training.run_lock import RunLock, locked_output_folder
from bertrecipe.pretraining.data import (
    BatchPlan,
    PretrainingData,
    evaluation_batches,
    find_shards,
    inspect_shard,
    read_rows,
)
from bertrecipe.training.stepper import (
    MAX_CONSECUTIVE_NON_FINITE,
    Precision,
    Stepper,
    StepResult,
    StopSignal,
    TrainingFailure,
    allow_tf32,
    outlive_job_sigterm,
    batches_to_device,
    make_precision,
    seed_everything,
    take,
    unwrap,
    wrap_ddp,
)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Declared in --help's order: inputs, then the step, then the run, then the data stream and device.
    add_input_flags(p)
    add_step_flags(p)
    add_run_flags(p)
    add_stream_flags(p)
    add_budget_flags(p)
    args = p.parse_args(argv)
    check_numbers(args)
    check_combinations(args)
    args.max_steps = int(args.max_steps)
    args.log_freq = max(1, int(args.log_freq))
    return args


def add_input_flags(p: argparse.ArgumentParser) -> None:
    """Where the shards, the config and the starting weights are, and where the checkpoints go."""
    p.add_argument("--input_dir", required=True, help="directory of *training*.hdf5 shards")
    p.add_argument("--config_file", required=True, help="bert_config.json")
    p.add_argument("--output_dir", required=True, help="where ckpt_<step>.pt files go")
    p.add_argument("--bert_model", default="bert-large-uncased", help="accepted for NVIDIA compatibility; unused")
    p.add_argument("--init_checkpoint", help="initial weights: our checkpoint, NVIDIA's or a Hugging Face directory")
    p.add_argument("--max_seq_length", type=int, default=512)
    p.add_argument("--max_predictions_per_seq", type=int, default=80)


def add_step_flags(p: argparse.ArgumentParser) -> None:
    """The optimizer step: batch, learning-rate schedule, accumulation, precision."""
    p.add_argument("--train_batch_size", type=int, default=32, help="per process, before accumulation")
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--num_train_epochs", type=float, default=3.0, help="accepted for compatibility; max_steps rules")
    p.add_argument("--max_steps", type=float, default=1000, help="optimizer steps of this phase")
    p.add_argument("--warmup_proportion", type=float, default=0.01)
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)),
                   help="set by older launchers; torchrun's environment is used")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--fp16", "--amp", dest="fp16", action="store_true", help="fp16 autocast + loss scaling (CUDA)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPU or GPU)")
    p.add_argument("--tf32", action="store_true", help="TF32 matmuls in fp32 training (Ampere+ GPUs)")
    p.add_argument("--loss_scale", type=float, default=0.0, help="accepted for compatibility; scaling is dynamic")
    p.add_argument("--init_loss_scale", type=float, default=2.0**20)
    p.add_argument("--log_freq", type=float, default=1.0, help="log every N steps")
    p.add_argument("--checkpoint_activations", action="store_true")


def add_run_flags(p: argparse.ArgumentParser) -> None:
    """Checkpoints, resuming, the two phases, evaluation and how long this run lasts."""
    p.add_argument("--resume_from_checkpoint", action="store_true", help="continue from the newest checkpoint")
    p.add_argument("--resume_step", type=int, default=-1, help="resume from ckpt_<resume_step>.pt")
    p.add_argument("--num_steps_per_checkpoint", type=int, default=100)
    p.add_argument("--skip_checkpoint", action="store_true", help="write no checkpoints")
    p.add_argument("--phase2", action="store_true", help="phase 2: start from the phase-1 checkpoint")
    p.add_argument("--phase1_end_step", type=int, default=7038)
    p.add_argument("--allreduce_post_accumulation", action="store_true",
                   help="all-reduce once per optimizer step (always the case here)")
    p.add_argument("--allreduce_post_accumulation_fp16", action="store_true",
                   help="all-reduce gradients in fp16 (bf16 with --bf16)")
    p.add_argument("--do_train", action="store_true")
    p.add_argument("--do_eval", action="store_true", help="evaluate masked-LM loss/accuracy on --eval_dir")
    p.add_argument("--eval_dir", help="directory of held-out *.hdf5 shards")
    p.add_argument("--eval_steps", type=int, default=0, help="evaluate every N steps (0: at the end only)")
    p.add_argument("--eval_batch_size", type=int, default=0, help="default: the training micro-batch")
    p.add_argument("--json-summary", dest="json_summary", default="results/dllogger.json")
    p.add_argument("--steps_this_run", type=int, default=-1, help="stop this run after N steps (-1: max_steps)")
    p.add_argument("--disable_progress_bar", action="store_true")


def add_stream_flags(p: argparse.ArgumentParser) -> None:
    """The sample stream (loader workers, dynamic masking, length binning, lanes), the optimizer's compilation and
    the device."""
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader workers per process")
    p.add_argument("--dynamic_masking", action="store_true",
                   help="mask every sample afresh each epoch (RoBERTa, NVIDIA's LDDL) from the shards' original tokens")
    p.add_argument("--masked_lm_prob", type=float, default=None,
                   help="with --dynamic_masking: share of tokens masked (default 0.15; Wettig et al. 2022 find 0.3-0.4 "
                        "better at equal compute); --max_predictions_per_seq caps it and may then exceed the shards'")
    p.add_argument("--whole_word_masking", action="store_true",
                   help="with --dynamic_masking: mask all pieces of a word together (needs --vocab_file)")
    p.add_argument("--vocab_file", help="with --dynamic_masking: the shards' vocab.txt (default: read [CLS], [SEP] "
                                        "and [MASK] off the first shard)")
    p.add_argument(ALLOW_VOCAB_MISMATCH, action="store_true",
                   help="warn instead of refusing a --vocab_file with far fewer tokens than the model's embeddings")
    p.add_argument("--bin_by_length", action="store_true",
                   help="group each step's samples into micro-batches of like lengths (as NVIDIA's LDDL bins): "
                        "less attention over padding with gradient accumulation; the step's samples are unchanged")
    p.add_argument("--data_lanes", type=int, default=0,
                   help="lanes of the sample stream (0: the largest divisor of the global batch up to 64 that is a "
                        "multiple of the processes); a run resumes on any number of processes dividing it")
    p.add_argument("--compile_optimizer", action="store_true", default=None,
                   help="fuse the LAMB update with torch.compile (about 4x faster optimizer steps on a CPU); the "
                        "default on CPUs for models of 10M parameters or more, where torch.compile works")
    p.add_argument("--no_compile_optimizer", dest="compile_optimizer", action="store_false",
                   help="the multi-tensor LAMB update, without torch.compile")
    p.add_argument("--no_cuda", action="store_true")


def add_budget_flags(p: argparse.ArgumentParser) -> None:
    """Choices that reach an accuracy sooner (docs/benchmarks.md, "Time to accuracy"); each is off by default, so
    that NVIDIA's recipe and numbers stay what runs without them."""
    p.add_argument("--no_nsp", action="store_true",
                   help="masked LM only (RoBERTa, Cramming): the next-sentence head leaves the loss; the pooler and "
                        "NSP weights stay in the checkpoint, untrained, so fine-tuning loads it as before")
    p.add_argument("--train_budget_minutes", type=float, default=0.0,
                   help="a wall-clock budget for this phase (Cramming): warm-up over --warmup_proportion of it, then "
                        "linear decay to 0 at its end; stops with a checkpoint when it is spent (or at --max_steps)")
    p.add_argument("--eval_interval_minutes", type=float, default=0.0,
                   help="with --do_eval: evaluate every N minutes of training time (evaluation time excluded)")
    p.add_argument("--pretrain_dropout", type=float, default=None,
                   help="dropout of the model while pre-training (Cramming: 0), in place of the config's; the "
                        "checkpoint keeps the config's values for fine-tuning")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (CPU or GPU)")


def check_combinations(args: argparse.Namespace) -> None:
    """Refuses flags that contradict each other or lack a companion, with one line."""
    if not args.do_train and not args.do_eval:
        raise InputError("nothing to do: pass --do_train and/or --do_eval")
    if args.train_batch_size % args.gradient_accumulation_steps:
        raise InputError(f"--train_batch_size {args.train_batch_size} is not a multiple of "
                         f"--gradient_accumulation_steps {args.gradient_accumulation_steps}")
    if (args.whole_word_masking or args.vocab_file) and not args.dynamic_masking:
        raise InputError("--whole_word_masking and --vocab_file go with --dynamic_masking")
    if args.whole_word_masking and not args.vocab_file:
        raise InputError("--whole_word_masking needs --vocab_file (to know which tokens are '##' word pieces)")
    if args.masked_lm_prob is not None and not args.dynamic_masking:
        raise InputError("--masked_lm_prob masks the samples afresh as they are read: add --dynamic_masking (static "
                         "shards keep the masks create_pretraining_data.py drew)")
    if args.masked_lm_prob is None:
        args.masked_lm_prob = 0.15
    if not 0 < args.masked_lm_prob <= 1:
        raise InputError(f"--masked_lm_prob must lie in (0, 1], got {args.masked_lm_prob}")
    if args.eval_interval_minutes and not (args.do_train and args.eval_dir):
        raise InputError("--eval_interval_minutes evaluates during training: it needs --do_train and --eval_dir")
    if args.pretrain_dropout is not None and not 0 <= args.pretrain_dropout < 1:
        raise InputError(f"--pretrain_dropout must lie in [0, 1), got {args.pretrain_dropout}")
    if args.do_eval and not args.eval_dir:
        raise InputError("--do_eval needs --eval_dir")
    if args.do_eval and not args.do_train and not (args.init_checkpoint or args.resume_from_checkpoint):
        raise InputError("--do_eval without --do_train evaluates given weights: pass --init_checkpoint or "
                         "--resume_from_checkpoint")


def check_numbers(args: argparse.Namespace) -> None:
    """Refuses flag values that make no sense (a zero divisor, a NaN rate, a negative count) with one line,
    before anything runs: each would otherwise end in a traceback, a NaN loss or a NaN checkpoint."""
    positive = ("train_batch_size", "gradient_accumulation_steps", "num_steps_per_checkpoint", "max_seq_length",
                "max_predictions_per_seq")
    for name in positive:
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be at least 1, got {getattr(args, name)}")
    for name in ("eval_steps", "eval_batch_size", "num_workers", "data_lanes"):
        if getattr(args, name) < 0:
            raise InputError(f"--{name} must be 0 or more, got {getattr(args, name)}")
    if not math.isfinite(args.max_steps) or args.max_steps < 1:
        raise InputError(f"--max_steps must be a whole number of steps >= 1, got {args.max_steps}")
    if not (0 < args.learning_rate <= torch.finfo(torch.float32).max):  # the update is computed in fp32
        raise InputError(f"--learning_rate must be a number > 0 that fp32 can hold, got {args.learning_rate}")
    if not 0 <= args.warmup_proportion <= 1:  # also false for NaN
        raise InputError(f"--warmup_proportion must lie in [0, 1], got {args.warmup_proportion}")
    if not (math.isfinite(args.init_loss_scale) and args.init_loss_scale > 0):
        raise InputError(f"--init_loss_scale must be a finite number > 0, got {args.init_loss_scale}")
    if args.steps_this_run == 0 or args.steps_this_run < -1:
        raise InputError(f"--steps_this_run must be -1 (all of --max_steps) or >= 1, got {args.steps_this_run}")
    if not (math.isfinite(args.log_freq) and args.log_freq > 0):
        raise InputError(f"--log_freq must be a number > 0, got {args.log_freq}")
    for name in ("train_budget_minutes", "eval_interval_minutes"):
        if not (math.isfinite(getattr(args, name)) and getattr(args, name) >= 0):
            raise InputError(f"--{name} must be a number of minutes >= 0 (0: none), got {getattr(args, name)}")


def check_output_paths(args: argparse.Namespace, train_shards: list, eval_shards: list) -> None:
    """The output folder and the logs must be creatable where the flags point, and none of them may be one of the
    run's inputs (checked before any write)."""
    check_writable_folder(args.output_dir, "--output_dir")
    check_log_paths(args.json_summary, Path(args.output_dir) / "tensorboard")
    inputs = [("--config_file", args.config_file), ("--init_checkpoint", args.init_checkpoint),
              ("--vocab_file", args.vocab_file), ("--input_dir", args.input_dir), ("--eval_dir", args.eval_dir)]
    if args.json_summary:  # a file: it could be one of the shards too
        shards = [("a shard of --input_dir", s.path) for s in train_shards] + [
            ("a shard of --eval_dir", s.path) for s in eval_shards]
        refuse_input_as_output(args.json_summary, "--json-summary", inputs + shards)
    refuse_input_as_output(args.output_dir, "--output_dir", inputs)
    refuse_input_as_output(Path(args.output_dir) / "tensorboard", "the TensorBoard folder (--output_dir/tensorboard)",
                           inputs)


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


def pretraining_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor], nsp: bool = True) -> torch.Tensor:
    """Masked-LM plus next-sentence cross-entropy (NVIDIA's loss), or the masked-LM term alone with nsp=False."""
    return model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                 masked_lm_labels=batch["masked_lm_labels"],
                 next_sentence_labels=batch["next_sentence_labels"] if nsp else None).loss


@torch.no_grad()
def evaluate(session: Session) -> dict[str, float]:
    """MLPerf's metric: masked-LM accuracy over all masked tokens, and the mean masked-LM cross-entropy."""
    args, ctx = session.args, session.ctx
    bare = unwrap(session.model)
    was_training = bare.training
    bare.eval()
    sums = torch.zeros(3, dtype=torch.float64, device=ctx.device)  # loss sum, correct, masked tokens
    batch_size = args.eval_batch_size or args.train_batch_size // args.gradient_accumulation_steps
    for batch in evaluation_batches(session.eval_shards, bare.config.vocab_size, batch_size, ctx.rank,
                                    ctx.world_size):
        batch = batches_to_device(batch, ctx.device)
        labels = batch["masked_lm_labels"]
        with session.precision.autocast():
            logits = bare(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                          predict_positions=labels >= 0).prediction_logits.float()
        targets = labels[labels >= 0]
        sums[0] += torch.nn.functional.cross_entropy(logits, targets, reduction="sum").double()
        sums[1] += (logits.argmax(-1) == targets).sum()
        sums[2] += targets.numel()
    sums = all_reduce_sum(sums, ctx)
    bare.train(was_training)
    count = max(float(sums[2]), 1.0)
    return {"eval_loss": float(sums[0]) / count, "eval_mlm_accuracy": float(sums[1]) / count}


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


def weights_are_finite(model: torch.nn.Module) -> bool:
    return bool(torch.stack([p.detach().isfinite().all() for p in unwrap(model).parameters()]).all())


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    ctx = init_distributed(args.no_cuda)
    try:
        run(args, ctx)
    except KeyboardInterrupt:
        if ctx.is_main:
            saved = checkpointing.list_checkpoints(args.output_dir)
            where = (f"resume from {saved[-1][1]} with --resume_from_checkpoint" if saved
                     else f"no checkpoint in {args.output_dir} yet")
            print(f"interrupted (Ctrl-C): {where}", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGINT) from None
    finally:
        shutdown(ctx)


def inspect_inputs(args: argparse.Namespace, config: BertConfig) -> tuple[list, list]:
    """The training and held-out shards, their keys, shapes and attributes checked against the flags and config."""
    limits = {"vocab_size": config.vocab_size, "max_positions": config.max_position_embeddings,
              "type_vocab_size": config.type_vocab_size}
    train_shards = []
    if args.do_train:
        # Dynamic masks are drawn anew, up to --max_predictions_per_seq: the shards' own count need not match it.
        shard_predictions = None if args.dynamic_masking else args.max_predictions_per_seq
        train_shards = [inspect_shard(f, max_seq_length=args.max_seq_length, max_predictions=shard_predictions,
                                      **limits)
                        for f in find_shards(args.input_dir, "training")]
    eval_shards = [inspect_shard(f, **limits) for f in find_shards(args.eval_dir)] if args.eval_dir else []
    return train_shards, eval_shards


def find_resume_checkpoint(args: argparse.Namespace, config: BertConfig,
                           existing: list[checkpointing.SavedCheckpoint]) -> Optional[tuple[Path, dict[str, Any]]]:
    """The checkpoint this run continues from (None for a fresh start) among the `existing` ones
    (checkpointing.survey's), chosen by phase (resume_rules) and checked to fit the run."""
    if args.do_train and existing and not args.resume_from_checkpoint:
        raise InputError(f"{args.output_dir}: holds checkpoints of another run ({existing[-1].path.name}); pass "
                         "--resume_from_checkpoint to continue it or choose another --output_dir")
    if not args.resume_from_checkpoint:
        return None
    if not existing and args.resume_step < 0:
        if args.do_train and args.phase2:
            raise InputError(f"{args.output_dir}: phase 2 needs the phase-1 checkpoint to resume from")
        return None  # NVIDIA's scripts always pass --resume_from_checkpoint: the first run starts fresh
    step = args.resume_step
    if step < 0 and args.do_train:
        chosen = resume_rules.choose_checkpoint(existing, args.output_dir, args.phase2, args.phase1_end_step,
                                                args.max_steps)
        step = chosen.step if chosen is not None else -1
    path, ckpt = checkpointing.load_newest_checkpoint(args.output_dir, step)
    if args.do_train:
        resume_rules.refuse_phase_mismatch(path, ckpt, args.phase2)
        missing = [key for key in ("optimizer", "phase_step", "data") if key not in ckpt]
        if missing:
            raise InputError(f"{path}: holds weights but no training state ({', '.join(missing)}), so a run cannot "
                        "resume from it; pass it as --init_checkpoint in a new --output_dir instead")
    saved = ckpt.get("config")
    if isinstance(saved, dict):
        ours = config.to_dict()
        changed = [f"{key} {saved.get(key)} -> {ours.get(key)}" for key in sorted(set(saved) | set(ours))
                   if saved.get(key) != ours.get(key)]
        if changed:
            raise InputError(f"{path}: was trained with another config than {args.config_file} "
                             f"({'; '.join(changed)}); resume with the same --config_file or use a new --output_dir")
    return path, ckpt


def check_resume(args: argparse.Namespace, ctx: DistributedContext, shards: list,
                 resume_from: Optional[tuple[Path, dict[str, Any]]],
                 existing: list[checkpointing.SavedCheckpoint]) -> tuple[int, list[str]]:
    """Before the first write: what is left to train (steps), and the flag changes a resume applies (one line
    each); refuses a changed flag that cannot apply (resume_rules.RULES), a --max_steps behind the checkpoint, and a
    run that would write over an existing checkpoint."""
    start, changes = 0, []
    if resume_from is not None:
        path, ckpt = resume_from
        if bool(ckpt.get("phase2")) == bool(args.phase2):  # continuing a phase (a hand-over starts one afresh)
            start = int(ckpt["phase_step"])
            changes = resume_rules.compare_flags(path, ckpt, args, [s.path.name for s in shards],
                                                 args.train_batch_size * ctx.world_size)
            if start > args.max_steps:
                raise InputError(f"{path}: is at step {start} of this phase, beyond --max_steps {args.max_steps}; "
                                 f"pass --max_steps {start} or more to go on")
    steps_left = args.max_steps - start
    if args.steps_this_run > 0:
        steps_left = min(steps_left, args.steps_this_run)
    offset = args.phase1_end_step if args.phase2 else 0
    if steps_left > 0 and not args.skip_checkpoint:
        resume_rules.refuse_overwrites(existing, offset + start + 1, offset + start + steps_left)
    return steps_left, changes


def stream_lanes(args: argparse.Namespace, ctx: DistributedContext,
                 resume_from: Optional[tuple[Path, dict[str, Any]]]) -> int:
    """The lane count of the sample stream: the checkpoint's when continuing a phase (its stream goes on), else
    --data_lanes or the default; checked to split the global batch over this many processes."""
    global_batch = args.train_batch_size * ctx.world_size
    lanes = args.data_lanes or default_lanes(global_batch, ctx.world_size)
    if resume_from is not None:
        path, ckpt = resume_from
        saved = int((ckpt.get("data") or {}).get("lanes", 0))
        continuing = bool(ckpt.get("phase2", False)) == bool(args.phase2)
        if continuing and saved:
            if args.data_lanes and args.data_lanes != saved:
                raise InputError(f"{path}: its stream has {saved} lanes, not --data_lanes {args.data_lanes}; drop "
                                 "the flag to continue it")
            lanes = saved
    check_lanes(lanes, global_batch, ctx.world_size)
    return lanes


def masking_spec(args: argparse.Namespace, shards: list, config: BertConfig,
                 warn: bool = True) -> Optional[masking.MaskingSpec]:
    """What --dynamic_masking needs: the special and mask ids, from --vocab_file or read off the first shard."""
    if not args.dynamic_masking:
        return None
    wanted = round(args.max_seq_length * args.masked_lm_prob)
    if warn and wanted > args.max_predictions_per_seq:
        print(f"warning: --max_predictions_per_seq {args.max_predictions_per_seq} caps --masked_lm_prob "
              f"{args.masked_lm_prob} at {args.max_predictions_per_seq / args.max_seq_length:.3f} of a full "
              f"{args.max_seq_length}-token sequence; pass --max_predictions_per_seq {wanted} for the full rate",
              file=sys.stderr, flush=True)
    try:
        if args.vocab_file:
            vocab = load_vocab(args.vocab_file)
            check_vocab_for_model(vocab, model_vocab_size=config.vocab_size, allow_mismatch=args.allow_vocab_mismatch)
            tokens = vocab.tokens
            return masking.spec_from_vocab(tokens, args.masked_lm_prob, args.max_predictions_per_seq,
                                           args.whole_word_masking)
        with h5py.File(shards[0].path, "r") as f:  # its first rows show the special ids: no need to read it whole
            rows = read_rows(shards[0], f, 0, min(shards[0].num_samples, 4096), config.vocab_size)
        return masking.spec_from_shard(rows, config.vocab_size, args.masked_lm_prob, args.max_predictions_per_seq)
    except ValueError as error:
        raise InputError(f"{args.vocab_file or shards[0].path}: cannot set up --dynamic_masking ({error})") from None


def open_log(args: argparse.Namespace, ctx: DistributedContext, bar_enabled: bool) -> MetricLogger:
    log = MetricLogger(args.json_summary, enabled=ctx.is_main, printer=tqdm.write if bar_enabled else print,
                       tensorboard_dir=Path(args.output_dir) / "tensorboard")
    log.log("PARAMETER", {k: v for k, v in vars(args).items() if not k.startswith("_")}, echo=False)
    for metric, unit in (("average_loss", None), ("step_loss", None), ("learning_rate", None),
                         ("training_sequences_per_second", "sequences/s"), ("e2e_train_time", "s")):
        log.metadata(metric, {"unit": unit} if unit else {})
    return log


@dataclass
class Session:
    """What a run works with once its inputs are checked and its model and optimizer are set up; training and
    the evaluation share it."""

    args: argparse.Namespace
    ctx: DistributedContext
    config: BertConfig
    model: torch.nn.Module  # wrapped for DDP when there is more than one process
    optimizer: torch.optim.Optimizer
    scheduler: Any  # PolyWarmUpScheduler, or TimeBudgetScheduler with --train_budget_minutes
    precision: Precision
    log: MetricLogger
    eval_shards: list
    bar_enabled: bool
    start_time: float  # time.time() when the run began, for e2e_train_time
    lock: Optional[RunLock]  # --output_dir's, held by the main process


def run(args: argparse.Namespace, ctx: DistributedContext) -> None:
    start_time = time.time()
    # Every input is checked before the first write: a refused run leaves --output_dir as it was.
    config = read_config(args.config_file)
    precision = make_precision(ctx.device, args.fp16, args.bf16, args.init_loss_scale)
    allow_tf32(args.tf32)
    train_shards, eval_shards = inspect_inputs(args, config)
    check_output_paths(args, train_shards, eval_shards)
    # The lock is the first write: the resume point is chosen, and the checkpoints written, by one run at a time.
    with locked_output_folder(args.output_dir, ctx.is_main, lambda flag: any_process(flag, ctx)) as lock:
        existing = checkpointing.survey(args.output_dir)  # each checkpoint's phase, read once
        resume_from = find_resume_checkpoint(args, config, existing)
        steps_left, changes = (check_resume(args, ctx, train_shards, resume_from, existing) if args.do_train
                               else (0, []))
        spec = None
        if args.do_train:
            args.data_lanes = stream_lanes(args, ctx, resume_from)
            spec = masking_spec(args, train_shards, config, warn=ctx.is_main)
        seed_everything(args.seed + ctx.rank)
        model = build_model(args, config, ctx.device)  # reads --init_checkpoint
        if ctx.is_main:
            remove_stale_temporaries(args.output_dir, checkpointing.CHECKPOINT_NAME)
        bar_enabled = ctx.is_main and not args.disable_progress_bar
        log = open_log(args, ctx, bar_enabled)
        for change in changes:
            log.log("PARAMETER", {"resume_applies": change}, echo=False)
            if ctx.is_main:
                print(f"resume: {change}", file=sys.stderr, flush=True)
        ddp_model, optimizer, scheduler, resume = set_up_optimizer(args, ctx, model, precision, log, resume_from)
        session = Session(args, ctx, config, ddp_model, optimizer, scheduler, precision, log, eval_shards,
                          bar_enabled, start_time, lock)
        final = train_and_evaluate(session, train_shards, spec, resume, steps_left)
    if final.get("stopped_by") == "SIGTERM":
        if ctx.is_main:
            print(f"stopped by SIGTERM at step {final['global_step']} before the end of the phase; checkpoint "
                  f"{checkpointing.checkpoint_path(args.output_dir, final['global_step'])}: run again with "
                  "--resume_from_checkpoint to go on", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGTERM)


def train_and_evaluate(session: Session, shards: list, spec: Optional[masking.MaskingSpec],
                       resume: dict[str, Any], steps_left: int) -> dict[str, Any]:
    """Trains the steps left (saying so when there are none), evaluates as asked, logs the closing record."""
    args, log = session.args, session.log
    final: dict[str, Any] = {}
    if args.do_train and steps_left <= 0:
        where = resume["path"] or args.output_dir
        message = (f"{where}: phase {2 if args.phase2 else 1} is at step {resume['phase_step']} of --max_steps "
                   f"{args.max_steps}: nothing left to train")
        log.log("PARAMETER", {"nothing_left_to_train": message}, echo=False)
        if session.ctx.is_main:
            print(message, file=sys.stderr, flush=True)
    elif args.do_train:
        final.update(train(session, shards, spec, resume, steps_left))
    if args.do_eval and session.eval_shards and "eval_mlm_accuracy" not in final:
        final.update(evaluate(session))
    log.log([], final)
    log.close()
    return final


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


@dataclass
class Phase:
    """The training loop's state: what this run's steps are built from, and where the phase stands. phase_step
    and position (samples of the stream consumed) are what a checkpoint records to resume exactly."""

    session: Session
    plan: BatchPlan
    data: PretrainingData
    batches: Iterator[dict[str, torch.Tensor]]
    stepper: Stepper
    stop: StopSignal
    bar: tqdm
    steps_left: int  # steps this run takes
    step_offset: int  # phase 2's steps are logged and saved after phase 1's
    keep: Optional[Path]  # the checkpoint this run resumed from, which rotation must keep
    phase_step: int
    position: int
    current_step: int  # the global step being taken, for the error line
    record_clock: float  # perf_counter() at the previous training record (evaluation time excluded)
    clock_start: float  # perf_counter() when this run's phase began
    seconds_before: float  # training time of the runs this one continues
    train_seconds: float  # training time of the phase after the last step (evaluations excluded)
    next_evaluation: float  # train_seconds of the next --eval_interval_minutes evaluation
    evaluation_seconds: float = 0.0  # time this run spent in evaluations between steps
    steps_since_record: int = 0
    losses: list[float] = field(default_factory=list)  # this process's step losses since the previous record
    step_times: list[float] = field(default_factory=list)
    last_loss: float = float("nan")
    result: dict[str, Any] = field(default_factory=dict)  # the newest evaluation
    stopped_by: Optional[str] = None  # "SIGTERM" or "train_budget" when the run ended before its last step

    @property
    def global_step(self) -> int:
        return self.phase_step + self.step_offset

    @property
    def global_batch(self) -> int:
        """Sequences of all processes per optimizer step."""
        return self.session.args.train_batch_size * self.session.ctx.world_size


def train(session: Session, shards: list, spec: Optional[masking.MaskingSpec],
          resume: dict[str, Any], steps_left: int) -> dict[str, Any]:
    """Takes the steps of this run from the resume point on; returns the run's closing record."""
    phase = start_phase(session, shards, spec, resume, steps_left)
    if budget_spent(phase):
        session.log.log("PARAMETER", {"train_budget_already_spent": phase.train_seconds / 60})
        phase.steps_left = 0
    try:
        for index in range(phase.steps_left):
            if not train_one_step(phase, last_of_run=index == phase.steps_left - 1):
                break
    except TrainingFailure as error:
        phase.bar.close()
        stop_with_error(phase, error)
    finally:
        phase.stop.restore()
    phase.bar.close()
    return closing_record(phase)


def start_phase(session: Session, shards: list, spec: Optional[masking.MaskingSpec],
                resume: dict[str, Any], steps_left: int) -> Phase:
    """Opens this rank's share of the sample stream at the resume position and puts the dropout RNG where the
    checkpoint left it."""
    args, ctx = session.args, session.ctx
    plan = BatchPlan(args.train_batch_size // args.gradient_accumulation_steps, args.gradient_accumulation_steps,
                     ctx.world_size, ctx.rank)
    data = PretrainingData(shards, args.seed, plan, args.data_lanes, session.config.vocab_size,
                           start=resume["position"], max_steps=max(steps_left, 0), masking_spec=spec,
                           bin_by_length=args.bin_by_length)
    # A private generator for the loader, so that creating it draws nothing from the dropout RNG.
    loader = DataLoader(data.reader(), batch_size=None, num_workers=args.num_workers,
                        pin_memory=ctx.device.type == "cuda", generator=torch.Generator().manual_seed(args.seed),
                        persistent_workers=False, worker_init_fn=outlive_job_sigterm)
    # Before the loader starts: a SIGTERM from then on is a request to checkpoint and stop, never a crash
    # (the workers take theirs through outlive_job_sigterm).
    stop = StopSignal()
    batches = data.batches(iter(loader))
    if resume["rng"] is not None:
        checkpointing.set_rng_state(resume["rng"])
    loss = functools.partial(pretraining_loss, nsp=not args.no_nsp)
    stepper = Stepper(session.model, session.optimizer, session.scheduler, session.precision, loss,
                      skipped_steps=resume["skipped_steps"])
    step_offset = args.phase1_end_step if args.phase2 else 0
    bar = tqdm(total=steps_left, disable=not session.bar_enabled, desc="pre-training", unit="step",
               dynamic_ncols=True)
    session.model.train()
    now, before = time.perf_counter(), resume["train_seconds"]
    return Phase(session, plan, data, batches, stepper, stop, bar, steps_left, step_offset, keep=resume["path"],
                 phase_step=resume["phase_step"], position=resume["position"],
                 current_step=resume["phase_step"] + step_offset, record_clock=now, clock_start=now,
                 seconds_before=before, train_seconds=before,
                 next_evaluation=next_evaluation_after(before, args.eval_interval_minutes))


def train_one_step(phase: Phase, last_of_run: bool) -> bool:
    """One optimizer step, then whatever is due after it: the log record, an evaluation, a checkpoint. False when
    a SIGTERM (on any process) ends the run after its checkpoint."""
    args = phase.session.args
    outcome = apply_step(phase)
    phase.train_seconds = read_clock(phase)
    if phase.phase_step % args.log_freq == 0 or last_of_run:
        log_training_record(phase, outcome.loss)
    if evaluation_due(phase):
        evaluate_between_steps(phase)
    stopping = any_process(phase.stop.requested, phase.session.ctx)
    out_of_time = budget_spent(phase)
    ending = stopping or out_of_time or last_of_run
    if ending or phase.phase_step % args.num_steps_per_checkpoint == 0:
        save(phase, periodic=not ending)
    if (stopping and not last_of_run) or out_of_time:  # a SIGTERM during the run's last step stops nothing
        phase.stopped_by = "SIGTERM" if stopping and not last_of_run else "train_budget"
        phase.session.log.log("PARAMETER", {"stopped_by": phase.stopped_by, "global_step": phase.global_step})
    return not (stopping or out_of_time)


def read_clock(phase: Phase) -> float:
    """Training seconds of the phase (earlier runs included, evaluations between steps not), the mean over the
    processes when a budget or an evaluation interval depends on it, so that every process decides alike."""
    args, ctx = phase.session.args, phase.session.ctx
    seconds = phase.seconds_before + time.perf_counter() - phase.clock_start - phase.evaluation_seconds
    if ctx.world_size > 1 and (args.train_budget_minutes or args.eval_interval_minutes):
        total = all_reduce_sum(torch.tensor([seconds], dtype=torch.float64, device=ctx.device), ctx)
        seconds = float(total[0]) / ctx.world_size
    return seconds


def budget_spent(phase: Phase) -> bool:
    budget = phase.session.args.train_budget_minutes
    return bool(budget) and phase.train_seconds >= budget * 60


def next_evaluation_after(seconds: float, interval_minutes: float) -> float:
    """The training second of the first --eval_interval_minutes mark after `seconds` (inf without an interval)."""
    interval = interval_minutes * 60
    return (math.floor(seconds / interval) + 1) * interval if interval else math.inf


def evaluation_due(phase: Phase) -> bool:
    args = phase.session.args
    if not phase.session.eval_shards:
        return False
    if args.eval_steps and phase.phase_step % args.eval_steps == 0:
        return True
    return phase.train_seconds >= phase.next_evaluation


def apply_step(phase: Phase) -> StepResult:
    """Feeds the step's micro-batches to the stepper and advances the phase past them."""
    tick = time.perf_counter()
    micro = [batches_to_device(b, phase.session.ctx.device) for b in take(phase.batches, phase.plan.accumulation)]
    phase.current_step = phase.global_step + 1
    if isinstance(phase.session.scheduler, TimeBudgetScheduler):
        phase.session.scheduler.elapsed_seconds = phase.train_seconds  # the clock after the previous step
    outcome = phase.stepper.step(micro)
    if not outcome.applied and phase.session.precision.scaler is None:
        print(f"warning: step {phase.current_step}: the loss or gradients are not finite; step skipped "
              f"({phase.stepper.consecutive_non_finite} in a row, stopping at {MAX_CONSECUTIVE_NON_FINITE})",
              file=sys.stderr, flush=True)
    phase.phase_step += 1
    phase.position += phase.plan.samples_per_step
    phase.step_times.append(time.perf_counter() - tick)
    phase.losses.append(outcome.loss)
    phase.steps_since_record += 1
    phase.bar.update(1)
    return outcome


def log_training_record(phase: Phase, step_loss: float) -> None:
    """The losses averaged over processes, the lr, and the throughput since the previous record: sequences of
    all processes over the wall time, read once the loss all-reduce has synchronised them."""
    session, ctx = phase.session, phase.session.ctx
    mean = all_reduce_sum(torch.tensor([np.mean(phase.losses), step_loss], dtype=torch.float64,
                                       device=ctx.device), ctx) / ctx.world_size
    phase.last_loss = float(mean[1])
    now = time.perf_counter()
    record = {"average_loss": float(mean[0]), "step_loss": phase.last_loss,
              "learning_rate": session.optimizer.param_groups[0]["lr"], "skipped_steps": phase.stepper.skipped_steps,
              "training_sequences_per_second": phase.global_batch * phase.steps_since_record
              / max(now - phase.record_clock, 1e-9)}
    phase.steps_since_record, phase.record_clock = 0, now
    if session.precision.scaler is not None:
        record["loss_scale"] = session.precision.scaler.get_scale()
    session.log.log([phase.data.epoch(phase.position), phase.global_step], record)
    phase.bar.set_postfix(loss=f"{phase.last_loss:.4f}")
    phase.losses.clear()


def evaluate_between_steps(phase: Phase) -> None:
    evaluation_start = time.perf_counter()
    phase.result = evaluate(phase.session)
    phase.session.log.log([phase.data.epoch(phase.position), phase.global_step],
                          {**phase.result, "train_minutes": phase.train_seconds / 60})
    phase.next_evaluation = next_evaluation_after(phase.train_seconds, phase.session.args.eval_interval_minutes)
    spent = time.perf_counter() - evaluation_start  # not training time
    phase.record_clock += spent
    phase.evaluation_seconds += spent


def save(phase: Phase, periodic: bool) -> None:
    """Writes ckpt_<global step>.pt from the first process, with every rank's RNG; every rank stops if it fails."""
    session, ctx, args = phase.session, phase.session.ctx, phase.session.args
    # A periodic checkpoint never rotates a good one out during a run of non-finite (not fp16-overflow)
    # steps; the SIGTERM and end-of-run ones are always written (skipped steps left the weights good).
    if args.skip_checkpoint or (periodic and session.precision.scaler is None and phase.stepper.consecutive_non_finite):
        return
    if not weights_are_finite(session.model):
        raise TrainingFailure("the weights are no longer finite numbers; no checkpoint written")
    rng_per_rank = all_gather_objects(checkpointing.rng_state(), ctx)
    failure = None
    if ctx.is_main:
        payload = checkpoint_payload(phase, rng_per_rank)
        try:
            if session.lock is not None and not session.lock.still_held():
                raise InputError(f"{session.lock.path}: another run took over this --output_dir's lock; this run "
                                 f"stops without writing ckpt_{phase.global_step}.pt")
            checkpointing.save_checkpoint(args.output_dir, phase.global_step, payload, keep=phase.keep)
        except InputError as error:  # e.g. disk full: every rank stops, the earlier checkpoints are intact
            failure = error
    if any_process(failure is not None, ctx):
        raise failure or InputError(f"{args.output_dir}: the first process could not write the checkpoint")


def checkpoint_payload(phase: Phase, rng_per_rank: list[dict[str, Any]]) -> dict[str, Any]:
    """The checkpoint's content (docs/interfaces.md, section 3)."""
    session, args = phase.session, phase.session.args
    return {
        "model": unwrap(session.model).state_dict(),
        "optimizer": session.optimizer.state_dict(),
        "scheduler": session.scheduler.state_dict(),
        "scaler": session.precision.scaler.state_dict() if session.precision.scaler is not None else None,
        "epoch": phase.data.epoch(phase.position),
        "data": {"stream_position": phase.position, "seed": args.seed, "lanes": phase.data.order.lanes,
                 "files": [shard.path.name for shard in phase.data.shards], "global_batch": phase.global_batch},
        "rng": rng_per_rank[0],
        "rng_per_rank": rng_per_rank,  # each rank's dropout stream, so that a multi-process resume is exact
        "phase2": bool(args.phase2),
        "phase1_end_step": args.phase1_end_step if args.phase2 else None,
        "phase_step": phase.phase_step,
        "config": session.config.to_dict(),
        "args": {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool, type(None)))},
        "skipped_steps": phase.stepper.skipped_steps,  # the log's counter goes on after a resume
        "train_seconds": phase.train_seconds,  # a --train_budget_minutes run goes on with what is left
    }


def stop_with_error(phase: Phase, error: TrainingFailure) -> NoReturn:
    """One line naming the step and the checkpoint to resume from, and exit status 1."""
    output_dir = phase.session.args.output_dir
    saved = checkpointing.list_checkpoints(output_dir)
    last = f"the last good checkpoint is {saved[-1][1]}" if saved else f"no checkpoint in {output_dir}"
    print(f"error: step {phase.current_step}: {error}; stopping, {last}", file=sys.stderr, flush=True)
    raise SystemExit(1)


def closing_record(phase: Phase) -> dict[str, Any]:
    """The run's summary: times, throughput (the first two steps, which warm up, left out when there are more) and
    the final loss, with the final evaluation when --do_eval asks for one."""
    session = phase.session
    if session.eval_shards and session.args.do_eval:
        phase.result = evaluate(session)
    timed = phase.step_times[2:] if len(phase.step_times) > 2 else phase.step_times
    sequences = phase.global_batch * len(timed)
    return {
        "e2e_train_time": time.time() - session.start_time,
        "training_sequences_per_second": sequences / sum(timed) if timed and sum(timed) > 0 else 0.0,
        "final_loss": phase.last_loss,
        "global_step": phase.global_step,
        **({"stopped_by": phase.stopped_by} if phase.stopped_by else {}),
        "raw_train_time": sum(phase.step_times),
        "train_minutes": phase.train_seconds / 60,
        **phase.result,
    }


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
