"""A pre-trained checkpoint's masked-LM and next-sentence scores on HDF5 shards (NVIDIA's run_pretraining_inference.py,
with its flags): masked-LM accuracy over every masked token, the mean masked-LM loss and, where the checkpoint was
trained with next-sentence prediction, the share of next-sentence labels its head gets right. These are the numbers
run_pretraining.py --do_eval gives, since this command is that evaluation with NVIDIA's flags.

The checkpoint is --ckpt_dir's ckpt_<--ckpt_step>.pt (-1, the default: the newest that loads), or --init_checkpoint
(our or NVIDIA's checkpoint, or a Hugging Face folder with the pre-training heads). The config is --config_file or
the checkpoint's own. The scores are printed, with NVIDIA's closing line (`Finished: Final Loss = ...`), and logged to
--json-summary and --output_dir/dllogger.json where those are given (without --output_dir the run's folder is a
temporary one, removed at the end).

Example (NVIDIA's scripts/run_pretraining_inference.sh):
  python run_pretraining_inference.py --input_dir=data/hdf5/test --ckpt_dir=results/checkpoints \\
      --config_file=bert_configs/large.json --eval_batch_size=14 --max_seq_length=512 --max_predictions_per_seq=80 \\
      --ckpt_step=-1 --eval
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path
from typing import NoReturn, Optional

from bertrecipe.cli import run_pretraining
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.model import sharded_checkpoint
from bertrecipe.training import checkpointing
from bertrecipe.training.metric_logger import read_log


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input_dir", required=True, help="directory of the *.hdf5 shards to score")
    p.add_argument("--ckpt_dir", help="a run's --output_dir: its ckpt_<step>.pt files")
    p.add_argument("--ckpt_step", type=int, default=-1, help="which checkpoint of --ckpt_dir (-1: the newest)")
    p.add_argument("--init_checkpoint", help="a checkpoint file or Hugging Face folder, instead of --ckpt_dir")
    p.add_argument("--config_file", help="bert_config.json (default: the checkpoint's own)")
    p.add_argument("--vocab_file", help="the shards' vocab, checked against the checkpoint's record")
    p.add_argument("--bert_model", default="bert-large-uncased", help="accepted for NVIDIA compatibility; unused")
    p.add_argument("--eval_batch_size", type=int, default=64)
    p.add_argument("--max_seq_length", type=int, default=512)
    p.add_argument("--max_predictions_per_seq", type=int, default=80)
    p.add_argument("--max_steps", type=int, default=-1,
                   help="accepted for NVIDIA compatibility; every sample of the shards is scored")
    p.add_argument("--eval", action="store_true", help="NVIDIA's mode flag: scoring is what this command does")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--fp16", "--amp", dest="fp16", action="store_true", help="fp16 autocast (CUDA)")
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPU or GPU)")
    p.add_argument("--output_dir", help="keep the run's folder (its log) here (default: a temporary folder)")
    p.add_argument("--json-summary", dest="json_summary", help="also log the scores to this dllogger JSON file")
    p.add_argument("--local_rank", type=int, default=-1, help="set by torch.distributed.launch; torchrun needs none")
    return p.parse_args(argv)


def chosen_checkpoint(args: argparse.Namespace) -> str:
    """--init_checkpoint, or --ckpt_dir's checkpoint of --ckpt_step (the newest that loads for -1)."""
    if (args.init_checkpoint is None) == (args.ckpt_dir is None):
        raise InputError("name the checkpoint to score: --ckpt_dir (with --ckpt_step) or --init_checkpoint, not both")
    if args.init_checkpoint is not None:
        return args.init_checkpoint
    if args.ckpt_step >= 0:
        path = checkpointing.saved_at(args.ckpt_dir, args.ckpt_step)
        if not path.exists():
            steps = [step for step, _ in checkpointing.list_checkpoints(args.ckpt_dir)]
            raise InputError(f"{path}: no such checkpoint; {args.ckpt_dir} holds steps {steps or 'none'}")
        return str(path)
    newest = checkpointing.newest_good_checkpoint(args.ckpt_dir)
    if newest is None:
        raise InputError(f"{args.ckpt_dir}: holds no ckpt_<step>.pt (or sharded ckpt_<step>.dcp) that loads; check "
                         "--ckpt_dir")
    return str(newest)


def trained_without_nsp(checkpoint: str) -> bool:
    """Whether our checkpoint records a run with --no_nsp (its next-sentence head never trained: not scored)."""
    if not (Path(checkpoint).is_file() or sharded_checkpoint.is_sharded_checkpoint(checkpoint)):
        return False
    return bool((checkpointing.load_checkpoint(checkpoint, mmap=True).get("args") or {}).get("no_nsp", False))


def evaluation_argv(args: argparse.Namespace, checkpoint: str, config_file: str, output_dir: str) -> list[str]:
    """run_pretraining.py's flags for scoring `checkpoint` on --input_dir."""
    argv = ["--input_dir", args.input_dir, "--eval_dir", args.input_dir, "--do_eval", "--init_checkpoint", checkpoint,
            "--config_file", config_file, "--output_dir", output_dir, "--eval_batch_size", str(args.eval_batch_size),
            "--train_batch_size", str(args.eval_batch_size), "--max_seq_length", str(args.max_seq_length),
            "--max_predictions_per_seq", str(args.max_predictions_per_seq), "--seed", str(args.seed),
            "--disable_progress_bar", "--json-summary", str(Path(output_dir) / "dllogger.json")]
    argv += ["--vocab_file", args.vocab_file] if args.vocab_file else []
    argv += ["--no_nsp"] if trained_without_nsp(checkpoint) else []
    return argv + [f"--{name}" for name in ("fp16", "bf16") if getattr(args, name)]


def checkpoint_config(checkpoint: str, folder: Path) -> str:
    """The checkpoint's own config, written as a file in `folder` for run_pretraining.py's --config_file."""
    from bertrecipe.model.weights import read_weights

    config = read_weights(checkpoint).config
    if config is None:
        raise InputError(f"{checkpoint}: carries no model config; pass --config_file bert_config.json")
    path = folder / "bert_config.json"
    path.write_text(json.dumps(config.to_dict(), indent=2) + "\n", encoding="utf-8")
    return str(path)


def score(args: argparse.Namespace, checkpoint: str, scratch: Path) -> dict:
    output_dir = args.output_dir or str(scratch / "run")
    config_file = args.config_file or checkpoint_config(checkpoint, scratch)
    run_pretraining.main(evaluation_argv(args, checkpoint, config_file, output_dir))
    return read_log(Path(output_dir) / "dllogger.json")[-1]["data"]


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    several = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if several and not args.output_dir:  # each process would make a temporary folder of its own
        raise InputError("--output_dir: needed when launched in several processes (the run's shared folder)")
    checkpoint = chosen_checkpoint(args)
    with tempfile.TemporaryDirectory(prefix="run_pretraining_inference.") as scratch:
        scores = score(args, checkpoint, Path(scratch))
    if int(os.environ.get("RANK", "0")) != 0:
        return  # the first process reports
    if args.json_summary:
        from bertrecipe.training.metric_logger import MetricLogger

        log = MetricLogger(args.json_summary)
        log.log([], {"checkpoint": checkpoint, **scores})
        log.close()
    line = f"masked-LM accuracy {scores['eval_mlm_accuracy']:.4f}"
    if "eval_nsp_accuracy" in scores:
        line += f", next-sentence accuracy {scores['eval_nsp_accuracy']:.4f}"
    print(f"{checkpoint}: {line}, masked-LM loss {scores['eval_loss']:.4f}", flush=True)
    print(f"Finished: Final Loss = {scores['eval_loss']}", flush=True)  # the line NVIDIA's script reads


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
