"""A checkpoint judged as papers judge one: every GLUE task whose folder is in --data_dir, SQuAD v1.1 and v2.0
when their files are there, and a BEIR-layout retrieval folder (when run_retrieval.py is in this checkout), each
fine-tuned over a grid of learning rates (epochs, batch sizes) and seeds by a preset protocol (--preset bert:
the BERT paper's; modernbert: ModernBERT's sweep; cpu_tiny: a small CPU one), every run a process of
run_glue.py / run_squad.py / run_retrieval.py.

Writes <output_dir>/results.md and results.json: per task the median and the min-max of the seeds at each
configuration, the best configuration's median as the task's score, the GLUE average (WNLI excluded), and the
checkpoint (sha256 of its weights), vocab, protocol and hardware the table was made with. Each run keeps its folder
<output_dir>/runs/<task>/lr<lr>_ep<epochs>_bs<batch>_seed<seed>/ (log.txt, the command's outputs, scores.json): a
second call runs only what has no scores.json yet. Runs go one per GPU (CUDA_VISIBLE_DEVICES), or on a CPU a share
of the cores each (OMP_NUM_THREADS). Bad input (a task named in --tasks that is not in --data_dir, a vocab that is
not the checkpoint's, an --output_dir of another checkpoint's runs) is one line before any run; runs that fail are
named at the end (exit status 1) and run again by the next call. See docs/downstream.md.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Optional

import torch

from bertrecipe.cli import finetuning_flags
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.common.files import file_sha256
from bertrecipe.common.output_paths import check_writable_folder, refuse_input_as_output
from bertrecipe.finetuning import downstream_plan as plan
from bertrecipe.finetuning import downstream_report as report
from bertrecipe.finetuning import downstream_runs as runs
from bertrecipe.finetuning.model_loading import build_model, config_and_weights, load_tokenizer
from bertrecipe.model.families import sequence_classification_model
from bertrecipe.model.weights import checkpoint_identity
from bertrecipe.tokenization.vocab_files import identity_of
from bertrecipe.training.run_lock import locked_output_folder

COMMANDS = {plan.GLUE: "run_glue", plan.SQUAD: "run_squad", plan.RETRIEVAL: "run_retrieval"}  # entry.py's names
VOCAB_NAMES = ("vocab.txt", "tokenizer.json")  # what a checkpoint folder may hold as its vocab


def retrieval_available() -> bool:
    return (Path(__file__).parent / "run_retrieval.py").is_file()


def number_list(kind: type) -> Any:
    def parse(text: str) -> tuple:
        try:
            values = tuple(kind(part) for part in text.replace(",", " ").split())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a list of {kind.__name__} values") from None
        if not values or any(not value > 0 for value in values):
            raise argparse.ArgumentTypeError(f"{text!r}: give one or more values > 0")
        return values
    return parse


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--init_checkpoint", required=True, help="our ckpt_*.pt, NVIDIA's checkpoint, a "
                   "pytorch_model.bin or a Hugging Face folder (either model family)")
    p.add_argument("--data_dir", required=True, help="GLUE task folders (CoLA/, SST-2/, ...), SQuAD's "
                   "train-v1.1.json + dev-v1.1.json (and/or v2.0), BEIR folders; see docs/downstream.md")
    p.add_argument("--output_dir", required=True, help="the runs' folders and results.md/results.json")
    p.add_argument("--tasks", type=lambda s: [t for t in s.replace(",", " ").split() if t],
                   help="e.g. 'cola,rte,squad-v1.1' (default: every task found in --data_dir)")
    p.add_argument("--preset", default="bert", choices=sorted(plan.PRESETS), help="the protocol")
    p.add_argument("--learning_rates", type=number_list(float), help="replaces the preset's, e.g. '3e-5,5e-5'")
    p.add_argument("--seeds", type=number_list(int), help="replaces the preset's, e.g. '1,2,3'")
    p.add_argument("--epochs", type=number_list(float), help="replaces the preset's, e.g. '2,3'")
    p.add_argument("--train_batch_size", type=number_list(int), help="replaces the preset's, e.g. '16,32'")
    p.add_argument("--max_seq_length", type=int, help="replaces the preset's")
    p.add_argument("--max_steps", type=int, help="passed on: stops each run after this many optimizer steps")
    p.add_argument("--gradient_accumulation_steps", type=int, default=1, help="passed on: each batch in this many "
                   "micro-batches (the same batch size, less memory; every batch size must be a multiple)")
    p.add_argument("--workers", type=int, help="runs at a time (default: one per GPU; on a CPU its cores split "
                   "by the preset's threads per run)")
    p.add_argument("--vocab_file", help="default: the checkpoint folder's vocab.txt or tokenizer.json")
    p.add_argument("--config_file", help="default: the checkpoint's own config")
    p.add_argument("--do_lower_case", action="store_true")
    finetuning_flags.add_allow_vocab_mismatch(p)
    p.add_argument("--fp16", "--amp", dest="fp16", action="store_true", help="passed on (CUDA)")
    p.add_argument("--bf16", action="store_true", help="passed on")
    p.add_argument("--no_cuda", action="store_true", help="run on the CPU even where there are GPUs")
    p.add_argument("--keep_models", action="store_true", help="keep each run's fine-tuned weights (removed once "
                   "scored by default)")
    args = p.parse_args(argv)
    for name in ("max_seq_length", "max_steps", "workers", "gradient_accumulation_steps"):
        if getattr(args, name) is not None:
            finetuning_flags.check_positive(args, name)
    if args.fp16 and args.bf16:
        raise InputError("--fp16 and --bf16: choose one precision")
    return args


@dataclass
class Setup:
    """Everything a call needs, checked before the first write."""

    output_dir: Path
    tasks: list[plan.Task]
    grids: dict[str, plan.Grid]
    runs: list[plan.PlannedRun]
    identity: dict[str, Any]  # what every run's scores must have been made with
    header: dict[str, Any]
    slots: list[runs.Slot]
    common_flags: list[str]
    keep_models: bool


def set_up(args: argparse.Namespace) -> Setup:
    data_dir, output_dir = Path(args.data_dir).resolve(), Path(args.output_dir).resolve()
    if not data_dir.is_dir():
        raise InputError(f"--data_dir {args.data_dir}: not a folder")
    found = plan.find_tasks(data_dir, args.tasks, retrieval_available())
    plan.check_found(found, data_dir)
    tasks = [plan.checked_task_data(task) for task in found.tasks]
    preset = plan.PRESETS[args.preset]
    overrides = plan.GridOverrides(args.learning_rates, args.epochs, args.train_batch_size, args.seeds,
                                   args.max_seq_length)
    grids = plan.task_grids(preset, tasks, overrides)
    batches = sorted({batch for grid in grids.values() for batch in grid.batch_sizes})
    if any(batch % args.gradient_accumulation_steps for batch in batches):
        raise InputError(f"--gradient_accumulation_steps {args.gradient_accumulation_steps}: the grid's batch sizes "
                         f"({', '.join(map(str, batches))}) must all be multiples of it")
    checkpoint = Path(args.init_checkpoint).resolve()
    vocab_file = resolve_vocab(args, checkpoint)
    check_output_dir(output_dir, data_dir, [("--init_checkpoint", checkpoint), ("--vocab_file", vocab_file)])
    vocab = check_model(args, checkpoint, vocab_file, max(g.max_seq_length for g in grids.values()))
    precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
    checkpoint_id = checkpoint_identity(checkpoint)
    identity = {"checkpoint_sha256": checkpoint_id["sha256"], "vocab_sha256": vocab["sha256"],
                "do_lower_case": args.do_lower_case, "precision": precision, "max_steps": args.max_steps,
                "config_sha256": file_sha256(Path(args.config_file)) if args.config_file else None}
    planned = plan.plan_runs(tasks, grids)
    gpus = 0 if args.no_cuda else torch.cuda.device_count()
    slots, threads = make_slots(args, preset, gpus, len(planned))
    protocol = report.protocol_record(preset, grids, args.max_steps, overrides)
    header = {"checkpoint": checkpoint_id, "vocab": vocab, "config_file": args.config_file,
              "data_dir": str(data_dir), "protocol": protocol,
              "hardware": report.hardware_record(gpus, len(slots), threads, precision), "command": sys.argv}
    return Setup(output_dir, tasks, grids, planned, identity, header, slots,
                 common_flags(args, checkpoint, vocab_file), args.keep_models)


def resolve_vocab(args: argparse.Namespace, checkpoint: Path) -> Path:
    if args.vocab_file:
        return Path(args.vocab_file).resolve()
    if checkpoint.is_dir():
        for name in VOCAB_NAMES:
            if (checkpoint / name).is_file():
                return checkpoint / name
    raise InputError(f"--vocab_file: not given and {checkpoint} is no folder holding {' or '.join(VOCAB_NAMES)}; "
                     "pass the vocab the checkpoint was trained with")


def check_model(args: argparse.Namespace, checkpoint: Path, vocab_file: Path, max_seq_length: int) -> dict[str, Any]:
    """What every run will check, checked once here so that a vocab of another model (its size, casing or recorded
    tokenizer) or a checkpoint that does not load is one line before any run: the encoder is built and loaded as
    the runs build theirs. Returns the vocab's identity for the tables."""
    if not checkpoint.exists():
        raise InputError(f"--init_checkpoint {args.init_checkpoint}: no such file or folder")
    tokenizer = load_tokenizer(vocab_file, args.do_lower_case, args.allow_vocab_mismatch)
    config, weights = config_and_weights(args.config_file, str(checkpoint))
    build_model(lambda c: sequence_classification_model(c, 2), config, weights, str(checkpoint), tokenizer.vocab,
                max_seq_length, args.allow_vocab_mismatch)
    identity = identity_of(tokenizer.vocab)
    return {"path": str(vocab_file), "kind": identity.kind, "size": identity.size, "sha256": identity.sha256,
            "do_lower_case": args.do_lower_case}


def check_output_dir(output_dir: Path, data_dir: Path, model: list[tuple[str, Path]]) -> None:
    """--output_dir must be writable, no input, and outside --data_dir (runs among a task's files could be taken
    for data by a later search of the folder)."""
    check_writable_folder(output_dir, "--output_dir")
    refuse_input_as_output(output_dir, "--output_dir", [("--data_dir", data_dir), *model])
    if output_dir.is_relative_to(data_dir):
        raise InputError(f"--output_dir {output_dir}: lies inside --data_dir {data_dir}; choose a folder outside "
                         "the data")


def make_slots(args: argparse.Namespace, preset: plan.Preset, gpus: int,
               runs_planned: int) -> tuple[list[runs.Slot], Optional[int]]:
    """(the slots, the threads a run gets on a CPU). GPUs: one run per GPU unless --workers says otherwise."""
    if gpus:
        return runs.gpu_slots(gpus, args.workers or gpus, os.environ.get("CUDA_VISIBLE_DEVICES")), None
    cores = len(os.sched_getaffinity(0))
    workers = args.workers or max(1, cores // preset.cpu_threads_per_run)
    workers = max(1, min(workers, runs_planned))
    return runs.cpu_slots(cores, workers), max(1, cores // workers)


def common_flags(args: argparse.Namespace, checkpoint: Path, vocab_file: Path) -> list[str]:
    """The flags every run is given whatever its task: the model, the vocab, the precision."""
    flags = ["--init_checkpoint", str(checkpoint), "--vocab_file", str(vocab_file)]
    flags += ["--config_file", str(Path(args.config_file).resolve())] if args.config_file else []
    for name in ("do_lower_case", "allow_vocab_mismatch", "fp16", "bf16", "no_cuda"):
        flags += [f"--{name}"] if getattr(args, name) else []
    flags += ["--gradient_accumulation_steps", str(args.gradient_accumulation_steps)]
    return flags + (["--max_steps", str(args.max_steps)] if args.max_steps else [])


def run_command(setup: Setup, run: plan.PlannedRun, folder: Path) -> list[str]:
    """The command line of one run: its task's command with the common flags and the run's own."""
    name = COMMANDS[run.task.kind]
    code = f"import sys; sys.argv[0] = '{name}.py'; from bertrecipe.cli.entry import {name}; {name}()"
    hyper = ["--learning_rate", f"{run.learning_rate!r}", "--num_train_epochs", f"{run.epochs!r}",
             "--train_batch_size", str(run.batch_size), "--seed", str(run.seed), "--max_seq_length",
             str(run.max_seq_length), "--warmup_proportion", str(run.warmup_proportion), "--output_dir", str(folder)]
    return [sys.executable, "-c", code, *setup.common_flags, *hyper, *task_flags(run, folder, setup.output_dir)]


def task_flags(run: plan.PlannedRun, folder: Path, output_dir: Path) -> list[str]:
    task, log = run.task, ["--json-summary", str(folder / "dllogger.json")]
    if task.kind == plan.GLUE:
        return ["--task_name", task.name, "--data_dir", str(task.folder), "--do_train", "--do_eval",
                "--eval_batch_size", "32", "--disable_progress_bar", *log]
    if task.kind == plan.SQUAD:
        # Windows as NVIDIA's (query 64, stride 128) where they fit, shorter for short --max_seq_length.
        query = min(64, run.max_seq_length // 4)
        stride = min(128, (run.max_seq_length - query - 3) // 2)
        version = ["--version_2_with_negative"] if task.name == "squad-v2.0" else []
        return ["--train_file", str(task.train_file), "--predict_file", str(task.dev_file), "--do_train",
                "--do_predict", "--do_eval", *version, "--max_query_length", str(query), "--doc_stride", str(stride),
                "--predict_batch_size", "32", "--cache_dir", str(output_dir / "cache"), "--disable_progress_bar",
                *log]
    return ["--data_dir", str(task.folder), "--split", "test", "--pooling", "mean", "--do_train", "--train_file",
            str(task.train_file), "--do_eval", "--disable_progress_bar", *log]


def child_environment() -> dict[str, str]:
    """The runs import bertrecipe from where this process does, installed or not."""
    root = str(Path(__file__).resolve().parents[2])  # the folder holding bertrecipe/
    return {"PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    setup = set_up(args)
    failed = execute(setup)
    if failed:
        print(f"error: {len(failed)} run(s) failed: {', '.join(failed)}; their log.txt and failure.json are in "
              f"{setup.output_dir / 'runs'}; run the command again to rerun them", file=sys.stderr, flush=True)
        raise SystemExit(1)


def execute(setup: Setup) -> list[str]:
    """Runs what has no scores yet, then writes the tables; returns the runs that failed."""
    runs_dir = setup.output_dir / "runs"
    with locked_output_folder(setup.output_dir, True):
        done, todo = runs.sort_out_folders(setup.runs, runs_dir, setup.identity)
        slot_names = sorted({slot.name.split()[0] for slot in setup.slots})
        print(f"{len(setup.tasks)} task(s): {', '.join(report.task_title(t.name) for t in setup.tasks)}; "
              f"{len(setup.runs)} runs, {len(done)} done earlier, {len(todo)} to run, {len(setup.slots)} at a time "
              f"({'/'.join(slot_names)}); preset {setup.header['protocol']['preset']}", flush=True)
        for slot in setup.slots:
            slot.env.update(child_environment())
        executor = runs.Executor(runs_dir, lambda run, folder: run_command(setup, run, folder), setup.identity,
                                  setup.keep_models)
        outcomes = executor.run_all(todo, setup.slots, runs.Progress(len(setup.runs), len(done)))
        records = {**done, **{o.run.label: o.record for o in outcomes if o.record is not None}}
        failed = [o.run.label for o in outcomes if o.record is None]
        table = report.build_report(setup.header, setup.tasks, setup.runs, records, failed)
        report.write_report(setup.output_dir, table)
    print(f"tables: {setup.output_dir / 'results.md'} and results.json", flush=True)
    return failed


def cli() -> NoReturn:
    """The command line (root script and console script): bad input as one line and exit 2."""
    run_cli(main)
