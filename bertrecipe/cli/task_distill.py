"""Task distillation (NVIDIA's distillation/task_distill.py, TinyBERT's second stage): a student learns a
fine-tuned teacher's states on a task's training set (--distill_config distillation_config_backbone.json), then its
predictions (distillation_config_heads.json), for a GLUE task or SQuAD v1.1/v2.0, optionally on the augmented
training set data_augmentation.py wrote (--aug_train).

The run is run_glue.py's (GLUE) or run_squad.py's (SQuAD) in every other respect: the same features, checks,
evaluation on the dev set and outputs; the student it writes (pytorch_model.bin and its config in --output_dir) is
an ordinary fine-tuned checkpoint, which the next stage, inference.py, run_downstream.py, convert_checkpoint.py and
triton/deployer.py take unchanged."""
from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path
from typing import NoReturn, Optional

from bertrecipe.cli import run_glue, run_squad
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.distillation.general import STUDENT_INITS
from bertrecipe.distillation.task import TaskDistillation
from bertrecipe.finetuning import glue
from bertrecipe.model.families import question_answering_model, sequence_classification_model
from bertrecipe.model.weights import CONFIG_FILES, HF_WEIGHT_FILES, read_config
from bertrecipe.pretraining.run_tokenizer import released_vocab_file
from bertrecipe.training.process_group import init_distributed, shutdown

SQUAD_TASKS = {"squadv1.1": ("train-v1.1.json", "dev-v1.1.json", False),
               "squadv2.0": ("train-v2.0.json", "dev-v2.0.json", True)}


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--teacher_model", required=True, help="the fine-tuned teacher: run_glue.py's or run_squad.py's "
                   "--output_dir (or a file of it), or a transformers folder with the task's head")
    p.add_argument("--teacher_config_file", help="the teacher's config, where its checkpoint records none")
    p.add_argument("--student_model", required=True, help="the student: general_distill.py's checkpoint, an earlier "
                   "stage's --output_dir, any checkpoint the project reads, or a folder holding only its config "
                   "(started at random)")
    p.add_argument("--student_config_file", help="the student's config, where its checkpoint records none")
    p.add_argument("--student_init", choices=STUDENT_INITS, default="random",
                   help="a student of a config-only --student_model folder starts at random, or from the teacher's "
                        "layers (the last of each block, its embeddings and task head; DistilBERT's way; a narrower "
                        "BERT student keeps an evenly spaced share of each width)")
    p.add_argument("--data_dir", required=True, help="GLUE: the task's folder; SQuAD: the folder of its json files")
    p.add_argument("--task_name", required=True, help=f"{', '.join(glue.TASKS)}, SQuADv1.1 or SQuADv2.0")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--distill_config", required=True, help="distillation_config_backbone.json, then _heads.json")
    p.add_argument("--aug_train", action="store_true", help="train on data_augmentation.py's augmented set")
    p.add_argument("--vocab_file", help="default: the teacher's folder's vocab.txt or tokenizer.json")
    p.add_argument("--do_lower_case", action="store_true")
    p.add_argument("--max_seq_length", type=int, default=128)
    p.add_argument("--doc_stride", type=int, default=128, help="SQuAD: the windows' stride")
    p.add_argument("--max_query_length", type=int, default=64, help="SQuAD: the question's tokens at the most")
    p.add_argument("--train_batch_size", type=int, default=32)
    p.add_argument("--eval_batch_size", type=int, default=8)
    p.add_argument("--learning_rate", type=float, default=5e-5)
    p.add_argument("--num_train_epochs", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--eval_step", type=int, default=None, help="accepted for NVIDIA compatibility; the dev set is "
                   "scored once, at the end")
    p.add_argument("--fp16", "--amp", dest="fp16", action="store_true", help="fp16 autocast + loss scaling (CUDA)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPU or GPU)")
    for flag in ("--no_cuda", "--disable_progress_bar"):
        p.add_argument(flag, action="store_true")
    p.add_argument("--max_steps", type=float, default=-1.0, help="optimizer steps; > 0 overrides the epochs")
    p.add_argument("--log_freq", type=int, default=50, help="log the loss every N optimizer steps")
    p.add_argument("--json-summary", dest="json_summary", default=None, help="dllogger JSON-lines file")
    return p.parse_args(argv)


def command_line(args: argparse.Namespace) -> tuple[list[str], bool]:
    """The run_glue.py or run_squad.py flags of this run (the student as --init_checkpoint, the dev set scored),
    and whether it is SQuAD."""
    vocab = args.vocab_file or released_vocab_file(args.teacher_model)
    if vocab is None:
        raise InputError(f"{args.teacher_model}: holds no vocab.txt or tokenizer.json beside its weights; pass "
                         "--vocab_file (the vocab the teacher was fine-tuned with)")
    common = [*student_flags(args), "--vocab_file", str(vocab), "--output_dir", args.output_dir, "--do_train",
              "--train_batch_size", str(args.train_batch_size), "--learning_rate", repr(args.learning_rate),
              "--num_train_epochs", repr(args.num_train_epochs), "--max_seq_length", str(args.max_seq_length),
              "--seed", str(args.seed), "--max_steps", repr(args.max_steps), "--log_freq", str(args.log_freq)]
    common += [f"--{name}" for name in ("do_lower_case", "fp16", "bf16", "no_cuda", "disable_progress_bar")
               if getattr(args, name)]
    common += ["--json-summary", args.json_summary] if args.json_summary else []
    squad = SQUAD_TASKS.get(args.task_name.lower())
    if squad is None:
        return ["--task_name", args.task_name, "--data_dir", args.data_dir, "--do_eval", "--eval_batch_size",
                str(args.eval_batch_size), *common], False
    train, dev, version_2 = squad
    if args.aug_train:
        train = train.replace(".json", "_aug.json")  # data_augmentation.py's name beside the original
    files = ["--train_file", str(Path(args.data_dir) / train), "--predict_file", str(Path(args.data_dir) / dev),
             "--predict_batch_size", str(args.eval_batch_size),
             "--doc_stride", str(args.doc_stride), "--max_query_length", str(args.max_query_length)]
    return [*files, "--do_predict", "--do_eval", *common, *(["--version_2_with_negative"] if version_2 else [])], True


def student_flags(args: argparse.Namespace) -> list[str]:
    """The student as run_glue's or run_squad's flags: its checkpoint, or a folder holding only its config
    (NVIDIA's BERT_4L_312D/): a student started at random."""
    folder = Path(args.student_model)
    config = next((folder / name for name in CONFIG_FILES if (folder / name).is_file()), None)
    if folder.is_dir() and config is not None and not any((folder / name).is_file() for name in HF_WEIGHT_FILES):
        if args.student_config_file:
            raise InputError(f"--student_model {folder} holds a config and no weights, and --student_config_file "
                             "gives another: give one")
        return ["--config_file", str(config)]
    given = ["--config_file", args.student_config_file] if args.student_config_file else []
    return ["--init_checkpoint", args.student_model, *given]


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    argv_of_run, is_squad = command_line(args)
    teacher_config = read_config(args.teacher_config_file) if args.teacher_config_file else None
    if is_squad:
        run_args, make_model = run_squad.parse_args(argv_of_run), question_answering_model
    else:  # the teacher's head is the task's
        run_args = run_glue.parse_args(argv_of_run)
        make_model = partial(sequence_classification_model, num_labels=glue.get_task(args.task_name).num_labels)
    objective = TaskDistillation(args.teacher_model, args.distill_config, make_model, teacher_config,
                                 args.student_init)
    ctx = init_distributed(run_args.no_cuda)
    try:
        if is_squad:
            run_squad.run(run_args, ctx, objective)
        else:
            run_glue.run(run_args, ctx, objective, "train_aug" if args.aug_train else "train")
    finally:
        shutdown(ctx)


def cli() -> NoReturn:
    """The command line (root script and console script): bad input as one line and exit 2."""
    run_cli(main)
