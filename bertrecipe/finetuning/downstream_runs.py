"""The runs of run_downstream.py: each a process of a fine-tuning command (run_glue.py, run_squad.py,
run_retrieval.py) in a folder of its own under OUTPUT_DIR/runs/<task>/<configuration>_seed<seed>/, holding its
log (log.txt: the process's stdout and stderr), the command's outputs and, once it has finished and been scored,
scores.json (written whole or not at all). A run whose scores.json is there is done and never run again; a folder
without one (a run killed or failed) is emptied and the run started again, but only when this command made the
folder (its .run_downstream marker): a folder of anything else is bad input. Runs go to slots, one run per slot at
a time: a GPU each (CUDA_VISIBLE_DEVICES), or a share of the CPU's cores (OMP_NUM_THREADS)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

from bertrecipe.common.atomic_files import write_atomic
from bertrecipe.common.errors import InputError
from bertrecipe.finetuning.downstream_plan import SQUAD, PlannedRun
from bertrecipe.training.metric_logger import read_log

MARKER, SCORES, FAILURE, LOG = ".run_downstream", "scores.json", "failure.json", "log.txt"
# Fine-tuned weights are removed once the run is scored (--keep_models keeps them): a grid of BERT-large runs
# would otherwise keep 1.3 GB per run.
WEIGHT_FILES = ("pytorch_model.bin", "model.safetensors")
LOG_TAIL_LINES = 20
OPTIONAL_RESULTS = ("eval_mm_acc",)  # MNLI's mismatched accuracy: only where the folder has dev_mismatched.tsv


def run_folder(runs_dir: Path, run: PlannedRun) -> Path:
    return runs_dir / run.task.name / run.folder_name


def read_scores(folder: Path) -> Optional[dict[str, Any]]:
    """A finished run's record, or None when it has none (an unreadable one counts as none: it is rewritten)."""
    try:
        record = json.loads((folder / SCORES).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and isinstance(record.get("metrics"), dict) else None


def expected_record(run: PlannedRun, identity: dict[str, Any]) -> dict[str, Any]:
    """What a finished run's record must say for its scores to count in this table: the run's settings and the
    identity of the model, vocab and precision it ran with."""
    return {"settings": run.settings(), "identity": identity}


def sort_out_folders(runs: Sequence[PlannedRun], runs_dir: Path,
                     identity: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], list[PlannedRun]]:
    """(records of the runs already done, the runs to do). InputError (one line, nothing touched) for a folder this
    command did not make, or a finished run of other settings or another checkpoint: its scores would mix into
    this table."""
    done, todo = {}, []
    for run in runs:
        folder = run_folder(runs_dir, run)
        record = read_scores(folder)
        if record is not None:
            expected = expected_record(run, identity)
            for key, value in expected.items():
                if record.get(key) != value:
                    raise InputError(f"{folder / SCORES}: ran with other {key} ({differences(record.get(key), value)})"
                                     "; choose another --output_dir for this checkpoint or protocol")
            done[run.label] = record
            continue
        if folder.exists() and not (folder / MARKER).is_file():
            raise InputError(f"{folder}: exists and was not made by run_downstream.py (no {MARKER} in it); move it "
                             "away or choose another --output_dir")
        todo.append(run)
    return done, todo


def differences(found: Any, expected: Any) -> str:
    if not (isinstance(found, dict) and isinstance(expected, dict)):
        return f"{found!r} instead of {expected!r}"
    keys = [k for k in sorted(set(found) | set(expected)) if found.get(k) != expected.get(k)]
    return "; ".join(f"{k} {found.get(k)!r} instead of {expected.get(k)!r}" for k in keys[:3])


def read_run_results(run: PlannedRun, folder: Path) -> dict[str, Any]:
    """What the command wrote as its scores: run_glue.py's and run_retrieval.py's results.json, run_squad.py's
    closing record in its dllogger log."""
    if run.task.kind == SQUAD:
        closing = [r["data"] for r in read_log(folder / "dllogger.json") if r.get("type") == "LOG"
                   and r.get("step") == []]
        return closing[-1] if closing else {}
    return json.loads((folder / "results.json").read_text(encoding="utf-8"))


def metrics_of(run: PlannedRun, results: dict[str, Any]) -> dict[str, float]:
    """The task's metrics (downstream_plan.Metric) as percentages; KeyError when the results lack one."""
    metrics = {}
    for metric in run.task.metrics:
        if metric.key in results:
            metrics[metric.name] = float(results[metric.key]) * metric.scale
        elif metric.key not in OPTIONAL_RESULTS:
            raise KeyError(metric.key)
    return metrics


@dataclass
class Slot:
    """Where a run goes: a GPU or a share of the CPU, as the environment its process gets."""

    name: str
    env: dict[str, str]


def gpu_slots(gpus: int, workers: int, visible: Optional[str] = None) -> list[Slot]:
    """`workers` slots over the GPUs this process sees, in turn (one run per GPU when workers == gpus). `visible`:
    this process's own CUDA_VISIBLE_DEVICES, whose entries (not 0..n-1) a run's must name."""
    ids = [part.strip() for part in visible.split(",")][:gpus] if visible else [str(i) for i in range(gpus)]
    return [Slot(f"GPU {ids[i % len(ids)]}", {"CUDA_VISIBLE_DEVICES": ids[i % len(ids)]}) for i in range(workers)]


def cpu_slots(cores: int, workers: int) -> list[Slot]:
    """`workers` slots sharing the cores: each run's torch and BLAS threads are its share (at least one)."""
    threads = str(max(1, cores // workers))
    return [Slot(f"CPU {i}", {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads, "CUDA_VISIBLE_DEVICES": ""})
            for i in range(workers)]


@dataclass
class Outcome:
    run: PlannedRun
    record: Optional[dict[str, Any]]  # the scores.json written; None when the run failed
    problem: str = ""


class Progress:
    """One line per run started and finished: counts, elapsed time."""

    def __init__(self, total: int, already: int, print_line: Callable[[str], None] = print) -> None:
        self.total, self.finished, self.failed, self.running = total, already, 0, 0
        self.start = time.monotonic()
        self.lock = threading.Lock()
        self.print_line = print_line

    def line(self, event: str, run: PlannedRun, detail: str = "") -> None:
        with self.lock:
            if event == "started":
                self.running += 1
            else:
                self.running -= 1
                self.finished += event == "finished"
                self.failed += event == "FAILED"
            elapsed = int(time.monotonic() - self.start)
            clock = f"{elapsed // 3600}:{elapsed // 60 % 60:02d}:{elapsed % 60:02d}"
            counts = f"[{self.finished}/{self.total} done, {self.running} running, {self.failed} failed, {clock}]"
            try:
                self.print_line(f"{counts} {event} {run.label}{': ' + detail if detail else ''}")
            except OSError:  # the reader of our output went away (`| head`): the runs go on, unseen
                self.print_line = lambda line: None


@dataclass
class Executor:
    """Runs the planned runs over the slots, each as `command(run, folder)` in its folder."""

    runs_dir: Path
    command: Callable[[PlannedRun, Path], list[str]]
    identity: dict[str, Any]
    keep_models: bool = False
    processes: set[subprocess.Popen] = field(default_factory=set)
    stopping: bool = False
    starting: threading.Lock = field(default_factory=threading.Lock)  # no process starts while stop_all stops them

    def run_all(self, runs: Sequence[PlannedRun], slots: Sequence[Slot], progress: Progress) -> list[Outcome]:
        queue, outcomes, lock = deque(runs), [], threading.Lock()

        def work(slot: Slot) -> None:
            while True:
                with lock:
                    if not queue or self.stopping:
                        return
                    run = queue.popleft()
                try:
                    outcome = self.run_one(run, slot, progress)
                except Exception as error:  # e.g. a full disk writing its scores: named as failed, never lost
                    outcome = Outcome(run, None, f"{type(error).__name__}: {error}")
                    progress.line("FAILED", run, outcome.problem)
                with lock:
                    outcomes.append(outcome)

        threads = [threading.Thread(target=work, args=(slot,), daemon=True) for slot in slots]
        try:
            for thread in threads:
                thread.start()
            for thread in threads:
                while thread.is_alive():  # a timed join, so that Ctrl-C and SIGTERM reach this thread
                    thread.join(timeout=0.5)
        except BaseException:
            self.stop_all()
            raise
        return outcomes

    def stop_all(self) -> None:
        """Ctrl-C or SIGTERM: the running processes are stopped; their folders, without scores, rerun next time."""
        with self.starting:
            self.stopping = True
        for process in list(self.processes):
            process.terminate()
        for process in list(self.processes):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()

    def run_one(self, run: PlannedRun, slot: Slot, progress: Progress) -> Outcome:
        folder = fresh_run_folder(run_folder(self.runs_dir, run))
        progress.line("started", run, slot.name)
        start = time.monotonic()
        returncode = self.start_and_wait(self.command(run, folder), folder, slot)
        seconds = time.monotonic() - start
        if returncode != 0:
            problem = f"exit status {returncode}; see {folder / LOG}"
            return self.failed(run, folder, problem, returncode, seconds, progress)
        try:
            results = read_run_results(run, folder)
            metrics = metrics_of(run, results)
        except (OSError, ValueError, KeyError) as error:
            problem = f"no scores in its outputs ({type(error).__name__}: {error}); see {folder / LOG}"
            return self.failed(run, folder, problem, returncode, seconds, progress)
        record = {**expected_record(run, self.identity), "metrics": metrics, "results": results,
                  "seconds": round(seconds, 1), "slot": slot.name}
        write_json(folder / SCORES, record)
        if not self.keep_models:
            for name in WEIGHT_FILES:
                (folder / name).unlink(missing_ok=True)
        shown = ", ".join(f"{name} {value:.2f}" for name, value in metrics.items())
        progress.line("finished", run, f"{shown} ({seconds:.0f} s)")
        return Outcome(run, record)

    def start_and_wait(self, argv: list[str], folder: Path, slot: Slot) -> int:
        with open(folder / LOG, "w", encoding="utf-8") as log:
            log.write(shlex.join(argv) + "\n\n")
            log.flush()
            with self.starting:
                if self.stopping:
                    log.write("not started: the call was stopped\n")
                    return -15
                try:
                    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                               env={**os.environ, **slot.env})
                except OSError as error:
                    log.write(f"could not start: {error}\n")
                    return 127
                self.processes.add(process)
            try:
                return process.wait()
            finally:
                self.processes.discard(process)

    def failed(self, run: PlannedRun, folder: Path, problem: str, returncode: int, seconds: float,
               progress: Progress) -> Outcome:
        tail = (folder / LOG).read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL_LINES:]
        write_json(folder / FAILURE, {**expected_record(run, self.identity), "problem": problem,
                                      "returncode": returncode, "seconds": round(seconds, 1), "log_tail": tail})
        if not self.stopping:
            progress.line("FAILED", run, problem)
        return Outcome(run, None, problem)


def fresh_run_folder(folder: Path) -> Path:
    """The run's folder, empty but for its marker: a killed or failed run's leftovers are removed (the folder is
    ours: sort_out_folders checked its marker)."""
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    (folder / MARKER).write_text("made by run_downstream.py; removed and rerun while it has no scores.json\n",
                                 encoding="utf-8")
    return folder


def write_json(path: Path, obj: Any) -> None:
    text = json.dumps(obj, indent=1, sort_keys=True, allow_nan=True) + "\n"
    write_atomic(path, lambda f: f.write(text.encode("utf-8")))

