"""BERT pre-training (masked LM + next sentence) with LAMB, mixed precision, gradient accumulation and DDP.

Flags are NVIDIA DeepLearningExamples' (`--input_dir --config_file --output_dir --train_batch_size ...`), plus
--bf16, --num_workers, --eval_dir/--eval_steps, --compile_optimizer and, off by default, the time-to-accuracy
options (--no_nsp, --dynamic_masking --masked_lm_prob, --train_budget_minutes, --pretrain_dropout, --compile).
Launch with torchrun for more than one
process: `torchrun --nproc_per_node=8 run_pretraining.py ...`.
"""
from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Callable, NoReturn, Optional

import torch

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.common.stop_signals import Terminated, stop_signal_received, stop_signal_within
from bertrecipe.model.families import ModelConfig, is_modern_config
from bertrecipe.model.weights import read_config
from bertrecipe.pretraining.masking import SCHEDULE_SHAPES
from bertrecipe.pretraining.session import pretrain
from bertrecipe.pretraining.settings import PretrainingSettings, settings_from_flags
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH
from bertrecipe.training import checkpointing
from bertrecipe.training.optimization import DECAY_SHAPES, LR_SCHEDULES, OPTIMIZERS
from bertrecipe.training.process_group import (
    DistributedContext,
    init_distributed,
    peer_has_gone,
    shutdown,
)
from bertrecipe.training.sharding import SHARDING

# How long a process whose peers have gone waits for a Ctrl-C of its own before it reports an error.
PEER_SIGNAL_GRACE_SECONDS = 1.0


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    return checked(build_parser(__doc__).parse_args(argv))


def build_parser(description: Optional[str], config_required: bool = True) -> ArgumentParser:
    """Every flag of a pre-training run (general distillation adds its own to these)."""
    p = ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    # Declared in --help's order: inputs, then the step, then the run, then the data stream and device.
    add_input_flags(p, config_required)
    add_step_flags(p)
    add_optimizer_flags(p)
    add_run_flags(p)
    add_stream_flags(p)
    add_budget_flags(p)
    return p


def checked(args: argparse.Namespace) -> argparse.Namespace:
    """The parsed flags checked (one line for each senseless value or combination) and completed."""
    check_numbers(args)
    check_token_flags(args)
    check_combinations(args)
    check_optimizer_flags(args)
    args.max_steps = int(args.max_steps)
    args.log_freq = max(1, int(args.log_freq))
    if args.json_summary is None:  # the run's own folder: runs with other output folders never share a log
        args.json_summary = str(Path(args.output_dir) / "dllogger.json")
    return args


def add_input_flags(p: argparse.ArgumentParser, config_required: bool = True) -> None:
    """Where the shards, the config and the starting weights are, and where the checkpoints go."""
    p.add_argument("--input_dir", required=True, help="directory of *training*.hdf5 shards")
    p.add_argument("--config_file", required=config_required, help="bert_config.json")
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
    p.add_argument("--warmup_proportion", type=float, default=None,
                   help="share of --max_steps (of --max_tokens, of --train_budget_minutes) the lr warms up over "
                        "(0.01)")
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)),
                   help="set by older launchers; torchrun's environment is used")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--fp16", "--amp", dest="fp16", action="store_true", help="fp16 autocast + loss scaling (CUDA)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPU or GPU)")
    p.add_argument("--tf32", action="store_true", help="TF32 matmuls in fp32 training (Ampere+ GPUs)")
    p.add_argument("--deterministic", action="store_true",
                   help="deterministic kernels only (torch.use_deterministic_algorithms, cuBLAS's deterministic "
                        "workspace): GPU runs repeat, and resume, to the last bit, somewhat slower")
    p.add_argument("--loss_scale", type=float, default=0.0, help="accepted for compatibility; scaling is dynamic")
    p.add_argument("--init_loss_scale", type=float, default=2.0**20)
    p.add_argument("--log_freq", type=float, default=1.0, help="log every N steps")
    p.add_argument("--peak_tflops", type=float,
                   help="the device's dense peak (TFLOP/s) that the logs' mfu is against (default: a known GPU's "
                        "bf16/fp16 peak, or this CPU's measured GEMM rate)")
    p.add_argument("--checkpoint_activations", action="store_true")


def add_optimizer_flags(p: argparse.ArgumentParser) -> None:
    """The optimizer and the learning-rate schedule: LAMB and poly by default (NVIDIA's recipe), AdamW or
    StableAdamW and warmup-stable-decay for modern encoders (ModernBERT)."""
    p.add_argument("--optimizer", choices=OPTIMIZERS, default="lamb",
                   help="lamb (NVIDIA's), adamw (torch's, its fused kernel wherever the tensors allow it) or "
                        "stable_adamw (AdamW with per-tensor update clipping, Wortsman et al. 2023; ModernBERT's)")
    p.add_argument("--adam_beta1", type=float, default=None, help="adamw/stable_adamw: beta1 (default 0.9)")
    p.add_argument("--adam_beta2", type=float, default=None,
                   help="adamw/stable_adamw: beta2 (default 0.999; ModernBERT uses 0.98)")
    p.add_argument("--adam_epsilon", type=float, default=None, help="adamw/stable_adamw: epsilon (default 1e-6)")
    p.add_argument("--weight_decay", type=float, default=0.01,
                   help="decoupled weight decay of every weight but biases and LayerNorms (any optimizer)")
    p.add_argument("--lr_schedule", choices=LR_SCHEDULES, default="poly",
                   help="poly: warm-up, then lr * (1 - progress) ** 0.5; wsd: warm-up, constant peak, then decay over "
                        "the last --decay_proportion of the steps (or of --train_budget_minutes)")
    p.add_argument("--decay_proportion", type=float, default=None, help="wsd: share of the run that decays (0.1)")
    p.add_argument("--min_lr_ratio", type=float, default=None, help="wsd: the decay ends at this x the peak (0.0)")
    p.add_argument("--decay_shape", choices=DECAY_SHAPES, default=None,
                   help="wsd: linear, or 1-sqrt (Hägele et al. 2024) (default linear)")


def check_optimizer_flags(args: argparse.Namespace) -> None:
    """Refuses optimizer and schedule flags without their --optimizer / --lr_schedule, or out of range, with one
    line; then fills in their defaults (so that checkpoints record them)."""
    adam = {"adam_beta1": 0.9, "adam_beta2": 0.999, "adam_epsilon": 1e-6}
    wsd = {"decay_proportion": 0.1, "min_lr_ratio": 0.0, "decay_shape": "linear"}
    for names, needs, ok in ((adam, "--optimizer adamw or stable_adamw", args.optimizer != "lamb"),
                             (wsd, "--lr_schedule wsd", args.lr_schedule == "wsd")):
        given = [f"--{name}" for name in names if getattr(args, name) is not None]
        if given and not ok:
            raise InputError(f"{', '.join(given)} go with {needs}")
        for name, default in names.items():
            if getattr(args, name) is None:
                setattr(args, name, default)
    if args.compile_optimizer and args.optimizer != "lamb":
        raise InputError("--compile_optimizer fuses the LAMB update: it goes with --optimizer lamb")
    for name in ("adam_beta1", "adam_beta2"):
        if not 0 <= getattr(args, name) < 1:
            raise InputError(f"--{name} must lie in [0, 1), got {getattr(args, name)}")
    if not 0 < args.adam_epsilon <= 1:
        raise InputError(f"--adam_epsilon must lie in (0, 1], got {args.adam_epsilon}")
    if not (math.isfinite(args.weight_decay) and args.weight_decay >= 0):
        raise InputError(f"--weight_decay must be a number >= 0, got {args.weight_decay}")
    for name in ("decay_proportion", "min_lr_ratio"):
        if not 0 <= getattr(args, name) <= 1:
            raise InputError(f"--{name} must lie in [0, 1], got {getattr(args, name)}")
    if args.warmup_proportion + args.decay_proportion > 1:
        raise InputError(f"--warmup_proportion {args.warmup_proportion} and --decay_proportion "
                         f"{args.decay_proportion} overlap: together they must be at most 1")


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
    p.add_argument("--sharding", choices=SHARDING, default="ddp",
                   help="ddp: a whole copy of the model and optimizer state on every process; fsdp: each holds "
                        "1/W of them (FSDP2), for models whose state does not fit one device")
    p.add_argument("--do_train", action="store_true")
    p.add_argument("--do_eval", action="store_true", help="evaluate masked-LM loss/accuracy on --eval_dir")
    p.add_argument("--eval_dir", help="directory of held-out *.hdf5 shards")
    p.add_argument("--eval_steps", type=int, default=0, help="evaluate every N steps (0: at the end only)")
    p.add_argument("--eval_batch_size", type=int, default=0, help="default: the training micro-batch")
    p.add_argument("--json-summary", dest="json_summary", default=None,
                   help="the dllogger JSON-lines log (default: dllogger.json in --output_dir); one run writes it at "
                        "a time")
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
    p.add_argument("--masked_lm_prob_schedule", choices=SCHEDULE_SHAPES, default="constant",
                   help="with --dynamic_masking: the mask rate goes from --masked_lm_prob at the phase's first step to "
                        "--masked_lm_prob_end at its last (--max_steps), linearly or along a half cosine (Ankner et "
                        "al. 2023: 30 %% down to 15 %%); each phase has its own")
    p.add_argument("--masked_lm_prob_end", type=float, default=None,
                   help="with --masked_lm_prob_schedule linear or cosine: the rate at the phase's last step")
    p.add_argument("--whole_word_masking", action="store_true",
                   help="with --dynamic_masking: mask all pieces of a word together (needs --vocab_file)")
    p.add_argument("--vocab_file", help="the shards' vocab.txt or tokenizer.json (WordPiece or byte-level BPE), "
                                        "checked against the shards and the model; with --dynamic_masking its "
                                        "special ids mask (default: the ids the shards record, or [CLS], [SEP] and "
                                        "[MASK] read off the first shard)")
    p.add_argument(ALLOW_VOCAB_MISMATCH, action="store_true",
                   help="warn instead of refusing a tokenizer that does not look like the model's: far fewer tokens "
                        "than its embeddings, or another tokenizer than the shards' or the checkpoint's")
    p.add_argument("--bin_by_length", action="store_true",
                   help="group each step's samples into micro-batches of like lengths (as NVIDIA's LDDL bins): "
                        "less attention over padding with gradient accumulation; the step's samples are unchanged")
    p.add_argument("--pack_sequences", action="store_true",
                   help="place each micro-batch's samples whole, best fit, into as few rows as hold them, each "
                        "attending only to itself with its own positions (needs --no_nsp with BERT configs)")
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
    p.add_argument("--max_tokens", type=float, default=0,
                   help="a token budget for this phase: stop once all processes have trained on this many real "
                        "(non-padding) tokens (or at --max_steps, whichever comes first); the lr schedule's "
                        "progress is then tokens / max_tokens (0: none)")
    p.add_argument("--warmup_tokens", type=float, default=None,
                   help="with --max_tokens: the lr warm-up in tokens, in place of --warmup_proportion")
    p.add_argument("--batch_size_warmup_tokens", type=float, default=0,
                   help="batch-size warm-up (ModernBERT): a step takes fewer micro-batches, growing linearly to "
                        "--gradient_accumulation_steps over the first N real tokens (0: none)")
    p.add_argument("--batch_size_warmup_start", type=float, default=None,
                   help="with --batch_size_warmup_tokens: the first steps' share of the full batch, in whole "
                        "micro-batches per process, at least one (0.125)")
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
    if args.whole_word_masking and not args.dynamic_masking:  # a --vocab_file alone is checked against the shards
        raise InputError("--whole_word_masking goes with --dynamic_masking")
    if args.whole_word_masking and not args.vocab_file:
        raise InputError("--whole_word_masking needs --vocab_file (to know which tokens are '##' word pieces)")
    if args.masked_lm_prob is not None and not args.dynamic_masking:
        raise InputError("--masked_lm_prob masks the samples afresh as they are read: add --dynamic_masking (static "
                         "shards keep the masks create_pretraining_data.py drew)")
    if args.masked_lm_prob is None:
        args.masked_lm_prob = 0.15
    if not 0 < args.masked_lm_prob <= 1:
        raise InputError(f"--masked_lm_prob must lie in (0, 1], got {args.masked_lm_prob}")
    check_mask_schedule(args)
    if args.sharding == "fsdp" and args.allreduce_post_accumulation_fp16:
        raise InputError("--allreduce_post_accumulation_fp16 compresses DDP's all-reduce; --sharding fsdp "
                         "reduce-scatters gradients in fp32: drop one of the two")
    if args.sharding == "fsdp" and args.compile_optimizer:
        raise InputError("--compile_optimizer fuses LAMB's update of whole tensors; --sharding fsdp updates shards "
                         "(whose trust ratios need the other processes' norms): drop one of the two")
    if args.eval_interval_minutes and not (args.do_train and args.eval_dir):
        raise InputError("--eval_interval_minutes evaluates during training: it needs --do_train and --eval_dir")
    if args.pretrain_dropout is not None and not 0 <= args.pretrain_dropout < 1:
        raise InputError(f"--pretrain_dropout must lie in [0, 1), got {args.pretrain_dropout}")
    if args.do_eval and not args.eval_dir:
        raise InputError("--do_eval needs --eval_dir")
    if args.do_eval and not args.do_train and not (args.init_checkpoint or args.resume_from_checkpoint):
        raise InputError("--do_eval without --do_train evaluates given weights: pass --init_checkpoint or "
                         "--resume_from_checkpoint")


def check_mask_schedule(args: argparse.Namespace) -> None:
    """Refuses a mask-rate schedule that cannot apply, with one line: static masks, a missing or bad end rate, or a
    phase whose length in steps is not known before it runs (its rate is a function of the step)."""
    varying = args.masked_lm_prob_schedule != "constant"
    if (varying or args.masked_lm_prob_end is not None) and not args.dynamic_masking:
        raise InputError("--masked_lm_prob_schedule and --masked_lm_prob_end change the mask rate as samples are "
                         "read: add --dynamic_masking (static shards keep the masks create_pretraining_data.py drew)")
    if varying and args.masked_lm_prob_end is None:
        raise InputError(f"--masked_lm_prob_schedule {args.masked_lm_prob_schedule} needs --masked_lm_prob_end, "
                         "the rate at the phase's last step")
    if not varying and args.masked_lm_prob_end is not None:
        raise InputError("--masked_lm_prob_end needs --masked_lm_prob_schedule linear or cosine")
    if varying and not 0 < args.masked_lm_prob_end <= 1:
        raise InputError(f"--masked_lm_prob_end must lie in (0, 1], got {args.masked_lm_prob_end}")
    budget = [f"--{name}" for name in ("train_budget_minutes", "max_tokens", "batch_size_warmup_tokens")
              if getattr(args, name)]
    if varying and budget:
        raise InputError(f"--masked_lm_prob_schedule {args.masked_lm_prob_schedule} follows the steps of "
                         f"--max_steps, which {budget[0]} makes unknown before the phase runs: drop one of them")


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
    if args.warmup_proportion is not None and not 0 <= args.warmup_proportion <= 1:  # also false for NaN
        raise InputError(f"--warmup_proportion must lie in [0, 1], got {args.warmup_proportion}")
    if not (math.isfinite(args.init_loss_scale) and args.init_loss_scale > 0):
        raise InputError(f"--init_loss_scale must be a finite number > 0, got {args.init_loss_scale}")
    if args.steps_this_run == 0 or args.steps_this_run < -1:
        raise InputError(f"--steps_this_run must be -1 (all of --max_steps) or >= 1, got {args.steps_this_run}")
    if not (math.isfinite(args.log_freq) and args.log_freq > 0):
        raise InputError(f"--log_freq must be a number > 0, got {args.log_freq}")
    if args.peak_tflops is not None and not (math.isfinite(args.peak_tflops) and args.peak_tflops > 0):
        raise InputError(f"--peak_tflops must be a number > 0, got {args.peak_tflops}")
    for name in ("train_budget_minutes", "eval_interval_minutes"):
        if not (math.isfinite(getattr(args, name)) and getattr(args, name) >= 0):
            raise InputError(f"--{name} must be a number of minutes >= 0 (0: none), got {getattr(args, name)}")


def check_token_flags(args: argparse.Namespace) -> None:
    """Refuses token counts that are not whole numbers >= 0 and token flags without their companions, with one
    line; fills in --warmup_proportion (from --warmup_tokens when given) and --batch_size_warmup_start."""
    for name in ("max_tokens", "warmup_tokens", "batch_size_warmup_tokens"):
        value = getattr(args, name)
        if value is not None and not (math.isfinite(value) and value >= 0 and value == int(value)):
            raise InputError(f"--{name} must be a whole number of tokens >= 0, got {value}")
        setattr(args, name, None if value is None else int(value))
    if args.max_tokens and args.train_budget_minutes:
        raise InputError("--max_tokens and --train_budget_minutes each measure the schedule's progress: give one")
    if args.warmup_tokens is not None:
        if not args.max_tokens:
            raise InputError("--warmup_tokens is a warm-up in tokens of a token budget: add --max_tokens (or give "
                             "--warmup_proportion)")
        if args.warmup_proportion is not None:
            raise InputError("--warmup_tokens and --warmup_proportion both set the warm-up: give one")
        if args.warmup_tokens > args.max_tokens:
            raise InputError(f"--warmup_tokens {args.warmup_tokens} exceeds --max_tokens {args.max_tokens}")
        args.warmup_proportion = args.warmup_tokens / args.max_tokens  # the schedules take a share
    elif args.warmup_proportion is None:
        args.warmup_proportion = 0.01
    if args.batch_size_warmup_start is not None and not args.batch_size_warmup_tokens:
        raise InputError("--batch_size_warmup_start goes with --batch_size_warmup_tokens")
    if args.batch_size_warmup_start is None:
        args.batch_size_warmup_start = 0.125
    if not 0 < args.batch_size_warmup_start <= 1:
        raise InputError(f"--batch_size_warmup_start must lie in (0, 1], got {args.batch_size_warmup_start}")
    if args.batch_size_warmup_tokens and args.gradient_accumulation_steps < 2:
        raise InputError("--batch_size_warmup_tokens grows the step in whole micro-batches per process: it needs "
                         "--gradient_accumulation_steps 2 or more")


def main(argv: Optional[list[str]] = None) -> None:
    """Parses the flags (argv: sys.argv's when None) and runs; Ctrl-C ends it with one line and exit 130."""
    run_in_process_group(parse_args(argv), run)


def run_in_process_group(args: argparse.Namespace,
                         run_with: Callable[[argparse.Namespace, DistributedContext], None]) -> None:
    """run_with(args, the process group): a signal or a peer's end is one line naming the checkpoint to resume from
    (Ctrl-C 130, SIGTERM outside the steps 143, another process stopped 1)."""
    ctx = init_distributed(args.no_cuda)
    try:
        run_with(args, ctx)
    except (KeyboardInterrupt, Terminated) as stopped:
        end_for_signal(stopped, args.output_dir, ctx)
    except Exception as error:
        # A library may turn the signal into an error of its own (h5py's type conversion raises TypeError): the
        # signal still ends the run, with its line naming the checkpoint to resume from.
        arrived = stop_signal_received()
        if arrived is not None:
            end_for_signal(arrived, args.output_dir, ctx)
        if not (isinstance(error, RuntimeError) and peer_has_gone(error, ctx)):
            raise
        # The others may have stopped on a Ctrl-C sent to the whole job, which reaches this process a moment later:
        # it then ends as they do, without an error line. A SIGTERM meanwhile is the launcher ending this process
        # because another one failed: that one's line says why, and this one says it stopped for it.
        if isinstance(stop_signal_within(PEER_SIGNAL_GRACE_SECONDS), KeyboardInterrupt):
            raise SystemExit(128 + signal.SIGINT) from None
        # The process that stopped first said why; this one's traceback would only bury that line.
        print(f"error: process {ctx.rank}: another process of this run stopped (its own line says why); "
              f"{checkpointing.where_to_resume(args.output_dir)}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None
    finally:
        shut_down_deaf_to_sigterm(ctx)


def end_for_signal(stopped: BaseException, output_dir: str, ctx: DistributedContext) -> NoReturn:
    """A stopped run's line, from the first process only, naming the checkpoint to resume from; 130 or 143."""
    if isinstance(stopped, KeyboardInterrupt):
        line, status = "interrupted (Ctrl-C)", 128 + signal.SIGINT
    else:  # before the loop's own SIGTERM handler, or after it: a step's checkpoint is not due
        line, status = "stopped by SIGTERM outside the steps", 128 + signal.SIGTERM
    if ctx.is_main:
        print(f"{line}: {checkpointing.where_to_resume(output_dir)}", file=sys.stderr, flush=True)
    raise SystemExit(status) from None


def shut_down_deaf_to_sigterm(ctx: DistributedContext) -> None:
    """shutdown(ctx) with SIGTERM ignored: however the run ended (finished, an error, a signal, a peer gone), that end
    has been decided and said, and the launcher's SIGTERM to the other processes of a failed run, arriving while the
    process group shuts down, would replace it (exit 143 and a contradicting line)."""
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        shutdown(ctx)
    finally:
        signal.signal(signal.SIGTERM, before)


def settings_for(args: argparse.Namespace, config: ModelConfig) -> PretrainingSettings:
    """The run's typed settings from its checked flags; the modern family trains the masked-LM objective alone (it
    has no NSP head), as --no_nsp asks of BERT."""
    flags = {name: value for name, value in vars(args).items() if not name.startswith("_")}
    flags["no_nsp"] = args.no_nsp or is_modern_config(config)
    settings = settings_from_flags(flags)
    if settings.stream.pack_sequences and not settings.model.no_nsp:
        raise InputError(f"--pack_sequences puts several samples in a row, and next-sentence prediction reads one "
                         f"[CLS] a row: add --no_nsp (or use a modern config; {args.config_file} is BERT)")
    return settings


def run(args: argparse.Namespace, ctx: DistributedContext) -> None:
    """The command once the flags parse: the typed settings built from them, then the run (pretraining/session.py);
    exit 143 when a SIGTERM stopped the run before its end."""
    start_time = time.time()
    # Every input is checked before the first write: a refused run leaves --output_dir as it was.
    config = read_config(args.config_file)
    settings = settings_for(args, config)
    say_how_it_ended(pretrain(settings, config, ctx, start_time), settings, ctx)


def say_how_it_ended(final: dict, settings: PretrainingSettings, ctx: DistributedContext) -> None:
    """Exit 143 with its line when a SIGTERM stopped the run before its end."""
    if final.get("stopped_by") == "SIGTERM":
        if ctx.is_main:
            print(f"stopped by SIGTERM at step {final['global_step']} before the end of the phase; checkpoint "
                  f"{checkpointing.saved_at(settings.run.output_dir, final['global_step'])}: run again with "
                  "--resume_from_checkpoint to go on", file=sys.stderr, flush=True)
        raise SystemExit(128 + signal.SIGTERM)


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
