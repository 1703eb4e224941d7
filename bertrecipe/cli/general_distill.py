"""General distillation (NVIDIA's distillation/general_distill.py, TinyBERT's first stage): a smaller student of the
teacher's family learns the teacher's states on the pre-training shards, as JSON config asks (NVIDIA's
distillation_config_backbone.json: attention scores, hidden states through a projection, value relations,
embeddings, masked-LM logits at a temperature).

Every flag of run_pretraining.py applies (shards of either kind, phases, DDP, precision, checkpoints, exact
resume); the student is --config_file's model, or NVIDIA's --student_model folder (its config; with
--continue_train its weights). Defaults follow NVIDIA's distillation: AdamW, learning rate 1e-4, warm-up 10 %."""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, Optional

from bertrecipe.cli import run_pretraining
from bertrecipe.cli.command_line import run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.distillation.general import STUDENT_INITS, GeneralDistillation
from bertrecipe.model.weights import read_config
from bertrecipe.pretraining.session import pretrain
from bertrecipe.training.process_group import DistributedContext

CONFIG_NAMES = ("config.json", "bert_config.json")  # a model folder's config, as NVIDIA's and transformers' write it


@dataclass(frozen=True)
class DistillationFlags:
    """The flags run_pretraining does not have (taken out of the namespace before its settings are built)."""

    teacher_model: str
    distill_config: str
    student_init: str
    teacher_config_file: Optional[str]
    do_lower_case: Optional[bool]


def parse_args(argv: Optional[list[str]] = None) -> tuple[argparse.Namespace, DistillationFlags]:
    p = run_pretraining.build_parser(__doc__, config_required=False)
    g = p.add_argument_group("distillation (NVIDIA's general_distill.py flags)")
    g.add_argument("--teacher_model", required=True, help="the teacher: our checkpoint, NVIDIA's (with "
                   "--teacher_config_file) or a Hugging Face folder, of either family")
    g.add_argument("--teacher_config_file", help="the teacher's config, where its checkpoint records none")
    g.add_argument("--student_model", help="a folder holding the student's config.json (NVIDIA's BERT_4L_312D/), "
                   "with --continue_train its weights too; or give --config_file (and --init_checkpoint)")
    g.add_argument("--continue_train", action="store_true", help="start from --student_model's weights")
    g.add_argument("--distill_config", required=True, help="distillation_config_backbone.json or your own")
    g.add_argument("--student_init", choices=STUDENT_INITS, default="random",
                   help="where neither --init_checkpoint nor --continue_train gives weights: random, or the "
                        "teacher's layers (the last of each block, DistilBERT's way; a narrower BERT student keeps an "
                        "evenly spaced share of each width)")
    g.add_argument("--do_lower_case", action="store_true", default=None,
                   help="NVIDIA's; the shards record their casing, and a contradicting flag is refused")
    g.add_argument("--steps_per_epoch", type=int, default=-1, help="accepted for NVIDIA compatibility; unused")
    p.set_defaults(optimizer="adamw", learning_rate=1e-4, warmup_proportion=0.1, do_train=True)  # NVIDIA: no --do_train
    args = p.parse_args(argv)
    if args.sharding == "fsdp":
        raise InputError("--sharding fsdp: general distillation trains under DDP (a student this small fits every "
                         "device; sharding it beside its teacher is not done yet)")
    flags = DistillationFlags(args.teacher_model, args.distill_config, args.student_init, args.teacher_config_file,
                              args.do_lower_case)
    resolve_student(args)
    for name in ("teacher_model", "distill_config", "student_init", "teacher_config_file", "do_lower_case",
                 "student_model", "continue_train", "steps_per_epoch"):
        delattr(args, name)
    args.no_nsp = True  # a student learns no next-sentence head: the teacher's states are its objective
    return run_pretraining.checked(args), flags


def resolve_student(args: argparse.Namespace) -> None:
    """NVIDIA's --student_model (and --continue_train) as our --config_file (and --init_checkpoint)."""
    if args.student_model is None:
        if args.config_file is None:
            raise InputError("general_distill.py: give the student's config: --student_model FOLDER or --config_file")
        if args.continue_train:
            raise InputError("--continue_train starts from --student_model's weights: give --student_model")
        return
    folder = Path(args.student_model)
    config = next((folder / name for name in CONFIG_NAMES if (folder / name).is_file()), None)
    if config is None:
        raise InputError(f"{folder}: holds no {' or '.join(CONFIG_NAMES)}; pass a folder with the student's config")
    if args.config_file is not None and Path(args.config_file).resolve() != config.resolve():
        raise InputError(f"--config_file {args.config_file} and --student_model {folder} both give the student's "
                         "config: give one")
    if args.continue_train and args.init_checkpoint is not None:
        raise InputError("--continue_train and --init_checkpoint both give the student's weights: give one")
    args.config_file = str(config)
    if args.continue_train:
        args.init_checkpoint = str(folder)


def main(argv: Optional[list[str]] = None) -> None:
    args, flags = parse_args(argv)
    run_pretraining.run_in_process_group(args, lambda parsed, ctx: run(parsed, flags, ctx))


def run(args: argparse.Namespace, flags: DistillationFlags, ctx: DistributedContext) -> None:
    start_time = time.time()
    config = read_config(args.config_file)
    teacher_config = read_config(flags.teacher_config_file) if flags.teacher_config_file else None
    objective = GeneralDistillation(flags.teacher_model, flags.distill_config, flags.student_init, teacher_config,
                                    flags.do_lower_case)
    settings = run_pretraining.settings_for(args, config)
    run_pretraining.say_how_it_ended(pretrain(settings, config, ctx, start_time, objective), settings, ctx)


def cli() -> NoReturn:
    """The command line (root script and console script): bad input as one line and exit 2."""
    run_cli(main)
