"""Ctrl-C and SIGTERM to data preparation on worker processes (issue 48, "Nothing lost, round four"): bertPrep.py
--n_processes 2 used to print dozens of `Process SpawnPoolWorker-N ... KeyboardInterrupt` tracebacks and hang, and
a SIGTERM printed its line and hung until SIGKILL. Now a signal to the process group (a terminal's Ctrl-C, Slurm)
or to bertPrep alone (kill PID) ends it within seconds, in the one stop line, with no worker left and nothing
half-written; a worker that dies in its task is one line, not a hang."""
import hashlib
import multiprocessing
import os
import shutil
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Callable

import pytest

from benchmarks import data_prep_faults as dpf
from benchmarks.fault_injection import job_processes, kill_job
from bertrecipe.dataprep import engine, vocab_training

SETTINGS = dpf.Settings(copies=120)


@pytest.fixture(scope="module")
def downloads(tmp_path_factory) -> Path:
    return dpf.make_corpus(tmp_path_factory.mktemp("wiki"), SETTINGS.copies)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory, downloads) -> Path:
    """A working folder with the corpus formatted and sharded, ready for create_hdf5_files."""
    folder = dpf.working_folder(tmp_path_factory.mktemp("sharded"), "work", downloads)
    for action in ("text_formatting", "sharding"):
        _, code, err = dpf.run_to_end(dpf.command(action, SETTINGS), folder, action, SETTINGS)
        assert code == 0 and not err, err
    return folder


def _launch_and_signal(stage: str, folder: Path, ready: Callable[[], bool], send: Callable[[int], None]
                       ) -> tuple[int, float, list[str], list[str]]:
    """Starts the stage, waits until ready() (the workers are inside their tasks), sends the signal; (exit status,
    seconds from the signal to the exit, stderr lines, processes of the launch alive 5 s after the signal)."""
    token = uuid.uuid4().hex
    process = dpf.start(dpf.command(stage, SETTINGS), folder, token, "launch")
    try:
        deadline = time.monotonic() + 120
        while not (dpf.spawn_workers(token) == 2 and ready()):
            assert process.poll() is None and time.monotonic() < deadline, dpf.stderr_lines(folder, "launch")
            time.sleep(0.005)
        signalled = time.monotonic()
        send(process.pid)
        try:
            code = process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            code = None
        seconds = time.monotonic() - signalled
        left = job_processes(token)
        while left and time.monotonic() < signalled + 5:
            time.sleep(0.01)
            left = job_processes(token)
        return code, seconds, dpf.stderr_lines(folder, "launch"), dpf.command_lines(left)
    finally:
        kill_job(token)
        process.kill()
        process.wait()


def _formatting_parts(folder: Path) -> bool:
    return any((folder / "formatted_one_article_per_line").glob(".*.parts.*.tmp/part-*"))


def _shard_temporaries(folder: Path) -> list[Path]:
    return list(folder.glob("hdf5_*/*/*/.*.hdf5.*.tmp"))


def test_ctrl_c_to_the_process_group_while_workers_format_is_one_line_and_leaves_nothing(downloads, tmp_path):
    folder = dpf.working_folder(tmp_path, "work", downloads)
    code, seconds, stderr, left = _launch_and_signal("text_formatting", folder, lambda: _formatting_parts(folder),
                                                     lambda pid: os.killpg(pid, signal.SIGINT))
    assert (code, stderr) == (130, [dpf.EXPECTED["SIGINT"][1]]), stderr
    assert seconds < 5 and left == []
    assert dpf.temporaries(folder) == [] and dpf.digests(folder, "text_formatting") == {}


@pytest.mark.slow
def test_sigterm_to_bertprep_alone_while_workers_write_shards_is_one_line_and_leaves_nothing(sharded, tmp_path):
    folder = tmp_path / "work"
    shutil.copytree(sharded, folder, symlinks=True)
    complete = {}  # shards renamed into place before the signal stay, whole

    def writing() -> bool:
        complete.update(dpf.digests(folder, "create_hdf5_files"))
        return bool(_shard_temporaries(folder))
    code, seconds, stderr, left = _launch_and_signal("create_hdf5_files", folder, writing,
                                                     lambda pid: os.kill(pid, signal.SIGTERM))
    assert (code, stderr) == (143, [dpf.EXPECTED["SIGTERM"][1]]), stderr
    assert seconds < 5 and left == []
    assert dpf.temporaries(folder) == []
    kept = dpf.digests(folder, "create_hdf5_files")
    assert len(kept) < SETTINGS.training_shards + SETTINGS.test_shards and set(complete) <= set(kept)


@pytest.mark.slow
def test_a_worker_killed_inside_its_task_is_one_line_naming_it_not_a_hang(sharded, tmp_path):
    folder = tmp_path / "work"
    shutil.copytree(sharded, folder, symlinks=True)
    victim = []

    def kill_a_worker(pid: int) -> None:
        name = _shard_temporaries(folder)[0].name  # `.<shard>.<pid of its writer>.<random>.tmp`
        victim.append(int(name.split(".")[-3]))
        os.kill(victim[0], signal.SIGKILL)
    code, seconds, stderr, left = _launch_and_signal("create_hdf5_files", folder,
                                                     lambda: bool(_shard_temporaries(folder)), kill_a_worker)
    assert code == 2 and len(stderr) == 1, stderr
    assert stderr[0].startswith(f"error: --n_processes: worker process {victim[0]} was killed by SIGKILL before "
                                "finishing its task"), stderr
    assert seconds < 5 and left == []
    # Only the killed worker's temporary is left (the next run removes it); the other worker's was discarded.
    assert all(f".{victim[0]}." in name for name in dpf.temporaries(folder)), dpf.temporaries(folder)


def test_closing_in_order_early_stops_the_running_tasks_instead_of_waiting_for_them():
    """A consumer that fails (or a signal) closes in_order: the tasks still running are stopped, not awaited."""
    with engine.open_runner(engine.EngineConfig("local", n_processes=2)) as run:
        results = engine.in_order(run, time.sleep, [(0.0,), (30.0,), (30.0,)])
        assert next(results) is None
        began = time.monotonic()
        results.close()
        assert time.monotonic() - began < 5
    assert multiprocessing.active_children() == []


def test_vocab_training_ends_at_a_signal_without_waiting_for_the_trainer(tmp_path, monkeypatch):
    """tokenizers' trainer runs in Rust without returning to Python, minutes on a real corpus: a Ctrl-C waited for
    its end. A C call that holds no lock and checks no signal (PBKDF2, ~8 s here) stands in for it."""
    corpus = tmp_path / "text.txt"
    corpus.write_text("some words for a vocab\n\nand a few more words\n", encoding="utf-8")

    def slow_training(self, *args, **kwargs) -> None:
        hashlib.pbkdf2_hmac("sha256", b"word", b"piece", 13_000_000)
    monkeypatch.setattr(vocab_training.BertWordPieceTokenizer, "train", slow_training)

    class Stopped(Exception):
        pass

    def stop(signum, frame):
        raise Stopped()
    previous = signal.signal(signal.SIGALRM, stop)
    began = time.monotonic()
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.5)
        with pytest.raises(Stopped):
            vocab_training.train_vocab([corpus], tmp_path / "vocab.txt", 200, True)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert time.monotonic() - began < 2.5
    assert sorted(p.name for p in tmp_path.iterdir()) == ["text.txt"]
