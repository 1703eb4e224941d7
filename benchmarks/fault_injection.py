"""Fault injection (issue 32, item 8): a 2-process pre-training run (torchrun, gloo on the CPU, a tiny BERT on
random shards) killed at random moments and restarted with --resume_from_checkpoint until it finishes must end with
the same checkpoint, bit for bit, as the same run left alone.

The faults: SIGKILL, SIGTERM or SIGINT; sent to the whole job (every process of the launch, as Slurm's scancel and
its kill at the end of a time limit do) or, for SIGTERM and SIGINT, to torchrun's process group only (Ctrl-C in a
terminal, `kill <pid>` of the launcher; torchrun passes the signal on to its workers, which run in their own
sessions). SIGKILL always goes to the whole job: torchrun SIGKILLed alone leaves its workers running on (torch's
elastic agent starts each in its own session and nothing ends them when it dies; the next launch is then refused
by the run lock they hold). A restart comes once every process of the killed launch has ended, as a
scheduler's requeue does (wait_reaped: ended, zombies included). The moments:
- startup: a random time within the reference launch's start-up (imports, rendezvous, the run lock, reading the
  checkpoint, removing stale temporaries; a late one lands in the first steps, but never after the planned step);
- step: a random time within a step after the record of a planned step;
- checkpoint: as soon as a checkpoint's temporary (`.ckpt_N.pt.<pid>.<random>.tmp`; under --sharding fsdp the
  folder `.ckpt_N.dcp.<pid>.<random>.tmp` that every process writes its shards into) appears in the output folder
  at or after a planned step, i.e. while the checkpoint is being written.
Where a fault landed is read when it is sent: "in a checkpoint write" when a temporary of the launch was there
(a signal sent to torchrun reaches the workers a few milliseconds later, passed on by torchrun; a SIGKILL that
leaves the temporary behind is the proof), "during the steps" when the launch had logged a step, else "before
the first step".
The planned steps are spread over the run, so faults land from before the first checkpoint to the final one (one
more fault, besides the --faults asked for, aims at the write of the final checkpoint). The schedule comes from a
random.Random(--seed): a failing schedule is replayed with the same seed.

A full disk (--disk_faults N, fault kind DISKFULL): the faulted run's output folder is then a tmpfs mounted for
the campaign (Settings.disk_megabytes; needs root, refused in one line otherwise) and, at the checkpoint moment, a
filler file takes all its free space, so that the rest of the write fails with ENOSPC (or, when the write was
quicker than the filler, the next write: the log or the next checkpoint). The run must end by itself: one
`error:` line per process naming the file, or the other process, and the checkpoint to resume from (`the newest
good checkpoint is ...` or `no checkpoint in ... yet`), a non-zero exit status (torchrun's 1, run_pretraining.py's
2), no worker traceback, no temporary left, every checkpoint loading. The filler is then removed, as an operator
would free space, and the run restarted. The DISKFULL faults take their places in the schedule among the signals.

Both model families: --family bert (the tiny BERT, NSP, LAMB) or --family modern (a tiny ModernBERT config.json on
the same shards: the masked LM alone, AdamW).

Checked: the final checkpoint (and every other checkpoint both runs kept) equals the reference's in every tensor
and number (model, LAMB state, scheduler, RNG of every rank, data position; only the wall-clock `train_seconds`
and the output paths in `args` differ); every step record logged by any launch (a step redone after a SIGKILL is
logged twice) has the reference's loss and learning rate; after every launch each ckpt_*.pt in the folder loads,
no process of the launch is left, a SIGKILL leaves torchrun's status -9 and a SIGTERM during training the
workers' line "stopped by SIGTERM at step N" with ckpt_N written; no restart is refused; no temporary file is left
at the end.

    python -m benchmarks.fault_injection                          # 25 faults, seed 0: about 3 minutes on 2 cores
    python -m benchmarks.fault_injection --faults 40 --seed 7 --output_dir /tmp/fi --json /tmp/fi/faults.json
    python -m benchmarks.fault_injection --nproc 1                # run_pretraining.py without torchrun: its own
                                                                  # exit statuses (143, 130, -9) are checked
    python -m benchmarks.fault_injection --family modern --disk_faults 5   # ModernBERT, 25 signals, 5 full disks

Exit status 0 when the run is bit for bit the reference and no check failed, 1 otherwise; 2 and one line for a
flag refused, or --disk_faults where no tmpfs can be mounted.
"""
from __future__ import annotations

import argparse
import errno
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import h5py
import numpy as np
import torch

from benchmarks.common import REPO, write_json
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.atomic_files import make_dirs, remove_empty_dirs
from bertrecipe.common.errors import InputError
from bertrecipe.common.hardware import detect, host_line
from bertrecipe.model import sharded_checkpoint
from bertrecipe.training.run_lock import process_start
from bertrecipe.training.sharding import SHARDING

VOCAB, SEQ, PREDS, ROWS = 128, 16, 3, 64
CONFIG = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
          "intermediate_size": 64, "max_position_embeddings": 32, "type_vocab_size": 2, "hidden_act": "gelu",
          "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}
# The modern family (docs/modern-encoders.md) at the same scale: it reads the same shards, segments ignored.
MODERN_CONFIG = {"model_type": "modernbert", "vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2,
                 "num_attention_heads": 4, "intermediate_size": 48, "max_position_embeddings": 64,
                 "local_attention": 8, "pad_token_id": 0}
FAMILIES = {"bert": (CONFIG, "lamb"), "modern": (MODERN_CONFIG, "adamw")}  # config.json, --optimizer
FAMILY_NAMES = {"bert": "BERT config, masked LM + NSP", "modern": "ModernBERT config, masked LM alone"}
SIGNALS = {"SIGKILL": signal.SIGKILL, "SIGTERM": signal.SIGTERM, "SIGINT": signal.SIGINT}
DISK_FULL = "DISKFULL"  # the fourth fault kind: not a signal, the output folder's disk filled
KINDS = [*SIGNALS, DISK_FULL]
FILLER = ".fault_injection_filler"  # the file that takes a full disk's space, in the output folder's tmpfs
MOMENTS = {"startup": 0.2, "step": 0.4, "checkpoint": 0.4}  # how often each is drawn
MARKER = "FAULT_INJECTION_JOB"  # in every process of a launch's environment: finds them all, orphans included
# A checkpoint is a file, or under --sharding fsdp a folder that every process writes its shards into.
TEMPORARY = re.compile(r"^\.ckpt_(\d+)\.(?:pt|dcp)\..*\.tmp$")
CHECKPOINT = re.compile(r"^ckpt_(\d+)\.(?:pt|dcp)$")
IGNORED = {"train_seconds", "args.output_dir", "args.json_summary"}  # wall clock and paths: differ by nature
LINES = {"stopped_by_sigterm": re.compile(r"stopped by SIGTERM at step (\d+)"),
         "ctrl_c": re.compile(r"interrupted \(Ctrl-C\): (.*)"),
         "lock_taken_over": re.compile(r"took over the lock"),
         "stale_removed": re.compile(r"removed (\S+), left by a killed write"),
         "nothing_left": re.compile(r"nothing left to train"),
         "error": re.compile(r"^error: (.*)$", re.MULTILINE)}
RESUME_HINT = re.compile(r"the newest good checkpoint is \S+|no checkpoint in \S+ yet")


LAUNCH_NICENESS = 10  # see start()


@dataclass
class Settings:
    """The run every launch repeats; its flags are run_pretraining.py's (NVIDIA's)."""

    max_steps: int = 40
    checkpoint_every: int = 2
    nproc: int = 2
    batch: int = 4  # --train_batch_size, per process
    accumulation: int = 2
    train_seed: int = 42
    family: str = "bert"  # a key of FAMILIES
    sharding: str = "ddp"  # run_pretraining.py's --sharding
    disk_megabytes: int = 8  # the tmpfs of the faulted run's output folder (with disk faults): ~20 checkpoints
    launch_timeout: float = 240.0  # a launch that neither reaches its moment nor ends in this time hangs
    exit_timeout: float = 90.0  # from the signal to the launcher's exit (torchrun waits 30 s, then SIGKILLs)


@dataclass
class Fault:
    signal: str  # a key of SIGNALS, or DISK_FULL
    target: str  # "job" (every process of the launch), "launcher" (torchrun's process group) or "disk"
    moment: str  # "startup", "step" or "checkpoint"
    step: int  # step and checkpoint: the step whose record (or checkpoint write, at or after it) is waited for
    delay: float  # startup: seconds after the launch (at the latest the step's record); step: after the record
    final: bool = False  # the extra fault at the final checkpoint's write


@dataclass
class Launch:
    index: int
    resumed_from: int  # the newest checkpoint's step at the launch (0: a fresh start)
    fault: Optional[Fault]
    started: float = 0.0  # time.time() at the launch
    fired: bool = False
    seconds_to_signal: float = 0.0
    step_seen: int = 0  # the newest step this launch logged before the signal (or before its end)
    in_write: bool = False  # a checkpoint temporary of this launch existed when the signal went
    write_at_fill: Optional[int] = None  # DISKFULL: the step of the checkpoint being written when the disk filled
    full_disk_file: str = ""  # DISKFULL: the file the run said it could not write (its name)
    temporaries_left: list[str] = field(default_factory=list)  # a write cut short (SIGKILL), seen after the exit
    exit_code: Optional[int] = None  # the launcher's: torchrun's, or run_pretraining.py's with --nproc 1
    seconds_to_exit: float = 0.0
    newest_after: int = 0
    lines: dict[str, Any] = field(default_factory=dict)
    leftovers: int = 0  # processes of the launch still alive once the launcher had ended (then killed)
    seconds_to_reaped: float = 0.0  # from the launcher's exit until every process of the launch had ended
    problems: list[str] = field(default_factory=list)

    @property
    def landed(self) -> str:
        """Where the signal found the run: in a checkpoint write (its temporary was there), during the steps (this
        launch had logged a step), or before the first step (startup)."""
        if self.in_write:
            return "in a checkpoint write"
        return "during the steps" if self.step_seen > self.resumed_from else "before the first step"

    @property
    def full_disk_failed_at(self) -> str:
        """DISKFULL: the write that failed, read from the file the run named: the checkpoint being written when
        the disk filled, a later one, the log or the TensorBoard events ("none": the run had ended first)."""
        name = self.full_disk_file
        match = CHECKPOINT.match(name)
        if match:
            return "the write it filled" if int(match.group(1)) == self.write_at_fill else "the next checkpoint"
        if name.startswith("events.out.tfevents"):
            return "the TensorBoard events"
        return name or "none"


@dataclass
class Campaign:
    seed: int
    faults_asked: int
    settings: Settings
    launches: list[Launch]
    reference_seconds: float
    seconds: float
    compared: list[str]  # checkpoints compared with the reference
    differences: list[str]  # "<checkpoint>: <key>" that differ
    records_checked: int  # step records of all launches compared with the reference's
    record_mismatches: list[str]
    unreadable_log_lines: int  # lines of the faulted run's log cut by a SIGKILL
    temporaries_at_end: list[str]
    problems: list[str]
    disk_faults_asked: int = 0

    @property
    def faults(self) -> list[Launch]:
        return [launch for launch in self.launches if launch.fired]

    @property
    def bit_exact(self) -> bool:
        return bool(self.compared) and not self.differences and not self.record_mismatches

    @property
    def ok(self) -> bool:
        return self.bit_exact and not self.problems and not any(launch.problems for launch in self.launches)


# --- The workspace and the command ---------------------------------------------------------------------------
def make_workspace(root: Path, family: str = "bert") -> Path:
    """Two random shards (as create_pretraining_data writes them: ids in the vocab, two segments, positions 1..3
    masked) and the family's tiny config, under root/inputs."""
    inputs = root / "inputs"
    (inputs / "data").mkdir(parents=True, exist_ok=True)
    for shard in range(2):
        rng = np.random.default_rng(shard)
        segments = np.zeros((ROWS, SEQ), np.int8)
        segments[:, SEQ // 2:] = 1
        arrays = {"input_ids": rng.integers(5, VOCAB, (ROWS, SEQ)).astype(np.int32),
                  "input_mask": np.ones((ROWS, SEQ), np.int8), "segment_ids": segments,
                  "masked_lm_positions": np.tile(np.arange(1, PREDS + 1, dtype=np.int32), (ROWS, 1)),
                  "masked_lm_ids": rng.integers(5, VOCAB, (ROWS, PREDS)).astype(np.int32),
                  "next_sentence_labels": rng.integers(0, 2, ROWS).astype(np.int8)}
        with h5py.File(inputs / "data" / f"tiny_training_{shard}.hdf5", "w") as f:
            for key, value in arrays.items():
                f.create_dataset(key, data=value)
    (inputs / "bert_config.json").write_text(json.dumps(FAMILIES[family][0]))
    return inputs


def command(inputs: Path, out: Path, settings: Settings) -> list[str]:
    """The launch, the same every time: NVIDIA's scripts pass --resume_from_checkpoint to a first run as well."""
    script = str(REPO / "run_pretraining.py")
    flags = ["--input_dir", str(inputs / "data"), "--config_file", str(inputs / "bert_config.json"),
             "--output_dir", str(out), "--json-summary", str(out / "log.json"), "--max_seq_length", str(SEQ),
             "--max_predictions_per_seq", str(PREDS), "--train_batch_size", str(settings.batch),
             "--gradient_accumulation_steps", str(settings.accumulation), "--learning_rate", "1e-3",
             "--max_steps", str(settings.max_steps), "--num_steps_per_checkpoint", str(settings.checkpoint_every),
             "--seed", str(settings.train_seed), "--do_train", "--resume_from_checkpoint", "--disable_progress_bar",
             "--optimizer", FAMILIES[settings.family][1], "--sharding", settings.sharding]
    if settings.nproc == 1:
        return [sys.executable, script, *flags]
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(settings.nproc),
            script, *flags]


def start(cmd: list[str], log_path: Path, token: str) -> subprocess.Popen:
    """A launch in its own session (signals can go to its process group), output to log_path, every process
    marked with the token in its environment."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", MARKER: token}
    with open(log_path, "wb") as log:
        # The launch runs below the campaign's priority: on a busy machine the 1 ms watch for a checkpoint's
        # temporary file still gets the CPU first, so that a write of a few milliseconds is not missed.
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=log_path.parent,
                                start_new_session=True, preexec_fn=lambda: os.nice(LAUNCH_NICENESS))


# --- Processes ---------------------------------------------------------------------------------------------------
def job_processes(token: str) -> dict[int, str]:
    """Every live process whose environment holds the launch's token (torchrun, its workers in their own
    sessions, any orphan of theirs), with its start time. A zombie's environment reads empty: it is not found
    here, see wait_reaped."""
    needle = f"{MARKER}={token}".encode() + b"\0"
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle not in f.read():
                    continue
        except OSError:  # gone, or not ours
            continue
        started = process_start(int(entry))
        if started:
            found[int(entry)] = started
    return found


def send(launcher: subprocess.Popen, token: str, fault: Fault, seen: dict[int, str]) -> None:
    """The fault's signal to torchrun's process group, or to every process of the job: first those already known
    (`seen`, refreshed while waiting, so the signal is not late), then any found since (SIGKILL: again until none
    is left, for a worker forked meanwhile)."""
    number = SIGNALS[fault.signal]
    if fault.target == "launcher":
        try:
            os.killpg(launcher.pid, number)
        except ProcessLookupError:
            pass
        seen.update(job_processes(token))
        return
    signalled: set[int] = set()
    for _ in range(50):
        pids = [pid for pid, started in seen.items() if pid not in signalled and process_start(pid) == started]
        for pid in pids:
            try:
                os.kill(pid, number)
            except ProcessLookupError:
                pass
        signalled.update(pids)
        found = job_processes(token)
        seen.update(found)
        unsignalled = set(found) - signalled
        if not unsignalled and (number != signal.SIGKILL or not found):
            return
        if not unsignalled:
            time.sleep(0.02)  # SIGKILLed, not yet gone


def kill_job(token: str, seen: Optional[dict[int, str]] = None) -> int:
    """SIGKILLs what is left of a launch; how many processes were."""
    left = job_processes(token)
    if seen is not None:
        seen.update(left)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return len(left)


def wait_reaped(seen: dict[int, str], timeout: float = 30.0) -> Optional[float]:
    """Seconds until every process of the job has ended (its /proc entry gone, the pid reused, or a zombie not
    yet reaped: run_lock.process_start reads each as ended, and so does the run lock), None after `timeout`. A
    SIGKILLed process is still running for a few milliseconds before it becomes a zombie; the restart comes, as a
    scheduler's does, once the killed job has ended."""
    began = time.monotonic()
    while any(process_start(pid) == started for pid, started in seen.items()):
        if time.monotonic() - began > timeout:
            return None
        time.sleep(0.02)
    return time.monotonic() - began


# --- The output folder -------------------------------------------------------------------------------------------
def checkpoints(out: Path) -> dict[int, Path]:
    found = {}
    if out.is_dir():
        for path in out.iterdir():
            match = CHECKPOINT.match(path.name)
            if match:
                found[int(match.group(1))] = path
    return found


def temporaries(out: Path) -> set[str]:
    try:
        return {name for name in os.listdir(out) if TEMPORARY.match(name)}
    except FileNotFoundError:
        return set()


class LogTail:
    """The step records a launch appends to the dllogger log, read as they come."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.exists() else 0
        self.partial = b""
        self.newest = 0

    def poll(self) -> int:
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return self.newest
        if size <= self.offset:
            return self.newest
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            chunk = f.read(size - self.offset)
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        for line in lines:
            record = parse_record(line.decode("utf-8", "replace"))
            if record is not None and step_of(record) is not None:
                self.newest = max(self.newest, step_of(record))
        return self.newest


def parse_record(line: str) -> Optional[dict[str, Any]]:
    if not line.startswith("DLLL "):
        return None
    try:
        return json.loads(line[5:])
    except json.JSONDecodeError:
        return None


def step_of(record: dict[str, Any]) -> Optional[int]:
    step = record.get("step")
    if record.get("type") == "LOG" and isinstance(step, list) and len(step) == 2 and "step_loss" in record["data"]:
        return int(step[1])
    return None


def step_records(path: Path) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """Every step record of the log in order (a step redone after a fault appears again) and the count of lines
    that do not parse (cut by a SIGKILL mid-write)."""
    records, unreadable = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        if not line.strip():
            continue
        record = parse_record(line)
        if record is None:
            unreadable += 1
        elif step_of(record) is not None:
            records.append((step_of(record), record))
    return records, unreadable


# --- A full disk -------------------------------------------------------------------------------------------------
class NoTmpfs(InputError):
    """--disk_faults where a tmpfs cannot be mounted (not root): refused before anything runs."""


def mount_tmpfs(folder: Path, megabytes: int) -> None:
    """A real tmpfs of `megabytes` mounted at folder, whose disk a DISKFULL fault fills; refused (NoTmpfs) where
    it cannot be, leaving no folder it made."""
    created = make_dirs(folder)
    try:
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(folder)],
                                 capture_output=True, text=True)
        why = " ".join(mounted.stderr.split()) or f"mount exited with {mounted.returncode}"
    except FileNotFoundError:
        mounted, why = None, "no mount command"
    if mounted is None or mounted.returncode:
        remove_empty_dirs(created)
        raise NoTmpfs(f"--disk_faults: cannot mount a tmpfs at {folder} ({why}); run as root (a container needs "
                      "CAP_SYS_ADMIN), or pass --disk_faults 0")


def unmount_keeping_files(folder: Path) -> None:
    """Unmounts the tmpfs at folder and puts its files into the folder beneath, so that a work folder stays
    inspectable after the campaign, as it is without disk faults."""
    with tempfile.TemporaryDirectory(dir=folder.parent) as scratch:
        kept = Path(scratch) / folder.name
        shutil.copytree(folder, kept, symlinks=True)
        subprocess.run(["umount", "-l", str(folder)], check=True, capture_output=True)
        shutil.copytree(kept, folder, symlinks=True, dirs_exist_ok=True)


def fill_disk(folder: Path) -> Path:
    """Creates folder/FILLER holding all the free space of folder's file system, so that the next block any
    writer needs fails with ENOSPC; the filler's path."""
    filler = folder / FILLER
    descriptor = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for _ in range(20):  # a writer takes blocks meanwhile, and fallocate of more than is free fails whole
            stats = os.statvfs(folder)
            free = stats.f_bavail * stats.f_frsize
            if free == 0:
                break
            try:
                os.posix_fallocate(descriptor, os.fstat(descriptor).st_size, free)
            except OSError as error:
                if error.errno != errno.ENOSPC:
                    raise
    finally:
        os.close(descriptor)
    return filler


# A frame of the recipe's own code: a worker's traceback (torchrun's ChildFailedError runs in torch alone).
WORKER_FRAME = re.compile(rf'File "{re.escape(str(REPO))}/(?:bertrecipe/|run_pretraining\.py)')


def worker_traceback(text: str) -> Optional[str]:
    """The exception line of the first traceback in a launch's output that passes through the recipe's code,
    None when there is none."""
    for block in text.split("Traceback (most recent call last):")[1:]:
        if WORKER_FRAME.search(block):
            unindented = [line for line in block.splitlines() if line.strip() and not line[0].isspace()]
            return unindented[0] if unindented else "(a traceback cut short)"
    return None


def full_disk_problems(exit_code: Optional[int], errors: list[str], nproc: int, finished: bool,
                       traceback: Optional[str]) -> list[str]:
    """What is wrong with how a launch whose disk filled ended: it must end by itself with a non-zero status
    (torchrun's 1, run_pretraining.py's 2), in one `error:` line per process (one of them naming what it
    could not write) that says where to resume, and without a worker's traceback. A run that had written its
    last file before the disk filled ends well (finished, no error)."""
    if finished and exit_code == 0 and not errors:
        return []
    problems = []
    expected = 1 if nproc > 1 else 2
    if exit_code != expected:
        problems.append(f"full disk: exit status {exit_code}, expected {expected}")
    if len(errors) != nproc:
        problems.append(f"full disk: {len(errors)} 'error:' lines, expected one per process ({nproc})")
    if not any("No space left on device" in line for line in errors):
        problems.append("full disk: no 'error:' line names a file with 'No space left on device'")
    problems += [f"full disk: a line without the checkpoint to resume from: {line}" for line in errors
                 if not RESUME_HINT.search(line)]
    if traceback is not None:
        problems.append(f"full disk: a traceback from a worker: {traceback}")
    return problems


# --- Comparison --------------------------------------------------------------------------------------------------
def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """The keys where two checkpoints differ: tensors by torch.equal (with dtype and shape), numbers exactly."""
    if path in IGNORED:
        return []
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        same = (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype
                and a.shape == b.shape and torch.equal(a, b))
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        found = [f"{path}.{k}".lstrip(".") for k in set(a) ^ set(b) if f"{path}.{k}".lstrip(".") not in IGNORED]
        for key in sorted(set(a) & set(b), key=str):
            found += differences(a[key], b[key], f"{path}.{key}".lstrip("."))
        return found
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return [path]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    return [] if type(a) is type(b) and a == b else [path]


def compare_checkpoints(reference: Path, faulted: Path) -> tuple[list[str], list[str]]:
    """(checkpoints compared, differences): the final one, and every other step both folders kept."""
    ours, theirs = checkpoints(reference), checkpoints(faulted)
    compared, found = [], []
    for step in sorted(set(ours) & set(theirs)):
        a, b = read_checkpoint(ours[step]), read_checkpoint(theirs[step])
        compared.append(ours[step].name)
        found += [f"{ours[step].name}: {key}" for key in differences(a, b)]
    return compared, found


def compare_records(reference: Path, faulted: Path) -> tuple[int, list[str], int]:
    """Every step record of every launch against the reference's record of that step: the same epoch, loss and
    learning rate, to the bit."""
    wanted = dict(step_records(reference)[0])
    records, unreadable = step_records(faulted)
    mismatches = []
    for step, record in records:
        expected = wanted.get(step)
        if expected is None:
            mismatches.append(f"step {step}: not in the reference's log")
            continue
        for key in ("step_loss", "learning_rate"):
            if record["data"][key] != expected["data"][key]:
                mismatches.append(f"step {step}: {key} {record['data'][key]!r} != {expected['data'][key]!r}")
        if record["step"][0] != expected["step"][0]:
            mismatches.append(f"step {step}: epoch {record['step'][0]} != {expected['step'][0]}")
    missing = sorted(set(wanted) - {step for step, _ in records})
    mismatches += [f"step {step}: never logged by the faulted run" for step in missing]
    return len(records), mismatches, unreadable


# --- The schedule ------------------------------------------------------------------------------------------------
def plan(rng: random.Random, faults: int, settings: Settings, startup_seconds: float,
         step_seconds: float, disk_faults: int = 0) -> list[Fault]:
    """`faults` signals and `disk_faults` full disks (at checkpoint writes) in random places, their planned steps
    spread over steps 1 .. max_steps - 2 (a run is never finished by one of them), then a signal at the final
    checkpoint's write. Without disk faults the draws are those of earlier versions: a seed replays as it did."""
    total = faults + disk_faults
    span = max(settings.max_steps - 2, 1)
    disks = set(rng.sample(range(total), disk_faults)) if disk_faults else set()
    schedule = []
    for index in range(total + 1):
        final = index == total
        low = 1 + index * span // total
        high = max(low, (index + 1) * span // total)
        if index in disks:
            schedule.append(Fault(DISK_FULL, "disk", "checkpoint", min(rng.randint(low, high), span), 0.0))
            continue
        name = rng.choice(sorted(SIGNALS))
        target = "job" if name == "SIGKILL" else rng.choice(["job", "launcher"])
        moment = "checkpoint" if final else rng.choices(list(MOMENTS), weights=list(MOMENTS.values()))[0]
        step = settings.max_steps if final else min(rng.randint(low, high), span)
        delay = rng.uniform(0.0, startup_seconds) if moment == "startup" else rng.uniform(0.0, step_seconds)
        schedule.append(Fault(name, target, moment, step, round(delay, 4), final))
    return schedule


# --- One launch ----------------------------------------------------------------------------------------------------
def run_launch(index: int, cmd: list[str], out: Path, fault: Optional[Fault], settings: Settings) -> Launch:
    """Starts the command, sends the fault at its moment (None: lets the run end), waits for the exit and checks
    what the launch left."""
    launch = Launch(index, max(checkpoints(out), default=0), fault)
    stale = temporaries(out)  # left by an earlier killed write: this launch removes them, they are not its own
    token = uuid.uuid4().hex
    seen: dict[int, str] = {}  # pid: start time of every process of the launch found
    out.mkdir(parents=True, exist_ok=True)
    log_path = out.parent / f"{out.name}_launch_{index:03d}.txt"
    tail = LogTail(out / "log.json")
    began, launch.started = time.monotonic(), time.time()
    process = start(cmd, log_path, token)
    try:
        if fault is not None:
            launch.fired = wait_and_send(process, token, fault, out, tail, stale, began, settings, launch, seen)
        signalled = time.monotonic()
        try:
            launch.exit_code = process.wait(timeout=settings.exit_timeout if launch.fired else settings.launch_timeout)
        except subprocess.TimeoutExpired:
            launch.problems.append(f"hang: no exit {time.monotonic() - signalled:.0f} s after "
                                   f"{'the signal' if launch.fired else 'the launch'}; killed")
            kill_job(token, seen)
            launch.exit_code = process.wait(timeout=30)
        launch.seconds_to_exit = round(time.monotonic() - signalled, 3)
        launch.step_seen = max(launch.step_seen, tail.poll()) if not launch.fired else launch.step_seen
        # What a launcher that has ended leaves running would hold the run lock and go on writing checkpoints.
        launch.leftovers = kill_job(token, seen)
        if launch.leftovers:
            launch.problems.append(f"{launch.leftovers} process(es) of the launch still running after the launcher "
                                   "ended (killed)")
        waited = wait_reaped(seen)
        if waited is None:
            launch.problems.append("processes of the launch not reaped 30 s after it ended")
        else:
            launch.seconds_to_reaped = round(waited, 3)
    finally:
        kill_job(token)
    launch.temporaries_left = sorted(temporaries(out) - stale)
    text = log_path.read_text(encoding="utf-8", errors="replace")
    launch.lines = read_lines(text)
    launch.newest_after = max(checkpoints(out), default=0)
    check_launch(launch, out, settings, text)
    (out / FILLER).unlink(missing_ok=True)  # the space freed, as an operator would, before the restart
    return launch


def wait_and_send(process: subprocess.Popen, token: str, fault: Fault, out: Path, tail: LogTail, stale: set[str],
                  began: float, settings: Settings, launch: Launch, seen: dict[int, str]) -> bool:
    """Waits for the fault's moment and sends it; False when the launch ended first."""
    with ProcessWatch(token, seen):
        if not wait_for_moment(process, fault, out, tail, stale, began, settings, launch):
            return False
        writing = [int(TEMPORARY.match(name).group(1)) for name in temporaries(out) - stale]
        launch.in_write = bool(writing)
        launch.step_seen = tail.poll()
        launch.seconds_to_signal = round(time.monotonic() - began, 3)
        if fault.signal == DISK_FULL:
            launch.write_at_fill = max(writing, default=None)
            fill_disk(out)
        else:
            send(process, token, fault, seen)
        return True


class ProcessWatch:
    """Keeps `seen` filled with the job's processes from a thread of its own, every 0.2 s, so that a signal to the
    job is not late: on a busy machine a scan of /proc takes tens of milliseconds, longer than a small model's
    checkpoint write, which the 1 ms watch for its temporary must not miss."""

    def __init__(self, token: str, seen: dict[int, str]) -> None:
        self.token, self.seen, self.stop = token, seen, threading.Event()
        self.thread = threading.Thread(target=self.scan, daemon=True)

    def scan(self) -> None:
        while True:
            self.seen.update(job_processes(self.token))
            if self.stop.wait(0.2):
                return

    def __enter__(self) -> "ProcessWatch":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.thread.join()


def wait_for_moment(process: subprocess.Popen, fault: Fault, out: Path, tail: LogTail, stale: set[str],
                    began: float, settings: Settings, launch: Launch) -> bool:
    """Waits for the fault's moment; False when the launch ended first."""
    deadline = began + settings.launch_timeout
    step_reached_at = None
    # The checkpoint the fault aims at (the first at or after its step): a write too quick to be seen has ended
    # once the step after it is logged, and the fault then comes at once, before the next write.
    aimed_write = -(-fault.step // settings.checkpoint_every) * settings.checkpoint_every
    while True:
        if process.poll() is not None:
            launch.step_seen = tail.poll()
            return False
        now = time.monotonic()
        if now > deadline:
            launch.problems.append(f"the moment ({fault.moment} at step {fault.step}) never came in "
                                   f"{settings.launch_timeout:.0f} s; signalled anyway")
            return True
        newest = tail.poll()
        if fault.moment == "startup":  # never later than the planned step: the run keeps to the plan
            if now - began >= fault.delay or newest >= fault.step:
                return True
        elif fault.moment == "step":
            if step_reached_at is None and newest >= fault.step:
                step_reached_at = now
            if step_reached_at is not None and now - step_reached_at >= fault.delay:
                return True
        else:  # checkpoint: a temporary of a step at or after the planned one, written by this launch
            live = [name for name in temporaries(out) - stale if int(TEMPORARY.match(name).group(1)) >= fault.step]
            if live:
                return True
            if not fault.final and newest > aimed_write:
                return True  # the write was too quick to be seen: signalled between steps instead (in_write tells)
        time.sleep(0.001 if fault.moment == "checkpoint" else 0.002)


def read_lines(text: str) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for name, pattern in LINES.items():
        hits = pattern.findall(text)
        if hits:
            found[name] = hits if name in ("stale_removed", "error") else hits[0]
    return found


def read_checkpoint(path: Path) -> dict:
    """A checkpoint file, or a sharded one's folder as the single file it converts to."""
    if path.is_dir():
        return sharded_checkpoint.whole_checkpoint(path)
    return torch.load(path, weights_only=True, map_location="cpu")


def unloadable_checkpoints(out: Path) -> list[str]:
    """A problem for each checkpoint of the folder that does not load."""
    problems = []
    for _, path in sorted(checkpoints(out).items()):
        try:
            read_checkpoint(path)
        except Exception as error:  # a half-written file under a checkpoint's name
            problems.append(f"{path.name} does not load: {type(error).__name__}: {error}")
    return problems


def check_launch(launch: Launch, out: Path, settings: Settings, text: str) -> None:
    """What every launch must leave: checkpoints that load; a restart never refused; the exit status that is
    guaranteed; after a SIGTERM during training, the stop line and its checkpoint; after a full disk, the lines."""
    launch.problems += unloadable_checkpoints(out)
    fault = launch.fault
    disk_full = launch.fired and fault.signal == DISK_FULL
    if "error" in launch.lines and not disk_full:
        launch.problems.append(f"the run reported an error: {launch.lines['error'][0]}")
    # Without torchrun the output is run_pretraining.py's own: once it trains, a signal ends it in a line, never
    # a traceback (a Ctrl-C during Python's imports is Python's KeyboardInterrupt traceback).
    if settings.nproc == 1 and "Traceback" in text and (fault is None or launch.landed != "before the first step"):
        launch.problems.append("a traceback from run_pretraining.py")
    finished = launch.newest_after >= settings.max_steps
    if not launch.fired:
        if launch.exit_code != 0:
            launch.problems.append(f"ended by itself with exit status {launch.exit_code}")
        return
    if disk_full:
        check_full_disk(launch, settings, text)
        return
    number = SIGNALS[fault.signal]
    if number == signal.SIGKILL:
        expected = {-signal.SIGKILL}
    elif settings.nproc > 1:
        # torchrun: 1 once its handler runs (it raises SignalException after closing the workers), -signal
        # before it is installed; 0 when the workers had already finished the run.
        expected = {1, -number} | ({0} if finished else set())
    else:
        # run_pretraining.py itself: 143 / 130 once its handlers run, -15 / -2 before (imports), 0 at the end.
        expected = {128 + number, -number} | ({0} if finished else set())
    if launch.exit_code not in expected:
        launch.problems.append(f"{fault.signal}: exit status {launch.exit_code}, expected one of {sorted(expected)}")
    during_training = launch.landed != "before the first step"
    if number == signal.SIGTERM and during_training and launch.step_seen < settings.max_steps - 1:
        stopped = launch.lines.get("stopped_by_sigterm")
        if stopped is None:
            launch.problems.append("SIGTERM during training: no 'stopped by SIGTERM at step N' line")
        elif int(stopped) != launch.newest_after:
            launch.problems.append(f"SIGTERM: stopped at step {stopped} but the newest checkpoint is "
                                   f"ckpt_{launch.newest_after}")
        elif int(stopped) < launch.step_seen:
            launch.problems.append(f"SIGTERM: stopped at step {stopped}, before the step {launch.step_seen} logged")
        if settings.nproc == 1 and launch.exit_code != 143:
            launch.problems.append(f"SIGTERM during training: exit status {launch.exit_code}, not 143")
    if number == signal.SIGINT and during_training and settings.nproc == 1 and not finished:
        if launch.exit_code != 130:
            launch.problems.append(f"Ctrl-C during training: exit status {launch.exit_code}, not 130")


def check_full_disk(launch: Launch, settings: Settings, text: str) -> None:
    """full_disk_problems, and no temporary left by the failed write; notes the file the run could not write."""
    errors = launch.lines.get("error", [])
    named = [line.split(": ", 1)[0] for line in errors if "No space left on device" in line]
    launch.full_disk_file = Path(named[0]).name if named else ""
    finished = launch.newest_after >= settings.max_steps
    launch.problems += full_disk_problems(launch.exit_code, errors, settings.nproc, finished, worker_traceback(text))
    if launch.temporaries_left:
        launch.problems.append(f"full disk: temporaries left: {', '.join(launch.temporaries_left)}")


# --- The campaign ------------------------------------------------------------------------------------------------
def reference_timing(log: Path, started: float) -> tuple[float, float]:
    """(seconds from the reference's launch to its first step's record, seconds a step)."""
    stamps = [float(record["timestamp"]) for _, record in step_records(log)[0]]
    step = (stamps[-1] - stamps[0]) / (len(stamps) - 1) if len(stamps) > 1 else 0.05
    return max(stamps[0] - started, 0.5), max(step, 0.005)


def run_campaign(root: Path, faults: int = 25, seed: int = 0, settings: Optional[Settings] = None,
                 echo: bool = True, disk_faults: int = 0) -> Campaign:
    """The reference run, then the faulted one: launched again and again, each launch given the next fault of
    the schedule, until the faults asked for were sent and a launch ran to the end. Then the comparisons. With
    disk faults the faulted run's folder is a tmpfs for the campaign (NoTmpfs, before any run, where it cannot
    be)."""
    settings = settings or Settings()
    if faults + disk_faults < 1:
        raise ValueError("a campaign needs at least one fault")
    say = (lambda text: print(text, flush=True)) if echo else (lambda text: None)
    reference, faulted = root / "reference", root / "faulted"
    if os.path.ismount(faulted):  # the tmpfs of a campaign that was killed
        subprocess.run(["umount", "-l", str(faulted)], check=True, capture_output=True)
    if faulted.exists():  # an earlier campaign's
        shutil.rmtree(faulted)
    if disk_faults:  # first: refused before anything else is written or removed where it cannot be
        mount_tmpfs(faulted, settings.disk_megabytes)
    try:
        if reference.exists():
            shutil.rmtree(reference)
        inputs = make_workspace(root, settings.family)
        return campaign_in(inputs, reference, faulted, faults, disk_faults, seed, settings, say)
    finally:
        if disk_faults:
            unmount_keeping_files(faulted)


def campaign_in(inputs: Path, reference: Path, faulted: Path, faults: int, disk_faults: int, seed: int,
                settings: Settings, say: Callable[[str], None]) -> Campaign:
    """run_campaign's runs and comparisons, once the folders are ready."""
    began = time.monotonic()
    ref = run_launch(0, command(inputs, reference, settings), reference, None, settings)
    reference_seconds = time.monotonic() - began
    if ref.exit_code != 0 or settings.max_steps not in checkpoints(reference):
        raise RuntimeError(f"the reference run failed (exit status {ref.exit_code}); see "
                           f"{reference.parent / 'reference_launch_000.txt'}")
    startup_seconds, step_seconds = reference_timing(reference / "log.json", ref.started)
    say(f"{settings.family} family, reference: {settings.max_steps} steps in {reference_seconds:.1f} s "
        f"({startup_seconds:.1f} s to the first step, {step_seconds * 1000:.0f} ms a step); fault schedule seed {seed}")
    schedule = plan(random.Random(seed), faults, settings, startup_seconds, step_seconds, disk_faults)
    began = time.monotonic()
    launches, problems = run_faulted(command(inputs, faulted, settings), faulted, schedule, settings, say)
    seconds = time.monotonic() - began
    compared, found = compare_checkpoints(reference, faulted)
    if not any(CHECKPOINT.match(name).group(1) == str(settings.max_steps) for name in compared):
        problems.append(f"ckpt_{settings.max_steps} missing from one of the runs")
    checked, mismatches, unreadable = compare_records(reference / "log.json", faulted / "log.json")
    left = sorted(temporaries(faulted))
    if left:
        problems.append(f"temporaries left at the end: {', '.join(left)}")
    return Campaign(seed, faults, settings, launches, round(reference_seconds, 1), round(seconds, 1), compared, found,
                    checked, mismatches, unreadable, left, problems, disk_faults)


def run_faulted(cmd: list[str], faulted: Path, schedule: list[Fault], settings: Settings,
                say: Callable[[str], None]) -> tuple[list[Launch], list[str]]:
    """The faulted run's launches, each given the schedule's next fault, until one ends the run; the problems
    of the whole (too few faults sent, no end)."""
    asked = len(schedule) - 1  # the final checkpoint's fault may come too late to be sent
    launches: list[Launch] = []
    problems: list[str] = []
    index = 0
    while True:
        fired = sum(launch.fired for launch in launches)
        fault = schedule[fired] if fired < len(schedule) else None
        newest = max(checkpoints(faulted), default=0)
        if fault is not None and not fault.final and fault.step <= newest:
            fault.step = newest + 1  # the run is behind the plan (faults before the first step): its next step
        index += 1
        launch = run_launch(index, cmd, faulted, fault, settings)
        launches.append(launch)
        say(describe(launch))
        if launch.exit_code == 0 and max(checkpoints(faulted), default=0) >= settings.max_steps:
            if fired + launch.fired < asked:
                problems.append(f"the run finished after {fired + launch.fired} faults, fewer than {asked}")
            return launches, problems
        if len(launches) > 3 * (asked + 1) + 10:
            problems.append(f"{len(launches)} launches without reaching the end")
            return launches, problems


def describe(launch: Launch) -> str:
    if launch.fault is None or not launch.fired:
        what = "no fault" if launch.fault is None else f"{launch.fault.signal} planned, the launch ended first"
    else:
        f = launch.fault
        at = f"+{f.delay:.2f} s" if f.moment == "startup" else f"step {f.step}"
        what = f"{f.signal:8} to {f.target:8} {f.moment:10} ({at}) at {launch.seconds_to_signal:5.2f} s"
    write = " in a write" if launch.in_write else ""
    if launch.fired and launch.fault.signal == DISK_FULL:
        write += f", failed at {launch.full_disk_failed_at}"
    left = f", left {len(launch.temporaries_left)} temporary" if launch.temporaries_left else ""
    trouble = f"  PROBLEM: {'; '.join(launch.problems)}" if launch.problems else ""
    return (f"launch {launch.index:3}: from ckpt {launch.resumed_from:3}: {what}{write}: step {launch.step_seen:3}, "
            f"exit {launch.exit_code}, newest ckpt {launch.newest_after}{left}{trouble}")


# --- Report ------------------------------------------------------------------------------------------------------
def summary(campaign: Campaign) -> dict[str, Any]:
    faults = campaign.faults
    disk = [launch for launch in faults if launch.fault.signal == DISK_FULL]
    whole = campaign.bit_exact and not campaign.problems  # a fault is survived when its run ended as the reference
    return {
        "family": campaign.settings.family,
        "sharding": campaign.settings.sharding,
        "faults": len(faults),
        "survived": dict(Counter(launch.fault.signal for launch in faults if whole and not launch.problems)),
        "launches": len(campaign.launches),
        "restarts": len(campaign.launches) - 1,
        "by_signal": dict(Counter(launch.fault.signal for launch in faults)),
        "by_target": dict(Counter(launch.fault.target for launch in faults)),
        "by_moment": dict(Counter(launch.fault.moment for launch in faults)),
        "landed": dict(Counter(launch.landed for launch in faults)),
        "in_checkpoint_write": sum(launch.in_write for launch in faults),
        "half_written_left_by_sigkill": sum(bool(launch.temporaries_left) for launch in faults),
        "before_first_checkpoint": sum(launch.resumed_from == 0 and launch.newest_after == 0 for launch in faults),
        "during_final_checkpoint": sum(launch.fault.final for launch in faults),
        "launcher_exit_codes": {f"{sig}": dict(Counter(str(f.exit_code) for f in faults if f.fault.signal == sig))
                                for sig in KINDS},
        "disk_faults_asked": campaign.disk_faults_asked,
        "disk_full_failed_at": dict(Counter(launch.full_disk_failed_at for launch in disk)),
        "disk_full_error_lines": sum(len(launch.lines.get("error", [])) for launch in disk),
        "disk_full_no_checkpoint_yet": sum("no checkpoint in" in " ".join(launch.lines.get("error", []))
                                           for launch in disk),
        "sigterm_stop_lines": sum("stopped_by_sigterm" in launch.lines for launch in faults),
        "ctrl_c_lines": sum("ctrl_c" in launch.lines for launch in faults),
        "waited_for_ends": sum(launch.seconds_to_reaped > 0.1 for launch in campaign.launches),
        "longest_zombie_wait": max((launch.seconds_to_reaped for launch in campaign.launches), default=0.0),
        "locks_taken_over": sum("lock_taken_over" in launch.lines for launch in campaign.launches),
        "stale_temporaries_removed": sum(len(launch.lines.get("stale_removed", [])) for launch in campaign.launches),
        "steps_redone": campaign.records_checked - campaign.settings.max_steps,
        "step_records_checked": campaign.records_checked,
        "unreadable_log_lines": campaign.unreadable_log_lines,
        "checkpoints_compared": campaign.compared,
        "bit_exact": campaign.bit_exact,
        "differences": campaign.differences[:20],
        "record_mismatches": campaign.record_mismatches[:20],
        "problems": campaign.problems + [f"launch {run.index}: {p}" for run in campaign.launches for p in run.problems],
        "reference_seconds": campaign.reference_seconds,
        "faulted_seconds": campaign.seconds,
        "seed": campaign.seed,
        "settings": asdict(campaign.settings),
    }


def family_line(family: str) -> str:
    return f"{family} ({FAMILY_NAMES[family]}, --optimizer {FAMILIES[family][1]})"


def full_disk_line(s: dict[str, Any]) -> str:
    """The table's line on the DISKFULL faults: which write each one failed, and the lines the runs said."""
    if not s["disk_faults_asked"]:
        return "none asked (--disk_faults 0)"
    failed = ", ".join(f"{k} {v}" for k, v in sorted(s["disk_full_failed_at"].items())) or "none"
    return (f"{s['by_signal'].get(DISK_FULL, 0)} of {s['disk_faults_asked']} asked; the write that failed: {failed}; "
            f"{s['disk_full_error_lines']} 'error:' lines ({s['disk_full_no_checkpoint_yet']} with 'no checkpoint "
            f"yet'); the filler removed and the run restarted after each")


def table(campaign: Campaign) -> str:
    s = summary(campaign)
    survived = sum(s["survived"].values())
    rows = [("model family", f"{family_line(s['family'])}, --sharding {s['sharding']}"),
            ("faults survived", f"{survived} of {s['faults']}: "
                                + ", ".join(f"{k} {s['survived'].get(k, 0)}" for k in KINDS if k in s["by_signal"])),
            ("faults injected", f"{s['faults']} in {s['launches']} launches ({s['restarts']} restarts)"),
            ("by kind", ", ".join(f"{k} {v}" for k, v in sorted(s["by_signal"].items()))),
            ("sent to", ", ".join(f"{k} {v}" for k, v in sorted(s["by_target"].items()))),
            ("by planned moment", ", ".join(f"{k} {v}" for k, v in sorted(s["by_moment"].items()))),
            ("where it landed", ", ".join(f"{k} {v}" for k, v in sorted(s["landed"].items()))),
            ("during a checkpoint write", f"{s['in_checkpoint_write']} (a half-written temporary left by "
                                          f"{s['half_written_left_by_sigkill']}; the final checkpoint's: "
                                          f"{s['during_final_checkpoint']})"),
            ("before the first checkpoint", str(s["before_first_checkpoint"])),
            ("full disks", full_disk_line(s)),
            ("launcher exit status", "; ".join(f"{k}: " + ", ".join(f"{c} x{n}" for c, n in sorted(v.items()))
                                               for k, v in s["launcher_exit_codes"].items() if v)),
            ("lines", f"'stopped by SIGTERM' {s['sigterm_stop_lines']}, 'interrupted (Ctrl-C)' {s['ctrl_c_lines']}, "
                      f"lock taken over {s['locks_taken_over']}, stale temporaries removed "
                      f"{s['stale_temporaries_removed']}"),
            ("killed job ended after", f"up to {s['longest_zombie_wait']:.1f} s (waited for before "
                                        f"{s['waited_for_ends']} restarts)"),
            ("steps redone", f"{s['steps_redone']} ({s['step_records_checked']} step records checked, "
                             f"{s['unreadable_log_lines']} log lines cut by a SIGKILL or a full disk)"),
            ("checkpoints compared", ", ".join(s["checkpoints_compared"])),
            ("bit for bit", "yes" if s["bit_exact"] else f"NO: {s['differences'] + s['record_mismatches']}"),
            ("wall time", f"reference {s['reference_seconds']} s, faulted run {s['faulted_seconds']} s"),
            ("problems", "; ".join(s["problems"]) or "none"),
            ("replay", f"--seed {s['seed']} --faults {campaign.faults_asked} --max_steps {campaign.settings.max_steps} "
                       f"--num_steps_per_checkpoint {campaign.settings.checkpoint_every} --nproc "
                       f"{campaign.settings.nproc} --family {s['family']} --disk_faults {campaign.disk_faults_asked} "
                       f"--sharding {s['sharding']}")]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def arguments(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=25,
                        help="signals to survive (one more aims at the final write)")
    parser.add_argument("--disk_faults", type=int, default=0,
                        help="full disks during checkpoint writes, besides the signals (needs root: a tmpfs)")
    parser.add_argument("--family", choices=sorted(FAMILIES), default="bert",
                        help="bert: the tiny BERT with LAMB; modern: a tiny ModernBERT with AdamW")
    parser.add_argument("--sharding", choices=SHARDING, default="ddp",
                        help="run_pretraining.py's --sharding: fsdp checkpoints the state gathered from the shards")
    parser.add_argument("--seed", type=int, default=0, help="seed of the fault schedule (random.Random)")
    parser.add_argument("--output_dir", type=Path, help="work folder (default: a temporary one, removed after)")
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--num_steps_per_checkpoint", type=int, default=2)
    parser.add_argument("--nproc", type=int, default=2, help="processes; 1 runs run_pretraining.py without torchrun")
    parser.add_argument("--json", type=Path, help="also write the summary and every launch here")
    args = parser.parse_args(argv)
    if min(args.faults, args.disk_faults) < 0 or args.faults + args.disk_faults < 1:
        raise InputError(f"--faults {args.faults} --disk_faults {args.disk_faults}: each must be >= 0 and together "
                         ">= 1; ask for at least one fault")
    for flag, value, least in (("--max_steps", args.max_steps, 4), ("--nproc", args.nproc, 1),
                               ("--num_steps_per_checkpoint", args.num_steps_per_checkpoint, 1)):
        if value < least:
            raise InputError(f"{flag} {value}: must be at least {least}; pass a larger one")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = arguments(argv)
    # Started in the background by a shell without job control, this process ignores SIGINT and its launches
    # would inherit that, shrugging off the SIGINT faults: a Python handler is reset to the default at exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    settings = Settings(max_steps=args.max_steps, checkpoint_every=args.num_steps_per_checkpoint, nproc=args.nproc,
                        family=args.family, sharding=args.sharding)
    temporary = None if args.output_dir else tempfile.mkdtemp(prefix="fault_injection_")
    root = args.output_dir or Path(temporary)
    host = detect("cpu")
    try:
        campaign = run_campaign(root, args.faults, args.seed, settings, disk_faults=args.disk_faults)
        print()
        print(table(campaign))
        print(f"host: {host_line(host, 'fp32')}, {os.cpu_count()} logical CPUs")
        if args.json:
            write_json(args.json, {"summary": summary(campaign), "host": asdict(host),
                                   "launches": [{**asdict(launch), "landed": launch.landed,
                                                 "full_disk_failed_at": launch.full_disk_failed_at}
                                                for launch in campaign.launches]})
        return 0 if campaign.ok else 1
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    run_cli(lambda: sys.exit(main()))  # a refusal (InputError: a flag, no tmpfs) is one line, exit 2
