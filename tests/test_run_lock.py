"""One run per output folder (issue 32, item 1): run_lock.RunLock refuses a second run naming the holder, takes
over the lock of a process that is gone (same host: dead pid; another host: heartbeat older than the lease; a
Slurm requeue), lets exactly one of several rivals take over a stale lock, and is released at exit. Round three,
case 9: a lock copied with its folder (cp -r) holds nothing in the copy; a lock file is never seen half-written,
and an empty or garbage one is taken over."""
import errno
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import pytest

from bertrecipe.common.errors import InputError
from bertrecipe.training import run_lock
from bertrecipe.training.run_lock import LOCK_NAME, LockHolder, RunLock, read_holder
from helpers import HOLDER, start_holder


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


def write_unreadable_lock(folder, content, age_seconds):
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    path.write_bytes(content)
    then = time.time() - age_seconds
    os.utime(path, (then, then))
    return path


@pytest.mark.parametrize("stale_lock", ["another host's, past the lease", "empty"])
def test_of_many_rivals_for_a_stale_lock_exactly_one_takes_it(tmp_path, stale_lock):
    if stale_lock == "empty":
        write_unreadable_lock(tmp_path / "out", b"", age_seconds=60)
    else:
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


def test_a_copy_of_a_live_runs_folder_is_not_locked_by_that_run(tmp_path, capsys):
    """cp -r of a live run's folder, to branch from its checkpoints: the copied lock is the original folder's, so
    a run on the copy takes it over, while the original (renamed or not) stays locked."""
    original = tmp_path / "out"
    holder, said = start_holder(original)
    assert said == "held"
    try:
        (original / "ckpt_8.pt").write_bytes(b"weights")
        shutil.copytree(original, tmp_path / "branch")
        with RunLock(tmp_path / "branch") as lock:
            assert lock.still_held()
            assert read_holder(original / LOCK_NAME).pid == holder.pid  # the original's lock untouched
        warning = capsys.readouterr().err
        assert f"{tmp_path / 'branch' / LOCK_NAME}: took over the lock of host {socket.gethostname()}, process " \
               f"{holder.pid}" in warning
        assert f"copied from {os.path.realpath(original)}, which that process writes" in warning
        with pytest.raises(InputError, match=f"another run is using this --output_dir .*process {holder.pid}"):
            RunLock(original).acquire()
        os.rename(original, tmp_path / "moved")  # the same inode: still the live run's folder
        with pytest.raises(InputError, match=f"process {holder.pid}"):
            RunLock(tmp_path / "moved").acquire()
        # One folder through two mounts of a network file system: another st_dev, the same st_ino: still held.
        path = tmp_path / "moved" / LOCK_NAME
        recorded = json.loads(path.read_text())
        path.write_text(json.dumps({**recorded, "folder_dev": recorded["folder_dev"] + 1}))
        with pytest.raises(InputError, match=f"process {holder.pid}"):
            RunLock(tmp_path / "moved").acquire()
        # A lock of an older version (no folder in it) keeps the rules it had: its live holder keeps the copy out.
        shutil.copytree(tmp_path / "moved", tmp_path / "old_copy")
        old = {name: value for name, value in recorded.items() if not name.startswith("folder_")}
        (tmp_path / "old_copy" / LOCK_NAME).write_text(json.dumps(old))
        with pytest.raises(InputError, match=f"process {holder.pid}"):
            RunLock(tmp_path / "old_copy").acquire()
    finally:
        holder.communicate("", timeout=30)
    assert holder.returncode == 0


def test_another_hosts_lock_for_another_folder_is_kept_within_the_lease(tmp_path, capsys, monkeypatch):
    """Across NFS clients st_dev differs for one folder, and inode numbers of another host are not ours to compare:
    a live remote lock is never taken over for its recorded folder, only after the lease; the refusal says what to
    do with a copy."""
    monkeypatch.setenv("BERT_RUN_LOCK_LEASE_SECONDS", "600")
    here = os.stat(tmp_path)
    this_folder_seen_elsewhere = {"folder_dev": here.st_dev + 1, "folder_ino": here.st_ino,
                                  "folder_path": os.path.realpath(tmp_path)}
    another_folder = {"folder_dev": here.st_dev, "folder_ino": here.st_ino + 1, "folder_path": "/shared/runs/orig"}
    write_foreign_lock(tmp_path, age_seconds=60, **this_folder_seen_elsewhere)
    with pytest.raises(InputError, match="host node-elsewhere, process 4242") as refused:
        RunLock(tmp_path).acquire()
    assert "copy" not in str(refused.value)
    write_foreign_lock(tmp_path, age_seconds=60, **another_folder)
    with pytest.raises(InputError, match="host node-elsewhere, process 4242") as refused:
        RunLock(tmp_path).acquire()
    assert (f"the lock was taken for /shared/runs/orig: if this folder is a copy of that one, delete "
            f"{tmp_path / LOCK_NAME}; wait for it to end") in str(refused.value)
    write_foreign_lock(tmp_path, age_seconds=601, **another_folder)
    with RunLock(tmp_path):
        pass
    assert "its heartbeat is 10 minutes old" in capsys.readouterr().err


@pytest.mark.parametrize("content", [b"", b"\x00\x00\x00\x00", b'{"host": "node-elsewhere", "pi', b'["not", "a lock"]'],
                         ids=["empty", "zeros", "cut short", "not a lock object"])
def test_an_empty_or_garbage_lock_file_is_taken_over_at_once(tmp_path, capsys, content):
    """A crash between create and write, a disk that filled, a user's touch: no lock in the making, since ours is
    never seen half-written."""
    path = write_unreadable_lock(tmp_path, content, age_seconds=30)
    with RunLock(tmp_path) as lock:
        assert read_holder(path).token == lock.holder.token
    said = "empty" if not content else f"{len(content)} bytes that are not a run lock"
    warning = capsys.readouterr().err
    assert f"warning: {path}: took over a lock file that held no lock: it was {said}, and 30 s old" in warning
    assert sorted(os.listdir(tmp_path)) == []


def test_a_lock_file_that_is_a_folder_is_one_line(tmp_path):
    (tmp_path / LOCK_NAME).mkdir()
    os.utime(tmp_path / LOCK_NAME, (time.time() - 3600,) * 2)
    with pytest.raises(InputError, match=f"{tmp_path / LOCK_NAME}: is not a lock file but a folder or a link; move"):
        RunLock(tmp_path).acquire()
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]


class SteppedClock:
    """The run lock's clock, moved only by its own sleeps (no real waiting): time() and monotonic() start at the
    real time, and what a test scheduled for a moment happens when a sleep passes it."""

    def __init__(self) -> None:
        self.now = time.time()
        self.events: list[tuple[float, Callable[[], object]]] = []

    def at(self, seconds_from_now: float, event: Callable[[], object]) -> None:
        self.events.append((self.now + seconds_from_now, event))

    def time(self) -> float:
        return self.now

    monotonic = time

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        due = [event for when, event in self.events if when <= self.now]
        self.events = [(when, event) for when, event in self.events if when > self.now]
        for event in due:
            event()


def test_a_fresh_unreadable_lock_gets_a_grace_to_be_written_then_is_taken_over(tmp_path, capsys, monkeypatch):
    """An older version (or the O_EXCL fallback) creates the file, then writes it: a lock seen empty may be
    finished a moment later, which is then respected; one that stays empty is taken over after the grace
    (UNREADABLE_GRACE_SECONDS of a clock the test moves)."""
    clock = SteppedClock()
    monkeypatch.setattr(run_lock, "time", clock)
    path = write_unreadable_lock(tmp_path, b"", age_seconds=0)
    clock.at(0.3, lambda: write_foreign_lock(tmp_path, 0))
    with pytest.raises(InputError, match="another run is using this --output_dir .*host node-elsewhere"):
        RunLock(tmp_path).acquire()
    assert clock.events == []  # it looked again after the lock was written, and respected it
    path = write_unreadable_lock(tmp_path, b"", age_seconds=0)
    clock.now = empty_since = path.stat().st_mtime
    with RunLock(tmp_path):
        pass
    assert f"warning: {path}: took over a lock file that held no lock: it was empty" in capsys.readouterr().err
    # Taken over once the grace had passed on the lock's clock, not before; no real second was waited.
    assert run_lock.UNREADABLE_GRACE_SECONDS < clock.now - empty_since <= run_lock.UNREADABLE_GRACE_SECONDS + 0.5


def test_the_lock_file_is_never_seen_half_written(tmp_path, monkeypatch):
    """While its content is written and synced, the lock's name does not exist yet: it appears whole (hard link)."""
    lock_path = tmp_path / LOCK_NAME
    seen_while_syncing = []
    real_fsync = os.fsync

    def fsync_and_look(fd):
        seen_while_syncing.append(lock_path.exists())
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync_and_look)
    with RunLock(tmp_path) as lock:
        assert seen_while_syncing == [False]
        assert read_holder(lock_path).token == lock.holder.token
        assert os.stat(lock_path).st_nlink == 1
        assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]  # no temporary left


@pytest.mark.parametrize("refusal", [errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS], ids=errno.errorcode.get)
def test_without_hard_links_the_lock_is_created_in_place(tmp_path, monkeypatch, refusal):
    links = []

    def no_hard_links(source, target):
        links.append(target)
        raise OSError(refusal, os.strerror(refusal))

    monkeypatch.setattr(os, "link", no_hard_links)
    with RunLock(tmp_path) as lock:
        assert links == [tmp_path / LOCK_NAME]  # tried first
        assert read_holder(tmp_path / LOCK_NAME).token == lock.holder.token
        assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]
        with pytest.raises(InputError, match=f"another run is using this --output_dir .*process {os.getpid()}"):
            RunLock(tmp_path).acquire()


def test_a_link_whose_reply_was_lost_still_holds_the_lock(tmp_path, monkeypatch):
    """NFS may answer a retransmitted link() that succeeded with EEXIST; the temporary's link count (2) says it
    did (open(2))."""
    real_link = os.link
    links = []

    def link_then_lose_the_reply(source, target):
        links.append(target)
        real_link(source, target)
        raise FileExistsError(errno.EEXIST, "File exists")

    monkeypatch.setattr(os, "link", link_then_lose_the_reply)
    with RunLock(tmp_path) as lock:
        assert links == [tmp_path / LOCK_NAME]
        assert lock.still_held()
    assert sorted(os.listdir(tmp_path)) == []


@pytest.mark.parametrize("hard_links", [True, False])
def test_a_full_disk_while_writing_the_lock_is_one_line_and_leaves_nothing(tmp_path, monkeypatch, hard_links):
    def disk_full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    if not hard_links:
        monkeypatch.setattr(os, "link", lambda source, target: (_ for _ in ()).throw(OSError(errno.EPERM, "no")))
    with pytest.raises(InputError, match=rf"{tmp_path / LOCK_NAME}: cannot write the run lock \(No space left on "
                                         r"device\); make the folder writable and free space on its disk, or choose"):
        RunLock(tmp_path).acquire()
    assert sorted(os.listdir(tmp_path)) == []
