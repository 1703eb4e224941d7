"""Data preparation's fault campaign (issue 48, "Nothing lost, round four"), beside the training one
(benchmarks/fault_injection.py): bertPrep.py's text_formatting and create_hdf5_files on 2 processes, each
interrupted by SIGINT and by SIGTERM at random moments, sent to the whole process group (a terminal's Ctrl-C, Slurm
signalling every process of its step) or to bertPrep alone (`kill PID`, scancel of the batch step).

Every interrupted launch must end within 5 s of the signal with exit status 130 (SIGINT) or 143 (SIGTERM) and
exactly one line on stderr, run_cli's stop line; by then no process it started may be alive (found by a marker in
the environment, which every descendant inherits, so a worker that left the group is found too), no temporary may
be left in the working folder, and every output it left must already be the reference's (a shard completed before
the signal is kept whole). The launch is then run again to its end, and every output file of the stage must be the
uninterrupted reference run's, byte for byte.

The corpus: --copies copies of tests/data's Wikipedia excerpt as the parts of one dump (one formatting task each);
sharding, run once without faults, cuts the formatted text into 4 training and 2 test shards, which
create_hdf5_files turns into 6 HDF5 shards, a task each. The moments are uniform over the reference launch's
duration (start-up and imports included); the schedule comes from random.Random(--seed), and a launch that ends
before its moment is run again with a new draw. So is a moment within the interpreter's own start-up, before
bertPrep's first line has installed its handlers (read from /proc/PID/status, SigCgt: SIGTERM is caught from then):
no Python program can answer there, Python prints a KeyboardInterrupt traceback or dies of the SIGTERM, having
written nothing. From the first line on (bertrecipe/cli/entry.py), every signal must end in the stop line.

    python -m benchmarks.data_prep_faults --faults 20 --seed 0    # 20 SIGINT and 20 SIGTERM in each stage

Exit status 0 when every fault passed every check, 1 otherwise; 2 and one line for a flag refused.
"""
from __future__ import annotations

import argparse
import hashlib
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

from benchmarks.common import REPO, write_json
from benchmarks.fault_injection import MARKER, job_processes, kill_job, wait_reaped
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.common.hardware import detect
from bertrecipe.common.stop_signals import stop_line
from bertrecipe.dataprep import layout

EXCERPT = REPO / "tests" / "data" / "wiki" / "enwiki-excerpt.xml.bz2"
VOCAB = REPO / "tests" / "data" / "vocab-uncased-excerpt.txt"
SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM}
TARGETS = ("group", "parent")
EXPECTED = {"SIGINT": (130, stop_line("interrupted (Ctrl-C)")), "SIGTERM": (143, stop_line("SIGTERM"))}
TEMPORARY = re.compile(r"^\..+\.tmp$")  # atomic_files' temporaries (`.<name>.<pid>.<random>.tmp`) and older ones
WORKER = "spawn_main"  # in the command line of a multiprocessing spawn worker
STAGES = ("text_formatting", "create_hdf5_files")
ENDED, IN_PYTHON_START_UP = "ended", "python start-up"  # why a launch was not signalled at its moment


@dataclass
class Settings:
    copies: int = 240  # dump parts: formatting tasks (about 3.5 s on 2 busy cores)
    processes: int = 2
    training_shards: int = 4
    test_shards: int = 2
    dupe_factor: int = 3  # instances of each document: HDF5 creation takes a few seconds too
    max_seq_length: int = 128
    exit_seconds: float = 5.0  # from the signal to the end of every process of the launch
    run_timeout: float = 600.0  # an uninterrupted launch that takes longer hangs


@dataclass
class Fault:
    stage: str
    signal: str  # a key of SIGNALS
    target: str  # "group" (killpg) or "parent" (kill)
    delay: float  # seconds after the launch


@dataclass
class Outcome:
    fault: Fault
    draws: int = 0  # launches that ended before their moment, redrawn
    in_python_start_up: int = 0  # moments before bertPrep's first line had installed its handlers, redrawn
    # Moments that came as bertPrep was exiting with every output complete, by its exit status (redrawn): 0, or the
    # signal's own death (-2, -15) once Python's finalization has put the default handlers back.
    came_at_the_exit: list[int] = field(default_factory=list)
    workers_at_signal: int = 0  # spawn workers alive when the signal went
    exit_code: Optional[int] = None
    seconds_to_exit: float = 0.0  # from the signal to bertPrep's exit
    seconds_to_all_ended: float = 0.0  # from the signal until no process of the launch was left
    stderr: list[str] = field(default_factory=list)
    left_alive: list[str] = field(default_factory=list)  # processes of the launch alive 5 s after the signal
    temporaries: list[str] = field(default_factory=list)
    kept_outputs: int = 0  # outputs present after the interruption (each must be the reference's)
    rerun_seconds: float = 0.0
    problems: list[str] = field(default_factory=list)

    @property
    def landed(self) -> str:
        return "with workers running" if self.workers_at_signal else "before or after the workers"


# --- The working folders and the command ----------------------------------------------------------------------
def make_corpus(inputs: Path, copies: int) -> Path:
    """inputs/download/wikicorpus_en/ holding `copies` copies of the excerpt, the parts of one dump."""
    dumps = layout.download_dir(inputs) / "wikicorpus_en"
    dumps.mkdir(parents=True, exist_ok=True)
    for index in range(copies):
        shutil.copyfile(EXCERPT, dumps / f"enwiki-part{index:04d}.xml.bz2")
    return layout.download_dir(inputs)


def working_folder(root: Path, name: str, downloads: Path) -> Path:
    """A $BERT_PREP_WORKING_DIR whose download/ is the shared corpus."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "download").symlink_to(downloads, target_is_directory=True)
    return folder


def command(action: str, settings: Settings) -> list[str]:
    flags = ["--action", action, "--dataset", "wikicorpus_en", "--n_processes", str(settings.processes),
             "--n_training_shards", str(settings.training_shards), "--n_test_shards", str(settings.test_shards)]
    if action == "create_hdf5_files":
        flags += ["--vocab_file", str(VOCAB), "--max_seq_length", str(settings.max_seq_length),
                  "--max_predictions_per_seq", "20", "--dupe_factor", str(settings.dupe_factor)]
    return [sys.executable, str(REPO / "data" / "bertPrep.py"), *flags]


def stage_outputs(folder: Path, stage: str) -> list[Path]:
    """The folders a stage writes under a working folder (what its launches are compared by)."""
    pattern = "formatted_one_article_per_line" if stage == "text_formatting" else "hdf5_*"
    return sorted(folder.glob(pattern))


def digests(folder: Path, stage: str) -> dict[str, str]:
    """sha256 of every file the stage wrote, by its path under the working folder (temporaries aside)."""
    found = {}
    for top in stage_outputs(folder, stage):
        for path in sorted(top.rglob("*")):
            name = str(path.relative_to(folder))
            if path.is_file() and not any(TEMPORARY.match(part) for part in Path(name).parts):
                found[name] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def temporaries(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(".*") if TEMPORARY.match(p.name))


# --- Launches ----------------------------------------------------------------------------------------------------
def start(cmd: list[str], folder: Path, token: str, name: str) -> subprocess.Popen:
    """bertPrep in its own session (its process group is the one a terminal's Ctrl-C would reach), every process
    marked by the token in its environment, stdout and stderr to files beside the folder."""
    env = {**os.environ, "BERT_PREP_WORKING_DIR": str(folder), "OMP_NUM_THREADS": "1", MARKER: token}
    with open(folder.parent / f"{name}.stdout", "wb") as out, open(folder.parent / f"{name}.stderr", "wb") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=folder.parent, start_new_session=True)


def stderr_lines(folder: Path, name: str) -> list[str]:
    return (folder.parent / f"{name}.stderr").read_text(encoding="utf-8", errors="replace").splitlines()


def run_to_end(cmd: list[str], folder: Path, name: str, settings: Settings) -> tuple[float, int, list[str]]:
    """(seconds, exit status, stderr lines) of an uninterrupted launch; a hang is killed and reported as -9."""
    token = uuid.uuid4().hex
    began = time.monotonic()
    process = start(cmd, folder, token, name)
    try:
        code = process.wait(timeout=settings.run_timeout)
    except subprocess.TimeoutExpired:
        code = -signal.SIGKILL
    finally:
        kill_job(token)
    return time.monotonic() - began, code, stderr_lines(folder, name)


def spawn_workers(token: str) -> int:
    """The launch's multiprocessing workers alive now."""
    count = 0
    for pid in job_processes(token):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                count += WORKER.encode() in f.read()
        except OSError:
            pass
    return count


def command_lines(pids: dict[int, str]) -> list[str]:
    lines = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                words = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
            lines.append(f"{pid}: {words[:160]}")
        except OSError:
            lines.append(f"{pid}: (ended)")
    return lines


# --- One fault ---------------------------------------------------------------------------------------------------
def send(process: subprocess.Popen, fault: Fault) -> bool:
    """The fault's signal to bertPrep's process group or to bertPrep alone; False when it had ended."""
    number = SIGNALS[fault.signal]
    try:
        if fault.target == "group":
            os.killpg(process.pid, number)
        else:
            os.kill(process.pid, number)
    except ProcessLookupError:
        return False
    return process.poll() is None


def catches_sigterm(pid: int) -> bool:
    """Whether the process has a handler of its own for SIGTERM (the SigCgt mask of /proc/PID/status): Python
    installs none at start-up, bertPrep's entry point does first thing."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signal.SIGTERM - 1) & 1)
    except OSError:
        pass
    return False


def interrupt(fault: Fault, folder: Path, name: str, settings: Settings, outcome: Outcome) -> Optional[str]:
    """Launches the fault's stage, signals it at its moment and waits until every process of the launch has
    ended (at most settings.exit_seconds, then they are killed). None when it was signalled, else why not: ENDED
    before its moment, or IN_PYTHON_START_UP when the moment came before bertPrep had installed its handlers."""
    token = uuid.uuid4().hex
    began = time.monotonic()
    process = start(command(fault.stage, settings), folder, token, name)
    handlers_seen = False
    try:
        while time.monotonic() - began < fault.delay:
            if process.poll() is not None:
                return ENDED
            handlers_seen = handlers_seen or catches_sigterm(process.pid)
            time.sleep(0.002)
        if not (handlers_seen or catches_sigterm(process.pid)):  # not seen until now: Python's own start-up
            return IN_PYTHON_START_UP  # (a launch past its handlers, at its exit, is the finished_first case)
        outcome.workers_at_signal = spawn_workers(token)
        signalled = time.monotonic()
        if not send(process, fault):
            process.wait()
            return ENDED
        deadline = signalled + settings.exit_seconds
        try:
            outcome.exit_code = process.wait(timeout=settings.exit_seconds)
        except subprocess.TimeoutExpired:
            outcome.problems.append(f"no exit {settings.exit_seconds:g} s after the signal")
        outcome.seconds_to_exit = round(time.monotonic() - signalled, 3)
        left = job_processes(token)
        while left and time.monotonic() < deadline:
            time.sleep(0.01)
            left = job_processes(token)
        outcome.seconds_to_all_ended = round(time.monotonic() - signalled, 3)
        if left:
            outcome.left_alive = command_lines(left)
            outcome.problems.append(f"{len(left)} process(es) of the launch alive {settings.exit_seconds:g} s after "
                                    "the signal (killed)")
    finally:
        seen = job_processes(token)
        kill_job(token)
        wait_reaped(seen, timeout=10.0)
        if process.poll() is None:
            process.kill()
        outcome.exit_code = process.wait() if outcome.exit_code is None else outcome.exit_code
    return None


def check_interrupted(outcome: Outcome, folder: Path, name: str, reference: dict[str, str]) -> None:
    """Exit status, the one line, no temporary, and every output left already the reference's."""
    status, line = EXPECTED[outcome.fault.signal]
    outcome.stderr = stderr_lines(folder, name)
    if outcome.exit_code != status:
        outcome.problems.append(f"exit status {outcome.exit_code}, expected {status}")
    if outcome.stderr != [line]:
        shown = " | ".join(outcome.stderr[-6:])
        outcome.problems.append(f"stderr has {len(outcome.stderr)} lines, expected the stop line alone: {shown}")
    outcome.temporaries = temporaries(folder)
    if outcome.temporaries:
        outcome.problems.append(f"temporaries left: {', '.join(outcome.temporaries[:5])}")
    kept = digests(folder, outcome.fault.stage)
    outcome.kept_outputs = len(kept)
    wrong = sorted(path for path, digest in kept.items() if reference.get(path) != digest)
    if wrong:
        outcome.problems.append(f"outputs left that are not the reference's: {', '.join(wrong[:5])}")


def finished_first(outcome: Outcome, folder: Path, name: str, reference: dict[str, str]) -> bool:
    """True when the launch had done its work as the signal went: every output complete and the reference's, exit
    status 0 or the signal's own (Python's finalization restores the default action) within half a second, and
    nothing on stderr. The moment came too late to interrupt it."""
    status = outcome.exit_code
    return (status in (0, -SIGNALS[outcome.fault.signal]) and outcome.seconds_to_exit < 0.5 and not outcome.problems
            and not stderr_lines(folder, name) and digests(folder, outcome.fault.stage) == reference)


def run_fault(fault: Fault, folder: Path, reference: dict[str, str], settings: Settings, index: int,
              redraw: Callable[[], float]) -> Outcome:
    """One fault: the stage's outputs removed, the interrupted launch (drawn again while it ends before its moment
    or as the signal goes), its checks, then the launch run again to its end and compared with the reference."""
    outcome = Outcome(fault)
    name = f"{fault.stage}_{index:03d}"
    while True:
        for top in stage_outputs(folder, fault.stage):  # the campaign's own outputs of the previous fault
            shutil.rmtree(top)
        outcome.exit_code, outcome.problems = None, []
        missed = interrupt(fault, folder, name, settings, outcome)
        if missed == ENDED:
            outcome.draws += 1
        elif missed == IN_PYTHON_START_UP:
            outcome.in_python_start_up += 1
        elif finished_first(outcome, folder, name, reference):
            outcome.came_at_the_exit.append(outcome.exit_code)
        else:
            break
        if outcome.draws + outcome.in_python_start_up + len(outcome.came_at_the_exit) >= 10:
            outcome.problems.append("no moment of 10 draws came while bertPrep ran")
            return outcome
        fault.delay = redraw()
    check_interrupted(outcome, folder, name, reference)
    seconds, code, err = run_to_end(command(fault.stage, settings), folder, f"{name}_rerun", settings)
    outcome.rerun_seconds = round(seconds, 2)
    if code != 0 or err:
        outcome.problems.append(f"the rerun: exit status {code}, stderr {' | '.join(err[-4:])}")
    found = digests(folder, fault.stage)
    if found != reference:
        differ = sorted(path for path in set(found) | set(reference) if found.get(path) != reference.get(path))
        outcome.problems.append(f"after the rerun, not the reference's bytes: {', '.join(differ[:5])}")
    if temporaries(folder):
        outcome.problems.append(f"temporaries after the rerun: {', '.join(temporaries(folder)[:5])}")
    return outcome


def describe(index: int, outcome: Outcome) -> str:
    fault = outcome.fault
    trouble = f"  PROBLEM: {'; '.join(outcome.problems)}" if outcome.problems else ""
    late = outcome.draws + outcome.in_python_start_up + len(outcome.came_at_the_exit)
    redrawn = f" ({late} redrawn)" if late else ""
    return (f"{index:3} {fault.stage:17} {fault.signal:7} to {fault.target:6} at {fault.delay:5.2f} s{redrawn}: "
            f"{outcome.workers_at_signal} workers, exit {outcome.exit_code} in {outcome.seconds_to_exit:.2f} s, "
            f"all ended in {outcome.seconds_to_all_ended:.2f} s, {len(outcome.stderr)} stderr line(s), "
            f"{outcome.kept_outputs} outputs kept, rerun {outcome.rerun_seconds:.1f} s{trouble}")


# --- The campaign ------------------------------------------------------------------------------------------------
@dataclass
class Campaign:
    seed: int
    faults_asked: int  # per signal and stage
    settings: Settings
    reference_seconds: dict[str, float]  # each action's uninterrupted launch
    outcomes: list[Outcome]
    seconds: float
    problems: list[str]  # of the campaign as a whole (the faulted folder's sharding)

    @property
    def ok(self) -> bool:
        return not self.problems and not any(outcome.problems for outcome in self.outcomes)


def plan(rng: random.Random, faults: int, durations: dict[str, float]) -> list[Fault]:
    """For each stage, `faults` SIGINTs and `faults` SIGTERMs at uniform moments of its reference launch, half to
    the process group and half to bertPrep alone, in a random order."""
    schedule = []
    for stage in STAGES:
        drawn = [Fault(stage, name, TARGETS[(index + order) % 2], round(rng.uniform(0.0, durations[stage]), 3))
                 for order, name in enumerate(SIGNALS) for index in range(faults)]
        rng.shuffle(drawn)
        schedule += drawn
    return schedule


def reference_run(folder: Path, settings: Settings) -> dict[str, float]:
    """The uninterrupted chain in the reference folder: each action's seconds."""
    seconds = {}
    for action in ("text_formatting", "sharding", "create_hdf5_files"):
        took, code, err = run_to_end(command(action, settings), folder, f"reference_{action}", settings)
        if code != 0 or err:
            raise RuntimeError(f"the reference {action} failed (exit status {code}): {' | '.join(err[-4:])}")
        seconds[action] = round(took, 2)
    return seconds


def shard_the_faulted_folder(folder: Path, reference: Path, settings: Settings) -> list[str]:
    """Sharding, once and without faults, in the faulted folder (create_hdf5_files reads its text shards); the
    problems: a failure, or text shards that are not the reference's."""
    _, code, err = run_to_end(command("sharding", settings), folder, "faulted_sharding", settings)
    if code != 0 or err:
        return [f"sharding the faulted folder: exit status {code}, stderr {' | '.join(err[-4:])}"]

    def shards(root: Path) -> dict[str, str]:
        return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(root.glob("sharded_*/**/*.txt"))}
    same = shards(folder) == shards(reference)
    return [] if same else ["the faulted folder's text shards differ from the reference's"]


def run_campaign(root: Path, faults: int = 20, seed: int = 0, settings: Optional[Settings] = None,
                 say: Callable[[str], None] = lambda text: None) -> Campaign:
    """The reference chain, then each stage's faults in the faulted folder (sharding between them, unfaulted)."""
    settings = settings or Settings()
    if faults < 1:
        raise ValueError("a campaign needs at least one fault per signal and stage")
    downloads = make_corpus(root / "inputs", settings.copies)
    reference, faulted = (working_folder(root, name, downloads) for name in ("reference", "faulted"))
    durations = reference_run(reference, settings)
    say(f"reference: {', '.join(f'{action} {took:.1f} s' for action, took in durations.items())}; seed {seed}")
    wanted = {stage: digests(reference, stage) for stage in STAGES}
    rng = random.Random(seed)
    schedule = plan(rng, faults, durations)
    outcomes: list[Outcome] = []
    problems: list[str] = []
    began = time.monotonic()
    for stage in STAGES:
        if stage == "create_hdf5_files":
            problems += shard_the_faulted_folder(faulted, reference, settings)
        for fault in (fault for fault in schedule if fault.stage == stage):
            outcome = run_fault(fault, faulted, wanted[stage], settings, len(outcomes) + 1,
                                lambda stage=stage: round(rng.uniform(0.0, durations[stage]), 3))
            outcomes.append(outcome)
            say(describe(len(outcomes), outcome))
    return Campaign(seed, faults, settings, durations, outcomes, round(time.monotonic() - began, 1), problems)


# --- Report ------------------------------------------------------------------------------------------------------
def stage_summary(outcomes: list[Outcome]) -> dict[str, Any]:
    exits = sorted(outcome.seconds_to_exit for outcome in outcomes)
    return {
        "faults": len(outcomes),
        "passed": sum(not outcome.problems for outcome in outcomes),
        "by_signal_and_target": dict(Counter(f"{o.fault.signal} to {o.fault.target}" for o in outcomes)),
        "landed": dict(Counter(outcome.landed for outcome in outcomes)),
        "exit_codes": {name: dict(Counter(str(o.exit_code) for o in outcomes if o.fault.signal == name))
                       for name in SIGNALS},
        "seconds_to_exit_median": exits[len(exits) // 2] if exits else None,
        "seconds_to_exit_max": exits[-1] if exits else None,
        "seconds_to_all_ended_max": max((o.seconds_to_all_ended for o in outcomes), default=None),
        "one_stop_line": sum(o.stderr == [EXPECTED[o.fault.signal][1]] for o in outcomes),
        "processes_left": sum(len(o.left_alive) for o in outcomes),
        "temporaries_left": sum(len(o.temporaries) for o in outcomes),
        "launches_that_kept_outputs": sum(o.kept_outputs > 0 for o in outcomes),
        "redrawn": sum(o.draws for o in outcomes),
        "in_python_start_up": sum(o.in_python_start_up for o in outcomes),
        "came_at_the_exit": dict(Counter(str(code) for o in outcomes for code in o.came_at_the_exit)),
        "rerun_identical": sum(not any("bytes" in p for p in o.problems) and o.rerun_seconds > 0 for o in outcomes),
        "problems": [f"{o.fault.signal} to {o.fault.target} at {o.fault.delay} s: {p}" for o in outcomes
                     for p in o.problems],
    }


def summary(campaign: Campaign) -> dict[str, Any]:
    return {"stages": {stage: stage_summary([o for o in campaign.outcomes if o.fault.stage == stage])
                       for stage in STAGES},
            "ok": campaign.ok, "problems": campaign.problems, "reference_seconds": campaign.reference_seconds,
            "faulted_seconds": campaign.seconds, "seed": campaign.seed, "faults_per_signal": campaign.faults_asked,
            "settings": asdict(campaign.settings)}


def table(campaign: Campaign) -> str:
    rows = []
    for stage, s in summary(campaign)["stages"].items():
        codes = "; ".join(f"{name}: " + ", ".join(f"{code} x{n}" for code, n in sorted(counts.items()))
                          for name, counts in s["exit_codes"].items() if counts)
        rows += [(stage, f"{s['passed']} of {s['faults']} faults passed every check"),
                 ("  sent", ", ".join(f"{k} {v}" for k, v in sorted(s["by_signal_and_target"].items()))),
                 ("  landed", ", ".join(f"{k} {v}" for k, v in sorted(s["landed"].items()))
                  + f"; redrawn: {s['in_python_start_up']} in Python's start-up, {s['redrawn']} after the launch "
                  + "had ended, "
                  + (", ".join(f"exit {code} x{n}" for code, n in sorted(s["came_at_the_exit"].items())) or "none")
                  + " as it exited with its work done"),
                 ("  exit status", codes),
                 ("  exit after the signal", f"median {s['seconds_to_exit_median']:.2f} s, longest "
                                             f"{s['seconds_to_exit_max']:.2f} s; every process ended within "
                                             f"{s['seconds_to_all_ended_max']:.2f} s"),
                 ("  stderr", f"the stop line alone {s['one_stop_line']} of {s['faults']}"),
                 ("  left behind", f"{s['processes_left']} processes, {s['temporaries_left']} temporaries; "
                                   f"{s['launches_that_kept_outputs']} launches kept complete outputs"),
                 ("  rerun", f"{s['rerun_identical']} of {s['faults']} byte for byte the reference's"),
                 ("  problems", "; ".join(s["problems"][:10]) or "none")]
    rows += [("reference", ", ".join(f"{k} {v} s" for k, v in campaign.reference_seconds.items())),
             ("campaign", f"{campaign.seconds} s; problems: {'; '.join(campaign.problems) or 'none'}"),
             ("replay", f"--faults {campaign.faults_asked} --seed {campaign.seed} --copies {campaign.settings.copies}")]
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows)


def host_facts() -> dict[str, Any]:
    host = detect("cpu")
    return {"cpu": host.device, "logical_cpus": os.cpu_count(), "torch": host.torch,
            "python": sys.version.split()[0], "date": time.strftime("%Y-%m-%d")}


def arguments(argv: Optional[list[str]] = None) -> argparse.Namespace:
    parser = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--faults", type=int, default=20, help="SIGINTs, and as many SIGTERMs, in each stage")
    parser.add_argument("--seed", type=int, default=0, help="seed of the schedule (random.Random)")
    parser.add_argument("--copies", type=int, default=Settings.copies,
                        help="copies of the Wikipedia excerpt in the corpus (formatting tasks)")
    parser.add_argument("--output_dir", type=Path, help="work folder (default: a temporary one, removed after)")
    parser.add_argument("--json", type=Path, default=REPO / "benchmarks" / "results" / "data_prep_faults" /
                        "campaign.json", help="where the summary and every fault go (default: %(default)s)")
    args = parser.parse_args(argv)
    if args.faults < 1 or args.copies < 2:
        raise InputError(f"--faults {args.faults} --copies {args.copies}: need at least 1 fault and 2 copies (one "
                         "task a worker); pass larger ones")
    if args.output_dir is not None and args.output_dir.exists() and any(args.output_dir.iterdir()):
        raise InputError(f"--output_dir {args.output_dir}: not empty; choose a new or empty folder")
    return args


def main(argv: Optional[list[str]] = None) -> int:
    args = arguments(argv)
    # Started in the background by a shell without job control, this process ignores SIGINT, and its launches
    # would inherit that and shrug off the SIGINT faults: a Python handler is reset to the default at exec.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    temporary = None if args.output_dir else tempfile.mkdtemp(prefix="data_prep_faults_")
    root = args.output_dir or Path(temporary)
    try:
        campaign = run_campaign(root, args.faults, args.seed, Settings(copies=args.copies),
                                say=lambda text: print(text, flush=True))
        print()
        print(table(campaign))
        facts = host_facts()
        print(f"host: {facts['cpu']}, {facts['logical_cpus']} logical CPUs, Python {facts['python']}, torch "
              f"{facts['torch']}, {facts['date']}")
        write_json(args.json, {"summary": summary(campaign), "host": facts,
                               "faults": [{**asdict(o), "landed": o.landed} for o in campaign.outcomes]})
        return 0 if campaign.ok else 1
    finally:
        if temporary:
            shutil.rmtree(temporary, ignore_errors=True)


if __name__ == "__main__":
    run_cli(lambda: sys.exit(main()))  # a refused flag is one line, exit 2
