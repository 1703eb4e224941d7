"""One run per output folder (issue 32, item 1): run_lock.RunLock refuses a second run naming the holder, takes
over the lock of a process that is gone (same host: dead pid; another host: heartbeat older than the lease; a
Slurm requeue), lets exactly one of several rivals take over a stale lock, and is released at exit."""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bertrecipe.common.errors import InputError
from bertrecipe.training.run_lock import LOCK_NAME, LockHolder, RunLock, read_holder

# A process that takes the lock and holds it until killed or until its stdin closes.
HOLDER = """
import sys
from bertrecipe.common.errors import InputError
from bertrecipe.training.run_lock import RunLock
lock = RunLock(sys.argv[1])
try:
    lock.acquire()
except InputError as error:
    print("refused", error, flush=True)
    sys.exit(2)
print("held", flush=True)
sys.stdin.read()
lock.release()
"""


def start_holder(folder, env=None):
    process = subprocess.Popen([sys.executable, "-c", HOLDER, str(folder)], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    return process, process.stdout.readline().strip()


def write_foreign_lock(folder, age_seconds, **fields):
    """A lock file as a run on another host would have written it, its heartbeat age_seconds old."""
    folder.mkdir(parents=True, exist_ok=True)
    holder = {"host": "node-elsewhere", "pid": 4242, "started": "2026-11-25T01:02:03+00:00", "token": "f" * 16,
              **fields}
    path = folder / LOCK_NAME
    path.write_text(json.dumps(holder))
    then = time.time() - age_seconds
    os.utime(path, (then, then))
    return path


def test_a_second_run_is_refused_naming_the_holder_and_the_lock_is_released_at_exit(tmp_path):
    holder, said = start_holder(tmp_path / "out")
    assert said == "held"
    try:
        with pytest.raises(InputError) as refused:
            RunLock(tmp_path / "out").acquire()
        message = str(refused.value)
        assert f"host {socket.gethostname()}, process {holder.pid}" in message and "started 20" in message
        assert "another run is using this --output_dir" in message
    finally:
        holder.communicate("", timeout=30)
    assert holder.returncode == 0
    assert not (tmp_path / "out" / LOCK_NAME).exists()  # released at exit
    with RunLock(tmp_path / "out") as lock:  # free again
        assert lock.still_held()


def test_the_lock_of_a_killed_process_on_this_host_is_taken_over_with_a_warning(tmp_path, capsys):
    holder, said = start_holder(tmp_path / "out")
    assert said == "held"
    holder.kill()  # SIGKILL: no chance to release
    holder.wait(timeout=30)
    assert read_holder(tmp_path / "out" / LOCK_NAME).pid == holder.pid
    with RunLock(tmp_path / "out") as lock:
        assert lock.still_held()
    warning = capsys.readouterr().err
    assert f"took over the lock of host {socket.gethostname()}, process {holder.pid}" in warning
    assert f"its process {holder.pid} on this host has ended" in warning


def test_a_reused_pid_does_not_keep_a_dead_runs_lock(tmp_path, capsys):
    """The pid is alive (ours) but belongs to another process than the one that took the lock."""
    me = LockHolder.of_this_process()
    fields = {**me.__dict__, "token": "0" * 16, "process_start": "1"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(fields))
    with RunLock(tmp_path):
        pass
    assert "has ended" in capsys.readouterr().err


def test_another_hosts_lock_is_kept_within_the_lease_and_taken_over_after_it(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BERT_RUN_LOCK_LEASE_SECONDS", "600")
    write_foreign_lock(tmp_path, age_seconds=60)
    with pytest.raises(InputError, match="host node-elsewhere, process 4242"):
        RunLock(tmp_path).acquire()
    write_foreign_lock(tmp_path, age_seconds=601)
    with RunLock(tmp_path) as lock:
        assert read_holder(lock.path).host == socket.gethostname()
    assert "its heartbeat is 10 minutes old (lease 10 minutes)" in capsys.readouterr().err


def test_a_slurm_requeue_takes_over_its_own_jobs_lock_at_once(tmp_path, capsys, monkeypatch):
    write_foreign_lock(tmp_path, age_seconds=5, slurm_job="7701", slurm_restart=0)
    monkeypatch.setenv("SLURM_JOB_ID", "7702")  # another job: refused
    with pytest.raises(InputError, match="Slurm job 7701"):
        RunLock(tmp_path).acquire()
    monkeypatch.setenv("SLURM_JOB_ID", "7701")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    with RunLock(tmp_path):
        pass
    assert "Slurm requeued job 7701 (restart 0 -> 1)" in capsys.readouterr().err


def test_of_many_rivals_for_a_stale_lock_exactly_one_takes_it(tmp_path):
    write_foreign_lock(tmp_path / "out", age_seconds=3600)
    rivals = [subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "out")], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(6)]
    try:
        deadline = time.time() + 60
        while sum(r.poll() is not None for r in rivals) < 5 and time.time() < deadline:
            time.sleep(0.1)
        finished = [r for r in rivals if r.poll() is not None]
        assert len(finished) == 5, "every rival but the holder must have been refused"
        assert all(r.returncode == 2 and r.stdout.read().startswith("refused") for r in finished)
        (winner,) = [r for r in rivals if r.poll() is None]
        assert read_holder(tmp_path / "out" / LOCK_NAME).pid == winner.pid
    finally:
        for rival in rivals:
            if rival.poll() is None:
                rival.communicate("", timeout=30)


def test_a_lock_taken_over_by_another_run_is_no_longer_held(tmp_path):
    lock = RunLock(tmp_path)
    lock.acquire()
    try:
        assert lock.still_held()
        write_foreign_lock(tmp_path, age_seconds=0)
        assert not lock.still_held()
    finally:
        lock.release()
    assert (tmp_path / LOCK_NAME).exists()  # release never removes another run's lock


def test_sigterm_to_a_holder_still_lets_the_next_run_in(tmp_path):
    holder, said = start_holder(tmp_path / "out")
    assert said == "held"
    holder.send_signal(signal.SIGTERM)  # default action: dies without releasing
    holder.wait(timeout=30)
    with RunLock(tmp_path / "out") as lock:
        assert lock.still_held()


def test_a_take_over_replaces_only_the_stale_lock_it_judged(tmp_path):
    """Two runs judged the same lock stale; the first replaces it, the second must then find another token and
    leave the first's lock alone. A take-over under way elsewhere (its marker present) is waited for."""
    path = write_foreign_lock(tmp_path, age_seconds=3600)
    stale = read_holder(path)
    first, second = RunLock(tmp_path), RunLock(tmp_path)
    first_holder = LockHolder.of_this_process()
    second_holder = LockHolder(**{**first_holder.__dict__, "token": "1" * 16})
    assert first._take_over(stale, first_holder)
    assert not second._take_over(stale, second_holder)
    assert read_holder(path).token == first_holder.token
    (tmp_path / (LOCK_NAME + ".takeover")).write_text("")
    assert not second._take_over(read_holder(path), second_holder)
    assert read_holder(path).token == first_holder.token


def test_the_lock_of_an_ended_but_unreaped_process_is_taken_over(tmp_path, capsys):
    """A SIGKILLed job's workers linger as zombies until their parent reaps them (forever under a container's
    init that never does): they hold no lock."""
    child = subprocess.Popen(["sleep", "30"])
    start = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[19]
    os.kill(child.pid, signal.SIGKILL)
    deadline = time.time() + 10
    while Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z" and time.time() < deadline:
        time.sleep(0.01)
    try:
        me = LockHolder.of_this_process()
        (tmp_path / LOCK_NAME).write_text(json.dumps({**me.__dict__, "pid": child.pid, "process_start": start}))
        with RunLock(tmp_path):
            pass
        assert f"its process {child.pid} on this host has ended" in capsys.readouterr().err
    finally:
        child.wait()
