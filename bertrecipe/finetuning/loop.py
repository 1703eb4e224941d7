"""What run_squad.py and run_glue.py share on top of training.py: their common flags, the model built from a
config and any accepted checkpoint, the epoch loop over in-memory feature arrays (shuffled, split across
processes, grouped into optimizer steps run by training.Stepper), timed batched inference, and the fine-tuned
checkpoint (`pytorch_model.bin` = {"model": state_dict} beside `bert_config.json`)."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, ContextManager, Optional, Sequence

import numpy as np
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset
from tqdm import tqdm

from bertrecipe.common.atomic_files import remove_stale_temporaries, write_temporary
from bertrecipe.tokenization.wordpiece import (ALLOW_VOCAB_MISMATCH, BertTokenizer, Vocab, check_vocab_for_model,
                                         load_vocab)
from bertrecipe.training.process_group import DistributedContext, all_reduce_sum, any_process
from bertrecipe.common.errors import InputError
from bertrecipe.training.metric_logger import MetricLogger, check_log_paths
from bertrecipe.model.bert import BertConfig
from bertrecipe.model.weights import (CONFIG_FILES, HF_WEIGHT_FILES, LoadedWeights, load_weights_into, read_config,
                                      read_weights)
from bertrecipe.common.output_paths import check_writable, check_writable_folder, refuse_input_as_output
from bertrecipe.training.run_lock import RunLock, locked_output_folder
from bertrecipe.training.stepper import Precision, Stepper, allow_tf32, batches_to_device, take, unwrap

Arrays = dict[str, np.ndarray]
Batch = dict[str, torch.Tensor]


def add_common_arguments(p: argparse.ArgumentParser, *, batch_size: int, learning_rate: float, epochs: float,
                         warmup: float) -> None:
    """The flags both fine-tuning entry points take, with NVIDIA's names (defaults differ per script)."""
    p.add_argument("--bert_model", default="bert-large-uncased", help="accepted for NVIDIA compatibility; unused")
    p.add_argument("--init_checkpoint", help="our ckpt_*.pt, NVIDIA's checkpoint, a pytorch_model.bin or a HF dir")
    p.add_argument("--vocab_file", required=True, help="WordPiece vocab.txt")
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
    p.add_argument("--disable_progress_bar", action="store_true")
    p.add_argument("--num_workers", type=int, default=0, help="DataLoader workers per process")
    p.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", -1)),
                   help="set by older launchers; torchrun's environment is used")
    p.add_argument("--no_cuda", action="store_true")


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
    if args.do_train and args.train_batch_size % args.gradient_accumulation_steps:
        raise InputError(f"--train_batch_size {args.train_batch_size} is not a multiple of "
                         f"--gradient_accumulation_steps {args.gradient_accumulation_steps}")
    if args.do_train and args.num_train_epochs == 0 and args.max_steps == -1:
        raise InputError("--do_train needs --num_train_epochs > 0 or --max_steps > 0")
    check_writable_folder(args.output_dir, "--output_dir")
    check_log_paths(args.json_summary)
    allow_tf32(args.tf32)


Paths = list[tuple[str, Optional[str | Path]]]  # (flag or description, path or None)


def model_inputs(args: argparse.Namespace) -> Paths:
    """The model files a run reads: --vocab_file, --config_file and --init_checkpoint with what read_weights may
    read along (a folder's weights and config, the config beside a checkpoint file)."""
    inputs: Paths = [("--vocab_file", args.vocab_file), ("--config_file", args.config_file)]
    if args.init_checkpoint:
        path = Path(args.init_checkpoint)
        folder = path if path.is_dir() else path.parent
        names = (*CONFIG_FILES, *HF_WEIGHT_FILES) if path.is_dir() else CONFIG_FILES
        inputs.append(("--init_checkpoint", path))
        inputs += [(f"the {name} of --init_checkpoint", folder / name) for name in names if (folder / name).is_file()]
    return inputs


def check_output_paths(args: argparse.Namespace, inputs: Paths, files: Sequence[str]) -> None:
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
    """--output_dir's run lock (run_lock.py), held by the first process while the block runs."""
    return locked_output_folder(args.output_dir, ctx.is_main, lambda flag: any_process(flag, ctx))


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


def load_tokenizer(vocab_file: str | Path, do_lower_case: bool, allow_vocab_mismatch: bool = False) -> BertTokenizer:
    """The tokenizer of a vocab.txt; a vocab whose casing --do_lower_case contradicts is refused (InputError naming
    the file) unless allow_vocab_mismatch (then a warning): tokenization.wordpiece.check_vocab_for_model."""
    vocab = load_vocab(vocab_file)
    check_vocab_for_model(vocab, do_lower_case=do_lower_case, allow_mismatch=allow_vocab_mismatch)
    return BertTokenizer(vocab, do_lower_case)


def model_config(config_file: Optional[str],
                 init_checkpoint: Optional[str]) -> tuple[BertConfig, Optional[LoadedWeights]]:
    """The model's config (--config_file, else the checkpoint's own) and the checkpoint's weights (None without
    one). A config that does not fit the weights is reported when they are loaded."""
    weights = read_weights(init_checkpoint) if init_checkpoint else None
    if config_file:
        return read_config(config_file), weights
    if weights is None or weights.config is None:
        raise InputError(f"{init_checkpoint or '--init_checkpoint'}: no config known for this model; "
                         "pass --config_file")
    return weights.config, weights


def build_model(make: Callable[[BertConfig], nn.Module], config: BertConfig, weights: Optional[LoadedWeights],
                source: Optional[str], vocab: Vocab, max_seq_length: int, allow_vocab_mismatch: bool = False
                ) -> nn.Module:
    """make(config) with the checkpoint's weights; the vocab (check_vocab_for_model: its size against the config's
    vocab_size) and the sequence length must fit the config."""
    check_vocab_for_model(vocab, model_vocab_size=config.vocab_size, allow_mismatch=allow_vocab_mismatch)
    if max_seq_length > config.max_position_embeddings:
        raise InputError(f"--max_seq_length {max_seq_length} exceeds the model's max_position_embeddings "
                         f"{config.max_position_embeddings}")
    model = make(config)
    if weights is not None:
        load_weights_into(model, weights, source or "checkpoint")
    return model


MODEL_FILES = ("pytorch_model.bin", "bert_config.json")


def remove_stale_output_temporaries(output_dir: str | Path, names: Sequence[str]) -> list[Path]:
    """Removes what killed writes of `names` left in output_dir: our `.<name>.<pid>.<random>.tmp` names (see
    atomic_files) and the names earlier versions used, `.<name>.tmp` and `<name>.<random>.tmp`. Nothing else."""
    removed = remove_stale_temporaries(output_dir, names)
    alternatives = "|".join(re.escape(name) for name in names)
    legacy = re.compile(rf"\.(?:{alternatives})\.tmp|(?:{alternatives})\.[a-z0-9_]{{8}}\.tmp")
    for path in Path(output_dir).iterdir():
        if legacy.fullmatch(path.name) and path.is_file():
            path.unlink(missing_ok=True)
            removed.append(path)
    return removed


class StagedOutputs:
    """The output files of one run, written under temporary names in output_dir (`.<name>.<pid>.<random>.tmp`) and
    renamed into place together by commit(): a run that fails before commit() leaves output_dir as it was.

    A file that describes a model (results, predictions) must never sit beside another model. commit()
    therefore, when it replaces the model, first removes the old copies of the other files it replaces, then
    renames the model, then the rest: a crash between two renames (only a kill or power loss can stop a
    burst of renames) leaves the new model without its results, never the old results beside the new model.
    Used as a context manager, an exception discards the staged files. The folder is created, and stale
    temporaries of `names` removed, at the first write."""

    def __init__(self, output_dir: str | Path, names: Sequence[str]) -> None:
        self.output_dir = Path(output_dir)
        self.names = tuple(names)
        self._staged: dict[str, Path] = {}
        self._opened = False

    def write(self, name: str, write: Callable[[BinaryIO], None]) -> Path:
        """Runs write(file) on a new temporary file that commit() will rename to `name`; returns its path."""
        if name not in self.names:
            raise ValueError(f"{name} is not one of the outputs {self.names}")
        try:
            if not self._opened:
                self.output_dir.mkdir(parents=True, exist_ok=True)
                remove_stale_output_temporaries(self.output_dir, self.names)
                self._opened = True
            tmp = write_temporary(self.output_dir / name, write)
        except OSError as error:  # a full disk, a read-only folder: the earlier outputs stay as they were
            raise InputError(f"{self.output_dir / name}: cannot write it ({error.strerror or error}); nothing in "
                             f"{self.output_dir} was replaced") from None
        if name in self._staged:
            self._staged[name].unlink(missing_ok=True)
        self._staged[name] = tmp
        return tmp

    def write_text(self, name: str, text: str) -> Path:
        return self.write(name, lambda f: f.write(text.encode("utf-8")))

    def write_json(self, name: str, obj: Any, indent: int = 2) -> Path:
        return self.write_text(name, json.dumps(obj, indent=indent) + "\n")  # serialized before the file opens

    def commit(self) -> list[Path]:
        """Renames every staged file into place (see the class); returns the final paths."""
        models = [name for name in MODEL_FILES if name in self._staged]
        described = [name for name in self._staged if name not in MODEL_FILES]
        if models:
            for name in described:
                (self.output_dir / name).unlink(missing_ok=True)
        done = []
        for name in models + described:
            os.replace(self._staged.pop(name), self.output_dir / name)
            done.append(self.output_dir / name)
        return done

    def discard(self) -> None:
        for tmp in self._staged.values():
            tmp.unlink(missing_ok=True)
        self._staged.clear()

    def __enter__(self) -> "StagedOutputs":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.discard()  # after commit() nothing is left to discard


def stage_finetuned(stage: StagedOutputs, model: nn.Module, config: BertConfig) -> Path:
    """Stages pytorch_model.bin ({"model": state_dict}) and bert_config.json; returns the model's temporary path."""
    path = stage.write("pytorch_model.bin", lambda f: torch.save({"model": unwrap(model).state_dict()}, f))
    stage.write_text("bert_config.json", json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    return path


def save_finetuned(model: nn.Module, config: BertConfig, output_dir: str | Path) -> Path:
    """Writes output_dir/pytorch_model.bin ({"model": state_dict}) and bert_config.json, together."""
    with StagedOutputs(output_dir, MODEL_FILES) as stage:
        stage_finetuned(stage, model, config)
        stage.commit()
    return Path(output_dir) / "pytorch_model.bin"


# ---------------------------------------------------------------------------------------------------------
# Training loop
# ---------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopSettings:
    micro_batch_size: int  # per process
    accumulation: int
    epochs: float
    max_steps: int  # > 0 overrides epochs
    seed: int
    log_freq: int = 50
    progress_bar: bool = True
    num_workers: int = 0
    trim_padding: bool = False  # see as_tensors


SEQUENCE_KEYS = ("input_ids", "segment_ids", "input_mask")


def as_tensors(arrays: Arrays, rows: np.ndarray, trim: bool = False) -> Batch:
    """Rows of the feature arrays as tensors: integers as int64 (embedding indexes, labels), floats as they are.
    trim: cut the sequence columns after the longest real sequence of these rows (padding is masked out, so
    the outputs at real positions do not change; short GLUE sentences then cost far less)."""
    width = int(arrays["input_mask"][rows].sum(1).max()) if trim and len(rows) else None
    batch = {}
    for key, values in arrays.items():
        values = values[rows]
        if width is not None and key in SEQUENCE_KEYS:
            values = values[:, :width]
        tensor = torch.from_numpy(np.ascontiguousarray(values))
        batch[key] = tensor.long() if values.dtype.kind in "iub" else tensor
    return batch


class _Rows(Dataset):
    """Micro-batches given as lists of row indexes, turned into tensors (in a worker when num_workers > 0)."""

    def __init__(self, arrays: Arrays, batches: Sequence[np.ndarray], trim: bool) -> None:
        self.arrays, self.batches, self.trim = arrays, batches, trim

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, index: int) -> Batch:
        return as_tensors(self.arrays, self.batches[index], self.trim)


def epoch_micro_batches(n: int, micro_batch_size: int, seed: int, epoch: int,
                        ctx: DistributedContext) -> list[np.ndarray]:
    """This process's micro-batches of one epoch: a seeded shuffle of all n rows, wrapped around so that every
    process gets the same count (DDP needs the same number of steps everywhere), dealt out round-robin."""
    order = np.random.default_rng([seed, epoch]).permutation(n)
    order = np.resize(order, math.ceil(n / ctx.world_size) * ctx.world_size)
    mine = order[ctx.rank :: ctx.world_size]
    return [mine[i : i + micro_batch_size] for i in range(0, len(mine), micro_batch_size)]


def planned_steps(n: int, settings: LoopSettings, ctx: DistributedContext) -> int:
    """Optimizer steps of the run: max_steps when > 0, else the epochs' worth (a last partial step counts)."""
    if settings.max_steps > 0:
        return settings.max_steps
    micro_batches = math.ceil(math.ceil(n / ctx.world_size) / settings.micro_batch_size)
    return max(1, math.ceil(math.ceil(micro_batches / settings.accumulation) * settings.epochs))


def train_loop(model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any, precision: Precision,
               arrays: Arrays, compute_loss: Callable[[nn.Module, Batch], torch.Tensor], settings: LoopSettings,
               total_steps: int, ctx: DistributedContext, log: MetricLogger) -> dict[str, float]:
    """Runs total_steps optimizer steps over shuffled epochs of `arrays`; returns e2e_train_time,
    training_sequences_per_second (all processes) and final_loss (the last step's, averaged over processes)."""
    n = len(next(iter(arrays.values())))
    if n == 0:
        raise InputError("no training features")
    stepper = Stepper(model, optimizer, scheduler, precision, compute_loss)
    progress = _Progress(total_steps, settings, ctx, log, optimizer, stepper)
    model.train()
    epoch = 0
    while progress.steps < total_steps:
        batches = epoch_micro_batches(n, settings.micro_batch_size, settings.seed, epoch, ctx)
        loader = DataLoader(_Rows(arrays, batches, settings.trim_padding), batch_size=None,
                            num_workers=settings.num_workers,
                            pin_memory=ctx.device.type == "cuda")
        iterator = iter(loader)
        for _ in range(math.ceil(len(batches) / settings.accumulation)):
            micro = [batches_to_device(b, ctx.device) for b in take(iterator, settings.accumulation)]
            progress.count(epoch, micro, stepper.step(micro).loss)
            if progress.steps == total_steps:
                break
        epoch += 1
    return progress.finish()


class _Progress:
    """train_loop's counts, progress bar and log records: the loss (averaged over processes), learning rate,
    skipped steps and throughput every log_freq optimizer steps and at the last one."""

    def __init__(self, total_steps: int, settings: LoopSettings, ctx: DistributedContext, log: MetricLogger,
                 optimizer: torch.optim.Optimizer, stepper: Stepper) -> None:
        self.total_steps, self.log_freq, self.ctx, self.log = total_steps, settings.log_freq, ctx, log
        self.optimizer, self.stepper = optimizer, stepper
        self.bar = tqdm(total=total_steps, disable=not (settings.progress_bar and ctx.is_main), desc="fine-tuning",
                        unit="step", dynamic_ncols=True)
        self.start = time.perf_counter()
        self.steps, self.sequences = 0, 0
        # Per-step throughput: sequences of all processes since the previous record, over the wall time since
        # then, read once the record's loss all-reduce has synchronised.
        self.record_clock, self.sequences_at_record = self.start, 0
        self.final_loss = float("nan")

    def count(self, epoch: int, micro: Sequence[Batch], loss: float) -> None:
        """One optimizer step over the micro-batches `micro`, whose loss (this process's) was `loss`."""
        self.steps += 1
        self.sequences += sum(len(next(iter(b.values()))) for b in micro) * self.ctx.world_size
        self.bar.update(1)
        if self.steps % self.log_freq == 0 or self.steps == self.total_steps:
            self.record(epoch, loss)

    def record(self, epoch: int, loss: float) -> None:
        self.final_loss = float(all_reduce_sum(torch.tensor([loss], dtype=torch.float64, device=self.ctx.device),
                                               self.ctx)) / self.ctx.world_size
        now = time.perf_counter()
        self.log.log([epoch, self.steps], {
            "step_loss": self.final_loss, "learning_rate": self.optimizer.param_groups[0]["lr"],
            "skipped_steps": self.stepper.skipped_steps,
            "training_sequences_per_second": (self.sequences - self.sequences_at_record)
            / max(now - self.record_clock, 1e-9)})
        self.record_clock, self.sequences_at_record = now, self.sequences
        self.bar.set_postfix(loss=f"{self.final_loss:.4f}")

    def finish(self) -> dict[str, float]:
        self.bar.close()
        elapsed = time.perf_counter() - self.start
        return {"e2e_train_time": elapsed, "training_sequences_per_second": self.sequences / elapsed,
                "final_loss": self.final_loss}


# ---------------------------------------------------------------------------------------------------------
# Inference
# ---------------------------------------------------------------------------------------------------------
@torch.no_grad()
def timed_inference(model: nn.Module, arrays: Arrays, batch_size: int, precision: Precision,
                    forward: Callable[[nn.Module, Batch], Sequence[torch.Tensor]],
                    progress_bar: bool = False, trim: bool = False) -> tuple[list[np.ndarray], list[float]]:
    """forward(model, batch) over all rows in order, batch_size at a time, in eval mode; returns each output
    concatenated as float32 numpy arrays and the wall time (seconds) of every batch. trim: see as_tensors
    (only for outputs without a sequence axis)."""
    model = unwrap(model)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    n = len(next(iter(arrays.values())))
    outputs: list[list[np.ndarray]] = []
    latencies: list[float] = []
    for first in tqdm(range(0, n, batch_size), disable=not progress_bar, desc="inference", unit="batch"):
        rows = np.arange(first, min(first + batch_size, n))
        batch = batches_to_device(as_tensors(arrays, rows, trim), device)
        tick = time.perf_counter()
        with precision.autocast():
            result = forward(model, batch)
        result = [r.float().cpu().numpy() for r in result]  # .cpu() waits for the device: the time is honest
        latencies.append(time.perf_counter() - tick)
        for i, r in enumerate(result):
            if len(outputs) <= i:
                outputs.append([])
            outputs[i].append(r)
    model.train(was_training)
    return [np.concatenate(o) for o in outputs], latencies


def latency_summary(latencies: Sequence[float], sequences: int) -> dict[str, float]:
    """Inference throughput and per-batch latency statistics in milliseconds (mean, p50/p90/p95/p99)."""
    total = float(sum(latencies))
    ms = np.asarray(latencies, np.float64) * 1000.0
    summary = {"e2e_inference_time": total, "inference_sequences_per_second": sequences / total if total else 0.0,
               "latency_avg_ms": float(ms.mean()) if ms.size else 0.0}
    for p in (50, 90, 95, 99):
        summary[f"latency_p{p}_ms"] = float(np.percentile(ms, p)) if ms.size else 0.0
    return summary
