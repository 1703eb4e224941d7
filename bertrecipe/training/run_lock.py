"""One run per output folder: `<folder>/.run.lock`, taken before the run's first write into the folder, kept fresh
by a heartbeat while the run lives and removed when it ends (docs/reliability.md, "One run per folder").

The lock file holds who took it (host, pid, the process's start, pid namespace and boot, Slurm job and restart
count) and a random token. A second run finds it and is refused in one line naming the holder, unless the holder
is certainly gone:
- on the same host (same boot and pid namespace): its process no longer exists, or the pid now belongs to a later
  process (compared by start time);
- the same Slurm job with a higher restart count (a requeue: Slurm requeues only a job that has ended);
- anywhere else: its heartbeat (the file's mtime, refreshed every HEARTBEAT_SECONDS) is older than the lease
  (LEASE_SECONDS, default 10 minutes, `BERT_RUN_LOCK_LEASE_SECONDS` overrides).
A lock found stale is taken over with a warning. What it relies on from a shared file system (NFSv3+, Lustre,
GPFS, BeeGFS): `open(O_CREAT | O_EXCL)` and `rename` are atomic, and mtime is set by `utime`. Host clocks must
agree to well within the lease (NTP), since a heartbeat's age is read against the local clock.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Callable, Iterator, Optional

from bertrecipe.common.atomic_files import make_dirs, remove_empty_dirs
from bertrecipe.common.errors import InputError

LOCK_NAME = ".run.lock"
HEARTBEAT_SECONDS = 30.0
LEASE_SECONDS = 600.0
TAKEOVER_STALE_SECONDS = 60.0  # a take-over whose process died half-way leaves its marker this long at most


def lease_seconds() -> float:
    return float(os.environ.get("BERT_RUN_LOCK_LEASE_SECONDS", LEASE_SECONDS))


def _read_first_line(path: str) -> str:
    try:
        with open(path, encoding="ascii") as f:
            return f.readline().strip()
    except OSError:
        return ""


def process_start(pid: int) -> str:
    """The running process's start time in clock ticks since boot (/proc/<pid>/stat field 22): with the pid it
    names one process for the host's whole uptime, even once the pid is reused. Empty where /proc is missing and
    for a process that has ended but is not yet reaped (a zombie: state Z or X), which holds nothing any more."""
    stat = _read_first_line(f"/proc/{pid}/stat")
    fields = stat.rsplit(")", 1)[-1].split() if stat else []
    return fields[19] if fields and fields[0] not in ("Z", "X") else ""


def _pid_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


@dataclass(frozen=True)
class LockHolder:
    """Who holds a folder's lock, as written in the lock file."""

    host: str
    pid: int
    started: str  # ISO time the lock was taken
    token: str
    process_start: str = ""
    pid_namespace: str = ""
    boot_id: str = ""
    slurm_job: str = ""
    slurm_restart: int = 0

    @classmethod
    def of_this_process(cls) -> LockHolder:
        return cls(host=socket.gethostname(), pid=os.getpid(), started=datetime.now().astimezone().isoformat(
                   timespec="seconds"), token=secrets.token_hex(8), process_start=process_start(os.getpid()),
                   pid_namespace=_pid_namespace(), boot_id=_read_first_line("/proc/sys/kernel/random/boot_id"),
                   slurm_job=os.environ.get("SLURM_JOB_ID", ""),
                   slurm_restart=int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0))

    def describe(self) -> str:
        job = f", Slurm job {self.slurm_job}" if self.slurm_job else ""
        return f"host {self.host}, process {self.pid}{job}, started {self.started}"


def read_holder(path: Path) -> Optional[LockHolder]:
    """The lock file's holder; None when the file is gone or not (yet, or no longer) a lock we can read."""
    try:
        fields = json.loads(path.read_text(encoding="utf-8"))
        return LockHolder(**fields)
    except (OSError, ValueError, TypeError):
        return None


def why_stale(holder: Optional[LockHolder], age_seconds: float, me: LockHolder) -> Optional[str]:
    """Why the holder is certainly gone (the warning's words), or None while it may still be running; `me` is the
    process asking."""
    if holder is None:
        return "unreadable and not refreshed for the lease" if age_seconds > lease_seconds() else None
    if holder.slurm_job and holder.slurm_job == me.slurm_job and holder.slurm_restart < me.slurm_restart:
        return f"Slurm requeued job {holder.slurm_job} (restart {holder.slurm_restart} -> {me.slurm_restart})"
    same_machine = (holder.host, holder.boot_id, holder.pid_namespace) == (me.host, me.boot_id, me.pid_namespace)
    if same_machine:
        if holder.pid == me.pid and holder.process_start == me.process_start:
            return None  # this very process: never stale
        if not holder.process_start or process_start(holder.pid) != holder.process_start:
            return f"its process {holder.pid} on this host has ended"
        return None
    if holder.host == me.host and holder.boot_id and me.boot_id and holder.boot_id != me.boot_id:
        return "this host has rebooted since"
    if age_seconds > lease_seconds():
        return f"its heartbeat is {age_seconds / 60:.0f} minutes old (lease {lease_seconds() / 60:.0f} minutes)"
    return None


class RunLock:
    """`with RunLock(folder):` holds the folder's lock for the block (see the module). `acquire()` raises
    InputError naming the holder when another live run has it."""

    def __init__(self, folder: str | Path, flag: str = "--output_dir") -> None:
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.flag = flag
        self.holder: Optional[LockHolder] = None
        self._stop = threading.Event()
        self._heartbeat: Optional[threading.Thread] = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def acquire(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        me = LockHolder.of_this_process()
        for _ in range(3):  # a holder that leaves while we look, or a rival take-over, is looked at again
            if self._create(me):
                break
            holder, age = self._inspect()
            reason = why_stale(holder, age, me)
            if reason is None and holder is not None:
                raise InputError(f"{self.folder}: another run is using this {self.flag} ({holder.describe()}; lock "
                                 f"{self.path}); wait for it to end, or choose another {self.flag}")
            if reason is not None and self._take_over(holder, me):
                print(f"warning: {self.path}: took over the lock of {holder.describe() if holder else 'a run'}: "
                      f"{reason}", file=sys.stderr, flush=True)
                break
            time.sleep(0.2)
        else:
            raise InputError(f"{self.path}: could not take the run lock (it changed hands while we looked); "
                             "run again once the other run has started or ended")
        self.holder = me
        self._heartbeat = threading.Thread(target=self._beat, daemon=True, name="run-lock-heartbeat")
        self._heartbeat.start()

    def _create(self, me: LockHolder) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(json.dumps(asdict(me)))
            f.flush()
            os.fsync(f.fileno())
        return True

    def _inspect(self) -> tuple[Optional[LockHolder], float]:
        try:
            age = time.time() - self.path.stat().st_mtime
        except FileNotFoundError:
            return None, 0.0
        return read_holder(self.path), age

    def _take_over(self, stale: Optional[LockHolder], me: LockHolder) -> bool:
        """Replaces the stale lock by ours, one taker at a time: a marker file created with O_EXCL is the mutex,
        and the lock is replaced only if it still holds the stale token."""
        marker = self.path.with_name(LOCK_NAME + ".takeover")
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            try:
                if time.time() - marker.stat().st_mtime > TAKEOVER_STALE_SECONDS:
                    marker.unlink(missing_ok=True)  # its taker died half-way; the next round retries
            except FileNotFoundError:
                pass
            return False
        os.close(fd)
        try:
            current = read_holder(self.path)
            if self.path.exists() and (current.token if current else None) != (stale.token if stale else None):
                return False  # someone else took it over, or its holder refreshed it, since we looked
            tmp = self.path.with_name(f"{LOCK_NAME}.{me.token}.tmp")
            tmp.write_text(json.dumps(asdict(me)), encoding="utf-8")
            os.replace(tmp, self.path)
            return True
        finally:
            marker.unlink(missing_ok=True)

    def still_held(self) -> bool:
        """Whether the lock file is still ours (not taken over by another run that judged us gone)."""
        current = read_holder(self.path)
        return self.holder is not None and current is not None and current.token == self.holder.token

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_SECONDS):
            if not self.still_held():
                print(f"warning: {self.path}: this run's lock was taken over by another run; this run will "
                      "write no further checkpoint", file=sys.stderr, flush=True)
                return
            try:
                os.utime(self.path)
            except OSError:
                pass  # the next beat tries again; the lease is many beats long

    def release(self) -> None:
        self._stop.set()
        if self._heartbeat is not None:
            self._heartbeat.join(timeout=5)
        if self.holder is not None and self.still_held():
            self.path.unlink(missing_ok=True)
        self.holder = None


@contextmanager
def locked_output_folder(folder: str | Path, is_main: bool, any_process: Callable[[bool], bool] = bool,
                         flag: str = "--output_dir") -> Iterator[Optional[RunLock]]:
    """Holds folder's lock on the main process for the block (None on the others); `any_process(flag)` tells
    every process whether any has the flag set (process_group.any_process), so that all stop when the lock cannot
    be taken: the main one with the line naming the holder, the others silently. A folder this made is removed
    again when the block fails while it is still empty."""
    created = make_dirs(Path(folder)) if is_main else []
    lock = RunLock(folder, flag) if is_main else None
    refusal = None
    if lock is not None:
        try:
            lock.acquire()
        except InputError as error:
            refusal = error
    if any_process(refusal is not None):
        remove_empty_dirs(created)
        if refusal is not None:
            raise refusal
        raise SystemExit(2)
    try:
        yield lock
    finally:
        if lock is not None:
            lock.release()
        remove_empty_dirs(created)  # only while empty: a refused run leaves no folder, a run that wrote keeps it
