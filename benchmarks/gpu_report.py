"""The GPU report: one command that tests and measures the recipe on one GPU and writes one JSON and one Markdown
table (gpu_report.json, gpu_report.md in --output_dir), each naming the GPU, its driver, torch and the precision.

Run it through benchmarks/gpu_report.sh (the python that has torch, the repository on PYTHONPATH, --wheels).
Sections, in order; each against a peer measured in the same run:
  cuda_tests      python -m pytest -m cuda tests: the counts of passed, failed, skipped and collection errors;
  gemm_peak       matmul rates in bf16, fp16 and TF32 on a large square GEMM and BERT's layer GEMMs (gemm_peak.py);
  model_step      BERT pre-training steps at each length in fp16 and bf16 autocast: ours (BertForPreTraining + LAMB)
                  against transformers' BertForPreTraining + AdamW (model_throughput.py): sequences/s, share of the
                  GEMM peak (analytic FLOPs), peak memory;
  max_micro_batch the largest micro-batch of each that fits at the longest length (doubling, then bisection);
  loop            the whole run_pretraining.py loop (loader included) on shards of the embedded default corpus,
                  against the model step alone on the very batches the loop reads first;
  finetune        SQuAD fine-tuning and inference on full windows, ours against transformers'
                  (finetune_throughput.py);
  sharding        DDP beside FSDP (--sharding fsdp) on all the GPUs, one process each (fsdp_memory.py, fp32, LAMB):
                  each process's parameters, gradients and optimizer state, its peak allocated memory, the step
                  time (one GPU shards nothing: its FSDP row is the cost of FSDP's own machinery);
  profile         (--profile) torch.profiler's top 15 CUDA kernels of one of our steps at each length;
  compiled_step   model_step's rows with both models under torch.compile (last: compiling takes minutes);
  data_prep       (--data_prep) data_prep_scale.py at 1, 2, 4, 8 and 16 processes.
A measurement that fails records its error line and the run goes on; the files are rewritten (atomically) after
every row, so a run cut off keeps what it measured. --time_budget skips the rows that no longer fit. Each goal
is met, NOT met, or, where a number it needs was not measured (the peer not installed, a failed or skipped row),
"not measured (why)": never missed for want of a measurement.
--tiny runs the same code with a tiny BERT, tiny batches and 1-2 steps on the CPU (or GPU): the CI's check.
"""
from __future__ import annotations

import argparse
import datetime
import functools
import gc
import itertools
import json
import math
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch

from benchmarks.common import (
    REPO,
    VOCAB_EXCERPT,
    benchmark_command,
    default_corpus_documents,
    masked_per_seq,
    real_token_fraction,
    shards_of_documents,
    time_steps,
)
from benchmarks.gemm_peak import forward_flops, gemm_peak, is_cuda
from benchmarks.gpu_report_markdown import render
from benchmarks.model_throughput import (
    LARGE,
    Batch,
    StepOptions,
    Trainer,
    make_batch,
    ours_trainer,
    peer_trainer,
    to_device,
    training_flops,
)
from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.hardware import detect
from bertrecipe.model.bert import BertConfig

SECTIONS = ("cuda_tests", "gemm_peak", "model_step", "max_micro_batch", "loop", "finetune", "sharding", "profile",
            "compiled_step", "data_prep")
OPTIONAL = {"profile": "--profile", "data_prep": "--data_prep"}
TINY_CONFIG = BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128)
# About how long a row takes on an H100 (compiles included): a row is skipped when less of --time_budget is left.
NEEDS_SECONDS = {"model_step": 20, "max_micro_batch": 60, "loop": 90, "finetune": 40, "sharding": 60, "profile": 20,
                 "compiled_step": 150, "data_prep": 60}


@dataclass
class Settings:
    """What each section measures: the GPU run's or --tiny's sizes."""

    device: str
    tiny: bool
    config_name: str
    config: BertConfig
    seqs: list[int]
    batch: dict[int, int]  # micro-batch at each length
    amp: list[str]  # the model step's precisions; the first is the loop's, finetune's, profile's and compile's
    gemm_precisions: list[str]
    gemm_square: int
    gemm_tokens: int
    warmup: int
    steps: int
    compile_backend: str
    compile_seqs: list[int]
    # LAMB's update fused by torch.compile: off on GPUs, as run_pretraining.py's default there (a compiled call per
    # tensor is launch-bound on a GPU; the multi-tensor path is a dozen foreach kernels), and off in --tiny
    compiled_optimizer: bool
    search_start: int
    search_cap: int
    loop_steps: int  # run_pretraining.py --max_steps; its first two are warm-up
    corpus_chars: int  # of the default corpus made into shards
    finetune_seq: int
    finetune_batch: int
    finetune_steps: int
    sections: list[str]
    time_budget: float | None
    tests_timeout: float
    tests_paths: list[str]  # where pytest looks for the cuda tier
    data_prep_gb: float
    data_prep_processes: list[int]


def gpu_settings(args: argparse.Namespace, device: str, sections: list[str]) -> Settings:
    return Settings(
        device, tiny=False, config_name="BERT-large", config=LARGE, seqs=[128, 512],
        batch={128: args.batch_128, 512: args.batch_512}, amp=["bf16", "fp16"],
        gemm_precisions=["bf16", "fp16", "tf32"],
        gemm_square=8192, gemm_tokens=16384, warmup=3, steps=10, compile_backend="inductor", compile_seqs=[128, 512],
        compiled_optimizer=False, search_start=32, search_cap=2048, loop_steps=20, corpus_chars=2_000_000,
        finetune_seq=384, finetune_batch=32, finetune_steps=4, sections=sections, time_budget=args.time_budget,
        tests_timeout=180, tests_paths=["tests"], data_prep_gb=0.05, data_prep_processes=[1, 2, 4, 8, 16])


def tiny_settings(args: argparse.Namespace, device: str, sections: list[str]) -> Settings:
    """Every code path at toy sizes: the compiles through the eager backend (dynamo's tracing, no codegen) and
    LAMB's update unfused, both of which would take minutes of a C++ compiler on a CPU."""
    return Settings(
        device, tiny=True, config_name="tiny BERT", config=TINY_CONFIG, seqs=[32, 64], batch={32: 4, 64: 2},
        amp=["bf16", "fp16"], gemm_precisions=["bf16", "fp16", "tf32"], gemm_square=128, gemm_tokens=64, warmup=1,
        steps=2, compile_backend="eager", compile_seqs=[32], compiled_optimizer=False, search_start=1, search_cap=4,
        loop_steps=6, corpus_chars=60_000, finetune_seq=64, finetune_batch=2, finetune_steps=1, sections=sections,
        time_budget=args.time_budget, tests_timeout=300, data_prep_gb=0.0005,
        # the plumbing only (on a CPU every cuda test skips): one module, not the whole suite's collection
        tests_paths=["tests/test_cuda.py"], data_prep_processes=[1, 2])


class Deadline:
    def __init__(self, seconds: float | None) -> None:
        self.budget = seconds
        self.end = None if seconds is None else time.monotonic() + seconds

    def left(self) -> float:
        return math.inf if self.end is None else self.end - time.monotonic()

    def lacks(self, seconds: float) -> str | None:
        """Why a row needing about `seconds` is skipped, or None when it fits in what is left."""
        if self.left() >= seconds:
            return None
        return (f"skipped: {max(self.left(), 0):.0f} s of the {self.budget:.0f} s time budget left, the row needs "
                f"about {seconds} s")


class Report:
    """The report's JSON (and its Markdown rendering), rewritten atomically after every row."""

    def __init__(self, folder: Path, header: dict[str, Any]) -> None:
        self.json_path, self.markdown_path = folder / "gpu_report.json", folder / "gpu_report.md"
        self.data: dict[str, Any] = {"header": header, "sections": {}}

    def open(self, name: str, **fields: Any) -> None:
        self.data["sections"][name] = {"rows": [], **fields}
        self.save()

    def add(self, name: str, row: dict[str, Any]) -> None:
        self.data["sections"][name]["rows"].append(row)
        self.save()

    def fail(self, name: str, line: str) -> None:
        self.data["sections"][name]["error"] = line
        self.save()

    def save(self) -> None:
        text = json.dumps(self.data, indent=2) + "\n"
        write_atomic(self.json_path, lambda f: f.write(text.encode()))
        markdown = render(self.data)
        write_atomic(self.markdown_path, lambda f: f.write(markdown.encode()))


@dataclass
class Run:
    settings: Settings
    report: Report
    deadline: Deadline
    work: Path  # scratch: shards, configs, loop logs
    peaks: dict[str, float] = field(default_factory=dict)  # precision -> GEMM peak GFLOP/s
    shards: dict[int, Path] = field(default_factory=dict)

    def add(self, section: str, row: dict[str, Any]) -> None:
        self.report.add(section, row)


def error_line(error: BaseException) -> str:
    """One line saying what failed: a subprocess's last line of stderr, else the exception's first line."""
    if isinstance(error, subprocess.CalledProcessError):
        stderr = error.stderr.decode(errors="replace") if isinstance(error.stderr, bytes) else error.stderr or ""
        lines = [line for line in stderr.splitlines() if line.strip()]
        return f"{Path(str(error.cmd[1])).name} exited with {error.returncode}: {lines[-1] if lines else 'no stderr'}"
    if isinstance(error, subprocess.TimeoutExpired):
        return f"{Path(str(error.cmd[1])).name} timed out after {error.timeout:.0f} s"
    first = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return f"{type(error).__name__}: {first}"[:400]


def free_memory(device: str) -> None:
    gc.collect()
    if is_cuda(device):
        torch.cuda.empty_cache()


def measured(device: str, measure: Callable[..., dict[str, Any]], *args: Any) -> dict[str, Any]:
    """measure(*args)'s fields, or {"error": its error line}; the device's cached memory is freed after either,
    outside the except block, so that the traceback's frames (and the activations they hold) are gone first."""
    try:
        result = measure(*args)
    except Exception as error:  # one broken row must not lose the rest
        result = {"error": error_line(error)}
    free_memory(device)
    return result


def peak_memory_gib(device: str) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if is_cuda(device) else None


def reset_peak_memory(device: str) -> None:
    if is_cuda(device):
        torch.cuda.reset_peak_memory_stats(device)


def goal(text: str, value: float | None, at_least: float, missing: str) -> dict[str, Any]:
    """The goal `value >= at_least`: met or missed ("met": true or false). Where its measurement did not run (value
    None: the peer not installed, a step out of memory, the time budget spent) it is not measured ("met": null),
    `missing` saying why, and never counts as missed."""
    if value is None:
        return {"goal": text, "met": None, "not_measured": missing}
    return {"goal": text, "met": bool(value >= at_least)}


def why_absent(row: dict[str, Any], parts: list[str]) -> str:
    """Why the numbers of `parts` (ours, peer, loop, model_step) are absent from `row`: their error lines, else the
    row's own (a skipped row's time budget)."""
    errors = [f"{part}: {row[f'{part}_error']}" for part in parts if row.get(f"{part}_error")]
    return "; ".join(errors) or row.get("error") or f"no number of {' or '.join(parts)}"


# --- cuda_tests -------------------------------------------------------------------------------------------------

PYTEST_COUNT = re.compile(r"(\d+) (passed|failed|skipped|deselected|xfailed|xpassed|errors?)\b")
PYTEST_RESULT = re.compile(r"::\S+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)\b")
RESULT_KEYS = {"PASSED": "passed", "FAILED": "failed", "SKIPPED": "skipped", "ERROR": "errors", "XFAIL": "xfailed",
               "XPASS": "xpassed"}


def pytest_counts(output: str) -> dict[str, int]:
    """The counts of pytest's closing line ("1 failed, 3 passed, 1268 deselected in 7.1s"; error(s) as errors),
    or, where it never came (a run cut off), those of the -v lines of the tests that ended."""
    closing = next((line for line in reversed(output.splitlines()) if re.search(r" in [\d.]+s", line)), None)
    counts = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "deselected": 0}
    if closing is None:
        for result in PYTEST_RESULT.findall(output):
            counts[RESULT_KEYS[result]] = counts.get(RESULT_KEYS[result], 0) + 1
        return counts
    for number, kind in PYTEST_COUNT.findall(closing):
        counts["errors" if kind.startswith("error") else kind] = int(number)
    return counts


def run_group(command: list[str], timeout: float) -> tuple[int | None, str]:
    """(exit status, stdout and stderr) of `command` run from the checkout in a process group of its own; past
    `timeout` the whole group is killed (pytest's DDP workers, data prep's processes) and the status is None."""
    process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        return process.returncode, output
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()  # what it printed before: the tests that ended
        return None, output


def cuda_tests(run: Run) -> None:
    """The cuda-marked tests; collection errors of modules needing packages the GPU host lacks (matplotlib,
    hypothesis) are counted, not fatal, so that the cuda tests of the other modules still run."""
    command = [sys.executable, "-m", "pytest", "-m", "cuda", *run.settings.tests_paths, "-v", "-p", "no:cacheprovider",
               "--continue-on-collection-errors"]
    timeout = min(run.settings.tests_timeout, max(run.deadline.left(), 30))
    tick = time.perf_counter()
    status, output = run_group(command, timeout)
    problems = [line for line in output.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    row = {"command": " ".join(command[1:]), "returncode": status, "seconds": time.perf_counter() - tick,
           **pytest_counts(output), "problems": problems[:20], "tail": output.splitlines()[-3:]}
    if status is None:
        row["error"] = f"pytest -m cuda cut off after {timeout:.0f} s; the counts are of the tests that ended"
    run.add("cuda_tests", row)


# --- gemm_peak --------------------------------------------------------------------------------------------------

def gemm_section(run: Run) -> None:
    s = run.settings
    for precision in s.gemm_precisions:
        result = measured(s.device, lambda p: {"peak": gemm_peak(s.config, s.gemm_tokens, p, square=s.gemm_square,
                                                                 device=s.device)}, precision)
        if "error" in result:
            run.add("gemm_peak", {"precision": precision, **result})
            continue
        peak = result["peak"]
        run.peaks[precision] = peak.gflops
        for shape, gflops in peak.by_shape.items():
            run.add("gemm_peak", {"precision": precision, "shape": shape, "gflops": gflops,
                                  "best": gflops == peak.gflops})


# --- model_step and compiled_step -------------------------------------------------------------------------------

def time_trainer(build: Callable[..., Trainer], options: StepOptions, run: Run, batch: Batch) -> dict[str, Any]:
    """Seconds per step (median after warm-up), the first step's seconds (compiling, when compiled) and the peak
    memory of a model built afresh; the model is gone when this returns."""
    s = run.settings
    reset_peak_memory(s.device)
    try:
        trainer = build(s.config, options)
        step = functools.partial(trainer.step, to_device(batch, s.device))
        tick = time.perf_counter()
        step()
        first = time.perf_counter() - tick
        seconds = time_steps(step, max(s.warmup - 1, 0), s.steps)
    finally:
        if options.compile_model:  # drop the compiled graphs and their guards: the next model compiles afresh
            torch._dynamo.reset()
    return {"step_seconds": seconds, "first_step_seconds": first, "peak_memory_gib": peak_memory_gib(s.device)}


def model_goals(row: dict[str, Any], run: Run) -> list[dict[str, Any]]:
    """The goals of a model-step row (a skipped one included), each met, missed or not measured."""
    unmeasured = [name for name in ("ours", "peer") if f"{name}_seq_per_s" not in row]
    goals = [goal("ours >= 1.5x transformers", row.get("speedup"), 1.5, why_absent(row, unmeasured))]
    if row["seq"] == 128 and "H100" in run.report.data["header"]["device"]:
        goals.append(goal(">= 1,400 seq/s at seq 128 on one H100", row.get("ours_seq_per_s"), 1400,
                          why_absent(row, ["ours"])))
    if row["precision"] == "bf16":
        missing = why_absent(row, ["ours"]) if "ours_seq_per_s" not in row else "no bf16 GEMM peak was measured"
        goals.append(goal(">= 45 % of the bf16 GEMM peak", row.get("ours_of_peak"), 0.45, missing))
    return goals


def model_row(run: Run, seq: int, precision: str, compiled: bool) -> dict[str, Any]:
    """Ours and the peer on the same batch at `precision`, each with its sequences/s, share of the GEMM peak of
    that precision (training_flops: analytic, MLM head on the masked positions) and peak memory."""
    s = run.settings
    size, masked = s.batch[seq], masked_per_seq(seq)
    row: dict[str, Any] = {"seq": seq, "batch": size, "masked": masked, "precision": precision, "compiled": compiled}
    options = StepOptions(s.device, precision, compiled, s.compile_backend, s.compiled_optimizer)
    batch = make_batch(s.config, size, seq, masked)
    for name, build in (("ours", ours_trainer), ("peer", peer_trainer)):
        result = measured(s.device, time_trainer, build, options, run, batch)
        row.update({f"{name}_{key}": value for key, value in result.items()})
        if "step_seconds" in result:
            row[f"{name}_seq_per_s"] = size / result["step_seconds"]
            if precision in run.peaks:
                flops = training_flops(s.config, size, seq, masked)
                row[f"{name}_of_peak"] = flops / result["step_seconds"] / (run.peaks[precision] * 1e9)
    if "ours_seq_per_s" in row and "peer_seq_per_s" in row:
        row["speedup"] = row["ours_seq_per_s"] / row["peer_seq_per_s"]
    row["goals"] = model_goals(row, run)
    return row


def model_section(run: Run) -> None:
    for seq, precision in itertools.product(run.settings.seqs, run.settings.amp):
        skip = run.deadline.lacks(NEEDS_SECONDS["model_step"])
        run.add("model_step", skipped_model_row(run, seq, precision, skip) if skip
                else model_row(run, seq, precision, compiled=False))


def skipped_model_row(run: Run, seq: int, precision: str, why: str) -> dict[str, Any]:
    row: dict[str, Any] = {"seq": seq, "precision": precision, "error": why}
    return {**row, "goals": model_goals(row, run)}


def compiled_section(run: Run) -> None:
    precision = run.settings.amp[0]
    for seq in run.settings.compile_seqs:
        skip = run.deadline.lacks(NEEDS_SECONDS["compiled_step"])
        run.add("compiled_step", skipped_model_row(run, seq, precision, skip) if skip
                else model_row(run, seq, precision, compiled=True))


# --- max_micro_batch --------------------------------------------------------------------------------------------

def largest_fitting(fits: Callable[[int], bool], start: int, cap: int) -> tuple[int, str]:
    """The largest size for which fits() holds, up to `cap`: doubling from `start` until a size fails, then
    bisection between the last that fit and the first that did not. (size, why the search stopped); size 0
    when not even 1 fits."""
    good, size = 0, start
    while size <= cap and fits(size):
        good, size = size, size * 2
    if size > cap:
        return good, f"reached the cap of {cap}"
    bad = size
    while bad - good > 1:
        middle = (good + bad) // 2
        if fits(middle):
            good = middle
        else:
            bad = middle
    return good, f"{bad} does not fit"


def fits_in_memory(trainer: Trainer, run: Run, seq: int, size: int) -> bool:
    """Two steps (the second with the optimizer's state allocated) on a micro-batch of `size`, or out of memory;
    after one, the gradients and cached blocks are freed outside the except block (the traceback holds them)."""
    s = run.settings
    try:
        batch = to_device(make_batch(s.config, size, seq, masked_per_seq(seq)), s.device)
        for _ in range(2):
            trainer.step(batch)
        return True
    except RuntimeError as error:  # torch.cuda.OutOfMemoryError, or a library's "CUDA error: out of memory"
        if "out of memory" not in str(error):
            raise
    trainer.optimizer.zero_grad(set_to_none=True)
    free_memory(s.device)
    return False


def search_batch(build: Callable[..., Trainer], run: Run, seq: int) -> dict[str, Any]:
    s = run.settings
    trainer = build(s.config, StepOptions(s.device, s.amp[0], compiled_optimizer=s.compiled_optimizer))
    tries: list[list[Any]] = []

    def fits(size: int) -> bool:
        tries.append([size, fits_in_memory(trainer, run, seq, size)])
        return tries[-1][1]

    largest, why = largest_fitting(fits, s.search_start, s.search_cap)
    return {"largest_micro_batch": largest, "stopped_by": why, "tries": tries}


def max_batch_section(run: Run) -> None:
    seq = max(run.settings.seqs)
    row: dict[str, Any] = {"seq": seq, "precision": run.settings.amp[0]}
    for name, build in (("ours", ours_trainer), ("peer", peer_trainer)):
        skip = run.deadline.lacks(NEEDS_SECONDS["max_micro_batch"])
        result = {"error": skip} if skip else measured(run.settings.device, search_batch, build, run, seq)
        row.update({f"{name}_{key}": value for key, value in result.items()})
    if row.get("peer_largest_micro_batch") and "ours_largest_micro_batch" in row:  # no ratio of a failed search
        row["ratio"] = row["ours_largest_micro_batch"] / row["peer_largest_micro_batch"]
    run.add("max_micro_batch", row)


# --- loop -------------------------------------------------------------------------------------------------------

def shard_folder(run: Run, seq: int) -> Path:
    """Shards of the embedded default corpus at `seq` (made once), its articles joined into documents of about
    20 KB so that sequences fill up as on Wikipedia."""
    if seq not in run.shards:
        articles = default_corpus_documents(run.settings.corpus_chars)
        documents, current = [], ""
        for article in articles:
            current = f"{current} {article}".strip()
            if len(current) >= 20_000:
                documents.append(current)
                current = ""
        documents += [current] if current else []
        run.shards[seq] = shards_of_documents(documents, VOCAB_EXCERPT, seq, run.work, timeout=300)
    return run.shards[seq]


def shard_step(run: Run, folder: Path, seq: int) -> dict[str, Any]:
    """Our model step alone (no loader, no logging) on the loop's first batches, timed as the loop times itself:
    all its steps but the first two, sequences over their summed time."""
    # Imported in the rows that use them (here, loop_row, finetune_row): a module that fails to import on the GPU
    # host fails those rows, each with its error line, not the whole report.
    from benchmarks.pretrain_throughput import first_shard_batches

    s = run.settings
    batches = [to_device(b, s.device) for b in first_shard_batches(folder, s.batch[seq], s.loop_steps)]
    trainer = ours_trainer(s.config, StepOptions(s.device, s.amp[0], compiled_optimizer=s.compiled_optimizer))
    for batch in batches[:2]:
        trainer.step(batch)
    tick = time.perf_counter()
    for batch in batches[2:]:
        trainer.step(batch)
    return {"model_step_seq_per_s": s.batch[seq] * len(batches[2:]) / (time.perf_counter() - tick)}


def loop_config_file(run: Run) -> Path:
    if not run.settings.tiny:
        return REPO / "bert_configs" / "large.json"
    path = run.work / "bert_config.json"
    run.settings.config.to_json_file(path)
    return path


def loop_row(run: Run, seq: int) -> dict[str, Any]:
    from benchmarks.pretrain_throughput import LoopOptions, run_loop

    s = run.settings
    row: dict[str, Any] = {"seq": seq, "batch": s.batch[seq], "precision": s.amp[0], "steps": s.loop_steps}
    folder = shard_folder(run, seq)
    row["real_token_fraction"] = real_token_fraction(folder)
    row.update(measured(s.device, shard_step, run, folder, seq))
    row["model_step_error"] = row.pop("error", None)
    options = LoopOptions(loop_config_file(run), s.device, s.amp[0], s.compiled_optimizer)
    timeout = max(min(run.deadline.left(), 400), 60)
    row.update(measured(s.device, lambda: {"loop_seq_per_s": run_loop(folder, seq, s.batch[seq], s.loop_steps,
                                                                      run.work, options, timeout)}))
    row["loop_error"] = row.pop("error", None)
    if "loop_seq_per_s" in row and "model_step_seq_per_s" in row:
        row["loop_over_model_step"] = row["loop_seq_per_s"] / row["model_step_seq_per_s"]
    return {key: value for key, value in row.items() if value is not None}


def loop_goals(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The loop's goal, met, missed or (a loop or model step that failed or was skipped) not measured."""
    unmeasured = [part for part in ("loop", "model_step") if f"{part}_seq_per_s" not in row]
    return [goal("the loop within 5 % of the model step", row.get("loop_over_model_step"), 0.95,
                 why_absent(row, unmeasured))]


def loop_section(run: Run) -> None:
    for seq in run.settings.seqs:
        skip = run.deadline.lacks(NEEDS_SECONDS["loop"])
        row = {"seq": seq, "error": skip} if skip else {"seq": seq, **measured(run.settings.device, loop_row, run, seq)}
        run.add("loop", {**row, "goals": loop_goals(row)})


# --- finetune ---------------------------------------------------------------------------------------------------

def finetune_row(run: Run, phase: str) -> dict[str, Any]:
    from benchmarks.finetune_throughput import build_steps, make_batches, sequences_per_second

    s = run.settings
    precision = s.amp[0]
    batches = [to_device(b, s.device) for b in make_batches("full", None, s.config.vocab_size, s.finetune_batch,
                                                              s.finetune_seq, s.finetune_steps)]
    steps = build_steps(s.config, phase, compiled=False, device=s.device)
    rates = sequences_per_second(steps, batches, precision, s.warmup, 3 if not s.tiny else 1, s.device)
    row = {"ours_seq_per_s": rates["ours"], "peer_seq_per_s": rates["peer"], "speedup": rates["ours"] / rates["peer"]}
    if phase == "inference" and precision in run.peaks:  # full windows: both do forward_flops' GEMMs
        per_seq = forward_flops(s.config, 1, s.finetune_seq)
        for name in ("ours", "peer"):
            row[f"{name}_of_peak"] = per_seq * rates[name] / (run.peaks[precision] * 1e9)
    return row


def finetune_section(run: Run) -> None:
    s = run.settings
    for phase in ("training", "inference"):
        row = {"phase": phase, "seq": s.finetune_seq, "batch": s.finetune_batch, "precision": s.amp[0]}
        skip = run.deadline.lacks(NEEDS_SECONDS["finetune"])
        run.add("finetune", {**row, "error": skip} if skip else {**row, **measured(s.device, finetune_row, run, phase)})


# --- profile ----------------------------------------------------------------------------------------------------

def device_microseconds(event: Any, cuda: bool) -> float:
    if not cuda:
        return event.self_cpu_time_total
    # device_time_total since torch 2.4, cuda_time_total before
    return getattr(event, "self_device_time_total", None) or getattr(event, "device_time_total", 0.0)


def top_kernels(run: Run, seq: int, count: int = 15) -> dict[str, Any]:
    """The `count` kernels (on a CPU: operators, by self time) that take most of 2 profiled steps of ours."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    s = run.settings
    cuda = is_cuda(s.device)
    trainer = ours_trainer(s.config, StepOptions(s.device, s.amp[0], compiled_optimizer=s.compiled_optimizer))
    batch = to_device(make_batch(s.config, s.batch[seq], seq, masked_per_seq(seq)), s.device)
    trainer.step(batch)
    with profile(activities=[ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]) as prof:
        for _ in range(2):
            trainer.step(batch)
    events = [e for e in prof.key_averages() if not cuda or e.device_type == DeviceType.CUDA]
    timed = sorted(((device_microseconds(e, cuda), e) for e in events), key=lambda pair: -pair[0])
    total = sum(us for us, _ in timed) or 1.0
    return {"what": "CUDA kernels" if cuda else "CPU operators (self time)", "total_ms_per_step": total / 2e3,
            "top": [{"name": e.key[:160], "calls_per_step": e.count / 2, "ms_per_step": us / 2e3,
                     "share": us / total} for us, e in timed[:count]]}


def profile_section(run: Run) -> None:
    for seq in run.settings.seqs:
        skip = run.deadline.lacks(NEEDS_SECONDS["profile"])
        row = {"seq": seq, "batch": run.settings.batch[seq], "precision": run.settings.amp[0]}
        run.add("profile", {**row, "error": skip} if skip else {**row, **measured(run.settings.device, top_kernels,
                                                                                   run, seq)})


# --- sharding ---------------------------------------------------------------------------------------------------

def sharding_section(run: Run) -> None:
    """DDP and FSDP (--sharding fsdp) side by side on every GPU (--tiny: 2 CPU processes): each process's
    parameters, gradients and LAMB state, its peak allocated memory and the step time (benchmarks.fsdp_memory, the
    loop's model in fp32). One GPU shards nothing: its FSDP row is what FSDP's machinery costs."""
    s = run.settings
    skip = run.deadline.lacks(NEEDS_SECONDS["sharding"])
    if skip:
        run.add("sharding", {"error": skip})
        return
    cuda = is_cuda(s.device)
    processes = torch.cuda.device_count() if cuda else 2
    seq = s.seqs[0]
    batch = min(s.batch[seq], 32)  # fp32 (the state's bytes are the point), so fewer rows than the bf16 steps
    out = run.work / "sharding.json"
    command = benchmark_command("fsdp_memory", "--device", "cuda" if cuda else "cpu", "--layouts",
                                f"ddp:{processes}", f"fsdp:{processes}", "--config", str(loop_config_file(run)),
                                "--batch", str(batch), "--seq", str(seq), "--steps", "3", "--output", str(out))
    status, output = run_group(command, max(min(run.deadline.left(), 300), 60))
    if status != 0:
        lines = [line for line in output.splitlines() if line.strip()] or ["no output"]
        ended = "was cut off" if status is None else f"exited with {status}"
        raise RuntimeError(f"benchmarks.fsdp_memory {ended}: {lines[-1]}")
    for row in json.loads(out.read_text())["layouts"]:
        run.add("sharding", {key: value for key, value in row.items() if key != "ranks"} | {"batch": batch, "seq": seq})


# --- data_prep --------------------------------------------------------------------------------------------------

def data_prep_section(run: Run) -> None:
    s = run.settings
    skip = run.deadline.lacks(NEEDS_SECONDS["data_prep"])
    if skip:
        run.add("data_prep", {"error": skip})
        return
    out = run.work / "data_prep.json"
    command = benchmark_command("data_prep_scale", "--size_gb", str(s.data_prep_gb), "--n_processes",
                                *map(str, s.data_prep_processes), "--vocab_file", str(VOCAB_EXCERPT), "--no_books",
                                "--ceiling_rounds", "0", "--json", str(out), "--tmp", str(run.work))
    if s.tiny:
        command += ["--n_training_shards", "4", "--n_test_shards", "1", "--reference_mb", "0.2"]
    else:
        command += ["--n_training_shards", "256", "--n_test_shards", "16", "--reference_mb", "8"]
    status, output = run_group(command, max(run.deadline.left(), 60))
    if status != 0:
        lines = [line for line in output.splitlines() if line.strip()] or ["no output"]
        ended = "was cut off" if status is None else f"exited with {status}"
        raise RuntimeError(f"benchmarks.data_prep_scale {ended}: {lines[-1]}")
    for size in json.loads(out.read_text()):
        for stage in size["stages"]:
            run.add("data_prep", {"size_gb": size["size_gb"], "stage": stage["name"],
                                  "processes": stage["processes"], "seconds": stage["seconds"],
                                  "mb_per_s_per_process": size["text_mb"] / stage["seconds"] / stage["processes"],
                                  "tree_rss_mb": stage["tree_rss_mb"]})


RUNNERS: dict[str, Callable[[Run], None]] = {
    "cuda_tests": cuda_tests, "gemm_peak": gemm_section, "model_step": model_section,
    "max_micro_batch": max_batch_section, "loop": loop_section, "finetune": finetune_section,
    "sharding": sharding_section, "profile": profile_section, "compiled_step": compiled_section,
    "data_prep": data_prep_section}


# --- the run ----------------------------------------------------------------------------------------------------

def driver_version() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"unknown ({error_line(error)})"
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else "unknown"


def header(settings: Settings, argv: list[str]) -> dict[str, Any]:
    cuda = is_cuda(settings.device)
    try:
        transformers = metadata.version("transformers")
    except metadata.PackageNotFoundError:
        transformers = "not installed"
    return {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "command": " ".join(["benchmarks/gpu_report.sh", *argv]), "tiny": settings.tiny,
            "device": detect("cuda" if cuda else "cpu").device, "device_type": settings.device,
            "driver": driver_version() if cuda else "n/a (CPU)", "cuda": torch.version.cuda, "torch": torch.__version__,
            "transformers": transformers, "python": sys.version.split()[0], "cpus": os.cpu_count(),
            "model": settings.config_name, "precisions": {"model_step": settings.amp, "gemm_peak":
                                                          settings.gemm_precisions, "others": settings.amp[0]},
            "batch": settings.batch, "time_budget_s": settings.time_budget,
            "lamb": "update fused by torch.compile" if settings.compiled_optimizer else "multi-tensor (foreach) update"}


def argument_parser() -> argparse.ArgumentParser:
    """The report's flags; gpu_report.sh names the same ones (REPORT_FLAGS there), to refuse any other before it
    installs wheels or the report makes a folder."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tiny", action="store_true", help="a tiny BERT, tiny batches, 1-2 steps: the CI's check")
    p.add_argument("--output_dir", type=Path, help="default: benchmarks/results/gpu_report/<date>")
    p.add_argument("--device", help="default: cuda where there is one, else cpu (--tiny only)")
    p.add_argument("--profile", action="store_true", help="torch.profiler's top 15 kernels of our step, per length")
    p.add_argument("--data_prep", action="store_true", help="also data_prep_scale.py at 1, 2, 4, 8, 16 processes")
    p.add_argument("--sections", nargs="+", choices=SECTIONS, help="only these (default: all, the optional ones "
                   "when asked for)")
    p.add_argument("--time_budget", type=float, default=420.0,
                   help="seconds; a row that would end past it is skipped with the reason (0: none)")
    p.add_argument("--batch_128", type=int, default=128, help="micro-batch at seq 128 (GPU run)")
    p.add_argument("--batch_512", type=int, default=32, help="micro-batch at seq 512 (GPU run)")
    return p


def parse_args(argv: list[str]) -> argparse.Namespace:
    args = argument_parser().parse_args(argv)
    args.time_budget = args.time_budget or None
    return args


def make_settings(args: argparse.Namespace) -> Settings:
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if not args.tiny and not is_cuda(device):
        raise SystemExit("error: the GPU report needs a CUDA device (none here); --tiny runs its logic on the CPU")
    sections = args.sections or [name for name in SECTIONS
                                 if name not in OPTIONAL or getattr(args, name)]
    return (tiny_settings if args.tiny else gpu_settings)(args, device, sections)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    settings = make_settings(args)
    day = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
    folder = args.output_dir or REPO / "benchmarks" / "results" / "gpu_report" / day
    report = Report(folder, header(settings, argv))
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="gpu_report_") as work:
        run = Run(settings, report, Deadline(settings.time_budget), Path(work))
        for name in SECTIONS:
            if name not in settings.sections:
                flag = OPTIONAL.get(name)
                report.open(name, skipped=f"not requested ({flag})" if flag else "not in --sections")
                continue
            report.open(name)
            print(f"{name} ({run.deadline.left():.0f} s of the budget left)", flush=True)
            tick = time.perf_counter()
            try:
                RUNNERS[name](run)
            except Exception as error:  # the section's own failure (an import, the shards): the next one goes on
                report.fail(name, error_line(error))
            report.data["sections"][name]["seconds"] = time.perf_counter() - tick
            report.save()
    print(f"wrote {report.json_path} and {report.markdown_path}")
    print(report.markdown_path.read_text())


if __name__ == "__main__":
    main()
