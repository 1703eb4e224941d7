"""The command-line flags that run_squad.py and run_glue.py share (NVIDIA's names), their checks, and the checks of
a run's paths and its --output_dir lock; --allow_vocab_mismatch for every command that takes a vocab with a model."""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import ContextManager, Optional, Sequence

from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable, check_writable_folder, refuse_input_as_output
from bertrecipe.finetuning.loop import LoopSettings
from bertrecipe.model.weights import CONFIG_FILES, HF_WEIGHT_FILES
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH
from bertrecipe.training.metric_logger import check_log_paths
from bertrecipe.training.process_group import DistributedContext, any_process
from bertrecipe.training.run_lock import RunLock, locked_output_folder
from bertrecipe.training.stepper import allow_tf32


def add_common_arguments(p: argparse.ArgumentParser, *, batch_size: int, learning_rate: float, epochs: float,
                         warmup: float) -> None:
    """The flags both fine-tuning entry points take, with NVIDIA's names (defaults differ per script)."""
    p.add_argument("--bert_model", default="bert-large-uncased", help="accepted for NVIDIA compatibility; unused")
    p.add_argument("--init_checkpoint", help="our ckpt_*.pt, NVIDIA's checkpoint, a pytorch_model.bin or a HF dir")
    p.add_argument("--vocab_file", required=True,
                   help="WordPiece vocab.txt, or a tokenizer.json: WordPiece (a BERT folder's) or byte-level BPE (a "
                        "ModernBERT folder's), told apart by its model type")
    p.add_argument("--config_file", help="bert_config.json (default: the checkpoint's own config)")
    p.add_argument("--output_dir", required=True)
    p.add_argument("--do_train", action="store_true")
    p.add_argument("--train_batch_size", type=int, default=batch_size, help="per process, before accumulation")
    p.add_argument("--learning_rate", type=float, default=learning_rate)
    p.add_argument("--num_train_epochs", type=float, default=epochs)
    p.add_argument("--max_steps", type=float, default=-1.0, help="optimizer steps; > 0 overrides the epochs")
    p.add_argument("--warmup_proportion", type=float, default=warmup)
    p.add_argument("--gradient_accumulation_steps", type=int, default=1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--do_lower_case", action="store_true")
    add_allow_vocab_mismatch(p)
    p.add_argument("--fp16", "--amp", dest="fp16", action="store_true", help="fp16 autocast + loss scaling (CUDA)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPU or GPU)")
    p.add_argument("--tf32", action="store_true", help="TF32 matmuls in fp32 training (Ampere+ GPUs)")
    p.add_argument("--loss_scale", type=float, default=0, help="accepted for compatibility; scaling is dynamic")
    p.add_argument("--json-summary", dest="json_summary", default=None, help="dllogger JSON-lines file")
    p.add_argument("--log_freq", type=int, default=50, help="log the loss every N optimizer steps")
    p.add_argument("--peak_tflops", type=float,
                   help="the device's dense peak (TFLOP/s) that the logs' mfu is against (default: a known GPU's "
                        "bf16/fp16 peak, or this CPU's measured GEMM rate)")
    p.add_argument("--disable_progress_bar", action="store_true")
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader workers per process")
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)),
                   help="set by older launchers; torchrun's environment is used")
    p.add_argument("--no_cuda", action="store_true")


def add_onnx_model_argument(p: argparse.ArgumentParser, export: str) -> None:
    """--onnx_model: prediction and evaluation with an exported model instead of a checkpoint."""
    p.add_argument("--onnx_model", help=f"instead of --init_checkpoint: a model.onnx of {export}, fp32 or --int8, run "
                                        "on ONNX Runtime's CPU kernels (prediction and evaluation only)")


def check_onnx_model_flags(args: argparse.Namespace) -> None:
    """--onnx_model runs the exported model as it is: the flags that pick, train or cast a PyTorch model are refused
    beside it (InputError naming them)."""
    if not args.onnx_model:
        return
    given = [flag for flag, value in (("--init_checkpoint", args.init_checkpoint), ("--config_file", args.config_file),
                                      ("--do_train", args.do_train), ("--fp16", args.fp16), ("--bf16", args.bf16))
             if value]
    if given:
        raise InputError(f"--onnx_model runs the exported model as it is, on ONNX Runtime: {', '.join(given)} "
                         "do not apply")


def check_common_arguments(args: argparse.Namespace) -> None:
    """Refuses flag values that make no sense with one line naming the flag (InputError), before anything is
    read or written, and applies --tf32. --max_steps keeps NVIDIA's meaning: -1 trains --num_train_epochs."""
    check_positive(args, "train_batch_size", "gradient_accumulation_steps")
    if args.num_workers < 0:
        raise InputError(f"--num_workers must be 0 or more, got {args.num_workers}")
    if not (math.isfinite(args.learning_rate) and args.learning_rate > 0):
        raise InputError(f"--learning_rate must be a finite number > 0, got {args.learning_rate}")
    if not (math.isfinite(args.num_train_epochs) and args.num_train_epochs >= 0):
        raise InputError(f"--num_train_epochs must be a finite number >= 0, got {args.num_train_epochs}")
    if not 0 <= args.warmup_proportion <= 1:  # also false for NaN
        raise InputError(f"--warmup_proportion must lie in [0, 1], got {args.warmup_proportion}")
    # NVIDIA's scripts pass -1 (or "-1.0") for "use the epochs"; 0 and other negatives are refused rather than
    # guessed at (0 could mean "no training" as well).
    if not (args.max_steps == -1 or (args.max_steps >= 1 and float(args.max_steps).is_integer())):
        raise InputError(f"--max_steps must be -1 (train --num_train_epochs) or a whole number of optimizer "
                         f"steps >= 1, got {args.max_steps}")
    if args.peak_tflops is not None and not (math.isfinite(args.peak_tflops) and args.peak_tflops > 0):
        raise InputError(f"--peak_tflops must be a number > 0, got {args.peak_tflops}")
    if args.do_train and args.train_batch_size % args.gradient_accumulation_steps:
        raise InputError(f"--train_batch_size {args.train_batch_size} is not a multiple of "
                         f"--gradient_accumulation_steps {args.gradient_accumulation_steps}")
    if args.do_train and args.num_train_epochs == 0 and args.max_steps == -1:
        raise InputError("--do_train needs --num_train_epochs > 0 or --max_steps > 0")
    check_writable_folder(args.output_dir, "--output_dir")
    check_log_paths(args.json_summary)
    allow_tf32(args.tf32)


def finetuning_loop_settings(args: argparse.Namespace, progress_bar: bool, trim_padding: bool = False) -> LoopSettings:
    """The fine-tuning loop's settings from the common flags (checked): --train_batch_size is split into
    --gradient_accumulation_steps micro-batches."""
    return LoopSettings(micro_batch_size=args.train_batch_size // args.gradient_accumulation_steps,
                        accumulation=args.gradient_accumulation_steps, epochs=args.num_train_epochs,
                        max_steps=args.max_steps, learning_rate=args.learning_rate,
                        warmup_proportion=args.warmup_proportion, seed=args.seed, log_freq=args.log_freq,
                        progress_bar=progress_bar, num_workers=args.num_workers, trim_padding=trim_padding,
                        peak_tflops=args.peak_tflops)


Paths = list[tuple[str, Optional[str | Path]]]  # (flag or description, path or None)


def model_inputs(args: argparse.Namespace) -> Paths:
    """The model files a run reads: --vocab_file, --config_file, --onnx_model and --init_checkpoint with what
    read_weights may read along (a folder's weights and config, the config beside a checkpoint file)."""
    inputs: Paths = [("--vocab_file", args.vocab_file), ("--config_file", args.config_file),
                     ("--onnx_model", getattr(args, "onnx_model", None))]
    return inputs + (checkpoint_inputs("--init_checkpoint", args.init_checkpoint) if args.init_checkpoint else [])


def checkpoint_inputs(flag: str, checkpoint: str | Path) -> Paths:
    """A checkpoint given by `flag` and what read_weights may read along: a folder's weights and config, the config
    beside a checkpoint file."""
    path = Path(checkpoint)
    folder = path if path.is_dir() else path.parent
    names = (*CONFIG_FILES, *HF_WEIGHT_FILES) if path.is_dir() else CONFIG_FILES
    return [(flag, path), *((f"the {name} of {flag}", folder / name) for name in names if (folder / name).is_file())]


def check_run_outputs(args: argparse.Namespace, inputs: Paths, files: Sequence[str]) -> None:
    """Refuses, before the first write, an output that is one of the run's inputs (InputError naming both): the
    --output_dir folder (nor an input folder), the `files` this run writes in it, the --json-summary log; and an
    output file that cannot be written where it is named."""
    refuse_input_as_output(args.output_dir, "--output_dir", inputs)
    # (what it is, where, the flag that moves it)
    outputs = [(f"{name} (in --output_dir)", Path(args.output_dir) / name, "--output_dir") for name in files]
    if args.json_summary:
        outputs.append(("--json-summary", Path(args.json_summary), "--json-summary"))
    for what, path, flag in outputs:
        refuse_input_as_output(path, what, inputs, fix=f"choose another {flag}")
        check_writable(path, what)


def locked_output_dir(args: argparse.Namespace, ctx: DistributedContext) -> ContextManager[Optional[RunLock]]:
    """--output_dir's run lock (run_lock.py), and --json-summary's where it lies elsewhere, held by the first
    process while the block runs."""
    return locked_output_folder(args.output_dir, ctx.is_main, lambda flag: any_process(flag, ctx),
                                log_file=args.json_summary)


def check_positive(args: argparse.Namespace, *names: str) -> None:
    """InputError unless each named integer flag is at least 1."""
    for name in names:
        if getattr(args, name) < 1:
            raise InputError(f"--{name} must be at least 1, got {getattr(args, name)}")


def add_allow_vocab_mismatch(p: argparse.ArgumentParser) -> None:
    """The flag of every command that takes a vocab with a model (see load_tokenizer and build_model)."""
    p.add_argument(ALLOW_VOCAB_MISMATCH, action="store_true",
                   help="warn instead of refusing a vocab that does not look like the model's: far fewer tokens than "
                        "its embeddings, or a casing that --do_lower_case contradicts")

